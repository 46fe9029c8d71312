"""Length-based pools: requests whose prompt + output exceed ``threshold`` tokens go to the long-context
pool, the rest to the short pool, so long prefills never stall short requests' decodes. Within a pool a
second router chooses (``within``, default least-outstanding). The gateway knows a request's output
budget (its ``max_tokens``), which the workload's output length stands for here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from routers.base import (
    BaseRouter,
    ReplicaView,
    RouterContext,
    make_router,
    read_number,
    register,
    resolve_router_name,
    take_options,
)
from sim.core.errors import ConfigError
from sim.core.request import RequestSpec


class PoolRouter(BaseRouter):
    """Shared by the pool routers: a pool per request, then the inner router among that pool."""

    name = "pools"

    def __init__(self, ctx: RouterContext, within: str, pools: Sequence[str], label: str) -> None:
        within = resolve_router_name(within, f"router {label!r}: option within")
        have = set(ctx.pools())
        for p in pools:
            if p not in have:
                raise ConfigError(
                    f"router {label!r}: no replica is in pool {p!r} (pools: {', '.join(sorted(have))})"
                )
        self.inner = {p: make_router(within, {}, ctx) for p in pools}
        self.fallback = make_router(within, {}, ctx)
        self.counts: dict[str, int] = dict.fromkeys(pools, 0)

    @property
    def reads_engine_metrics(self) -> bool:
        return any(getattr(r, "reads_engine_metrics", True) for r in (*self.inner.values(), self.fallback))

    def pool_of(self, spec: RequestSpec) -> str:
        raise NotImplementedError

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        pool = self.pool_of(spec)
        mine = [c for c in candidates if c.pool == pool]
        if not mine:  # no replica of the pool can hold it (e.g. too long): any that can
            return self.fallback.route(spec, candidates, now)
        chosen = self.inner[pool].route(spec, mine, now)
        if chosen is not None:
            self.counts[pool] += 1
        return chosen


class LengthPools(PoolRouter):
    name = "length-pools"

    def __init__(self, ctx: RouterContext, threshold: int, long_pool: str, short_pool: str, within: str):
        if long_pool == short_pool:  # every request would go to the one pool: the split would do nothing
            raise ConfigError(f"router 'length-pools': long_pool and short_pool are both {long_pool!r}; "
                              "allowed: two different pools")
        super().__init__(ctx, within, [short_pool, long_pool], "length-pools")
        self.threshold, self.long_pool, self.short_pool = threshold, long_pool, short_pool

    def pool_of(self, spec: RequestSpec) -> str:
        return self.long_pool if spec.prompt_len + spec.output_len > self.threshold else self.short_pool


@register("length-pools")
def _make(options: dict[str, Any], ctx: RouterContext) -> LengthPools:
    o = take_options(
        options,
        "length-pools",
        {"threshold": 8192, "long_pool": "long", "short_pool": "short", "within": "least-outstanding"},
    )
    return LengthPools(
        ctx,
        threshold=read_number(o, "threshold", "length-pools", lo=1, integer=True),
        long_pool=str(o["long_pool"]),
        short_pool=str(o["short_pool"]),
        within=str(o["within"]),
    )
