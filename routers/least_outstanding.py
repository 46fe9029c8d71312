"""Least outstanding requests: the replica with the fewest requests routed to it and not yet answered
(Vidur's ``lor``, Envoy's least_request). The count is the gateway's own, so it is never stale."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from routers.base import LeastRouter, RouterContext, register, take_options


class LeastOutstanding(LeastRouter):
    name = "least-outstanding"
    reads_engine_metrics = False

    # the view's count, read in C (the rotor reads every candidate's key for each request)
    key = staticmethod(attrgetter("outstanding"))  # type: ignore[assignment]


@register("least-outstanding")
def _make(options: dict[str, Any], ctx: RouterContext) -> LeastOutstanding:
    take_options(options, "least-outstanding", {})
    return LeastOutstanding()
