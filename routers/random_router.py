"""Uniform random choice. A random split of a Poisson stream gives each of N replicas an independent
Poisson stream at rate/N, so this is the router whose cluster matches N independent engines exactly in
distribution (tests/test_cluster.py checks that)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from routers.base import BaseRouter, ReplicaView, RouterContext, register, take_options, with_room
from sim.core.request import RequestSpec


class RandomRouter(BaseRouter):
    name = "random"
    reads_engine_metrics = False

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        cands = with_room(candidates)
        if not cands:
            return None
        return cands[int(self.rng.integers(len(cands)))]


@register("random")
def _make(options: dict[str, Any], ctx: RouterContext) -> RandomRouter:
    take_options(options, "random", {})
    return RandomRouter(ctx.rng)
