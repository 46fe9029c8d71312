"""Round-robin: each request goes to the next replica in turn (Vidur's and most gateways' default).

Replicas without room (the gateway's max_outstanding) are skipped, not waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from routers.base import BaseRouter, ReplicaView, RouterContext, register, take_options, with_room
from sim.core.request import RequestSpec


class RoundRobin(BaseRouter):
    name = "round-robin"
    reads_engine_metrics = False

    def __init__(self) -> None:
        self.next = 0

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        cands = with_room(candidates)
        if not cands:
            return None
        chosen = min(cands, key=lambda c: (c.index - self.next) % (1 << 30))
        self.next = chosen.index + 1
        return chosen


@register("round-robin")
def _make(options: dict[str, Any], ctx: RouterContext) -> RoundRobin:
    take_options(options, "round-robin", {})
    return RoundRobin()
