"""Least KV-cache usage: the replica whose engine last reported the lowest ``kv_cache_usage`` (vLLM's
``vllm:kv_cache_usage_perc`` gauge), ties broken by outstanding requests.

The usage is polled, so with a poll interval every request between two polls sees the same numbers
and herds onto the same replica -- the staleness effect a real metrics-scraping gateway shows.
"""

from __future__ import annotations

from typing import Any

from routers.base import LeastRouter, ReplicaView, RouterContext, register, take_options


class LeastKV(LeastRouter):
    name = "least-kv"

    def key(self, c: ReplicaView) -> tuple[float, int]:
        return round(c.kv_usage, 12), c.outstanding


@register("least-kv")
def _make(options: dict[str, Any], ctx: RouterContext) -> LeastKV:
    take_options(options, "least-kv", {})
    return LeastKV()
