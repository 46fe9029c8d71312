"""Least outstanding requests: the replica with the fewest requests routed to it and not yet answered
(Vidur's ``lor``, Envoy's least_request). The count is the gateway's own, so it is never stale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from routers.base import BaseRouter, ReplicaView, Rotor, RouterContext, register, take_options, with_room
from sim.request import RequestSpec


class LeastOutstanding(BaseRouter):
    name = "least-outstanding"

    def __init__(self) -> None:
        self.rotor = Rotor()

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        cands = with_room(candidates)
        if not cands:
            return None
        return self.rotor.pick(cands, lambda c: c.outstanding)


@register("least-outstanding")
def _make(options: dict[str, Any], ctx: RouterContext) -> LeastOutstanding:
    take_options(options, "least-outstanding", {})
    return LeastOutstanding()
