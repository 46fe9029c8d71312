"""Least outstanding requests: the replica with the fewest requests routed to it and not yet answered
(Vidur's ``lor``, Envoy's least_request). The count is the gateway's own, so it is never stale."""

from __future__ import annotations

from typing import Any

from routers.base import LeastRouter, ReplicaView, RouterContext, register, take_options


class LeastOutstanding(LeastRouter):
    name = "least-outstanding"
    reads_engine_metrics = False

    def key(self, c: ReplicaView) -> int:
        return c.outstanding


@register("least-outstanding")
def _make(options: dict[str, Any], ctx: RouterContext) -> LeastOutstanding:
    take_options(options, "least-outstanding", {})
    return LeastOutstanding()
