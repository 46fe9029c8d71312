"""Priority pools: each request class (its priority) has its own pool, e.g. a latency queue served by
an instance tuned for short steps and a throughput queue served by one tuned for big batches (one card
split into two instances). ``pools`` maps priority -> pool name (TOML keys are strings: ``{"0" =
"latency", "1" = "throughput"}``); unmapped priorities go to ``default_pool``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from routers.base import RouterContext, register, take_options
from routers.length_pools import PoolRouter
from sim.core.errors import ConfigError
from sim.core.fields import MAX_PRIORITY  # a request's priority is within +-MAX_PRIORITY
from sim.core.request import RequestSpec


class PriorityPools(PoolRouter):
    name = "priority-pools"

    def __init__(self, ctx: RouterContext, mapping: dict[int, str], default_pool: str, within: str) -> None:
        super().__init__(ctx, within, sorted({*mapping.values(), default_pool}), "priority-pools")
        self.mapping, self.default_pool = mapping, default_pool

    def pool_of(self, spec: RequestSpec) -> str:
        return self.mapping.get(spec.priority, self.default_pool)


@register("priority-pools")
def _make(options: dict[str, Any], ctx: RouterContext) -> PriorityPools:
    o = take_options(
        options,
        "priority-pools",
        {"pools": {"0": "latency", "1": "throughput"}, "default_pool": None, "within": "least-outstanding"},
    )
    raw = o["pools"]
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"router 'priority-pools': pools must be a table priority -> pool, got {raw!r}")
    mapping: dict[int, str] = {}
    written: dict[int, Any] = {}
    for k, v in raw.items():
        # a plain decimal integer within the priorities' range (int() would also take "1_0" or " 1 ")
        if isinstance(k, np.integer):  # a key from a pandas column: the int it is
            k = int(k)
        text = str(k) if isinstance(k, str | int) and not isinstance(k, bool) else ""
        if not re.fullmatch(r"[+-]?[0-9]{1,30}", text) or abs(int(text)) > MAX_PRIORITY:
            raise ConfigError(f"router 'priority-pools': pools key {k!r} is not an integer priority; allowed: a "
                              f"plain integer from {-MAX_PRIORITY} to {MAX_PRIORITY}, e.g. \"0\"")
        prio = int(k)
        if prio in written:
            raise ConfigError(f"router 'priority-pools': pools keys {written[prio]!r} and {k!r} are the same "
                              f"priority {prio}; allowed: one key per priority")
        written[prio] = k
        mapping[prio] = str(v)
    default = o["default_pool"] if o["default_pool"] is not None else mapping[max(mapping)]
    return PriorityPools(ctx, mapping, str(default), str(o["within"]))
