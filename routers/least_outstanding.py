"""Least outstanding requests: the replica with the fewest requests routed to it and not yet answered
(Vidur's ``lor``, Envoy's least_request). The count is the gateway's own, so it is never stale."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from routers.base import LeastRouter, ReplicaView, Rotor, RouterContext, register, take_options
from sim.core.request import RequestSpec

_OUTSTANDING = attrgetter("outstanding")


class LeastOutstanding(LeastRouter):
    name = "least-outstanding"
    reads_engine_metrics = False

    key = staticmethod(_OUTSTANDING)  # type: ignore[assignment]

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        # The gateway's list of views, this key and the rotor's own rule: one native pass (rotor.py)
        if self.key is _OUTSTANDING and type(candidates) is list and type(self.rotor) is Rotor:
            try:
                return self.rotor.least_outstanding(candidates)
            except TypeError:  # a view-like object of a plug-in's own: the generic pick below
                pass
        return super().route(spec, candidates, now)


@register("least-outstanding")
def _make(options: dict[str, Any], ctx: RouterContext) -> LeastOutstanding:
    take_options(options, "least-outstanding", {})
    return LeastOutstanding()
