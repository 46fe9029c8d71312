"""Prefix-cache-aware routing with a load guard (the idea of llm-d's prefix-cache scorer and BLIS's
prefix-affinity scorer, written from their descriptions).

The gateway cannot see inside the engines' caches, so it keeps its own estimate: for each replica, an
LRU index of the prompt-block hashes it has routed there, at most ``capacity_blocks`` of them (default:
the replica's number of KV blocks). A request goes to the replica whose index holds the longest run of
its leading blocks -- unless that replica has more than ``load_guard`` outstanding requests beyond the
least-loaded candidate, in which case the load wins. Requests whose content nobody else can hold (no
segments, token ids or hash ids) skip the index and go by load.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from routers.base import (
    BaseRouter,
    ReplicaView,
    Rotor,
    RouterContext,
    read_number,
    register,
    take_options,
    with_room,
)
from sim.core.request import Request, RequestSpec


class _Index:
    """Block hashes routed to one replica, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def add(self, hashes: list[int]) -> None:
        lru = self.lru
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)


class PrefixAware(BaseRouter):
    name = "prefix-aware"
    reads_engine_metrics = False  # its own index and the outstanding counts

    def __init__(
        self, ctx: RouterContext, load_guard: int, min_match_blocks: int, capacity: int | None
    ) -> None:
        self.load_guard = load_guard
        self.min_match = min_match_blocks
        self.index = {
            r.index: _Index(capacity if capacity is not None else r.num_gpu_blocks) for r in ctx.replicas
        }
        self.block_size = {r.index: r.block_size for r in ctx.replicas}
        self.rotor = Rotor()
        self._cache: tuple[str, dict[int, list[int]]] = ("", {})  # the request being routed
        self.num_affinity = 0  # requests sent to a replica for its prefix (for reports and tests)
        self.num_guarded = 0  # requests the load guard moved away from their prefix replica

    def _prompt_hashes(self, spec: RequestSpec, block_size: int) -> list[int]:
        rid, by_size = self._cache
        if rid != spec.request_id:
            by_size = {}
            self._cache = (spec.request_id, by_size)
        h = by_size.get(block_size)
        if h is None:
            full = (spec.prompt_len // block_size) * block_size
            h = by_size[block_size] = list(Request(spec).block_hashes(block_size, full)) if full else []
        return h

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        cands = with_room(candidates)
        if not cands:
            return None
        least = self.rotor.pick(cands, lambda c: c.outstanding)
        if not spec.shares_content:
            return least
        best, best_n = None, 0
        for c in cands:
            n = self.index[c.index].match(self._prompt_hashes(spec, self.block_size[c.index]))
            if n > best_n or (n == best_n and best is not None and n and c.outstanding < best.outstanding):
                best, best_n = c, n
        if best is None or best_n < self.min_match:
            return least
        if best.outstanding > least.outstanding + self.load_guard:
            self.num_guarded += 1
            return least
        self.num_affinity += 1
        return best

    def on_routed(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None:
        if spec.shares_content:
            self.index[replica.index].add(self._prompt_hashes(spec, self.block_size[replica.index]))


@register("prefix-aware")
def _make(options: dict[str, Any], ctx: RouterContext) -> PrefixAware:
    o = take_options(
        options, "prefix-aware", {"load_guard": 8, "min_match_blocks": 1, "capacity_blocks": None}
    )
    cap = o["capacity_blocks"]
    return PrefixAware(
        ctx,
        load_guard=read_number(o, "load_guard", "prefix-aware", integer=True),
        min_match_blocks=read_number(o, "min_match_blocks", "prefix-aware", lo=1, integer=True),
        capacity=None
        if cap is None
        else read_number(o, "capacity_blocks", "prefix-aware", lo=1, integer=True),
    )
