"""A request's block table: the one type the KV manager and its mixins share (sim/kv/manager.py).

Its own module so the mixins (growth, rows) can name it: compiled, a typed block table's fields are
read and written in place, where an untyped one costs a generic attribute lookup per row.
"""

from __future__ import annotations

from sim.kv.block_pool import KVBlock


class RequestBlocks:
    """A request's blocks (head first) and how many leading full blocks are (or would be) cached."""

    __slots__ = ("blocks", "num_cached")

    def __init__(self) -> None:
        self.blocks: list[KVBlock] = []
        # vLLM's num_cached_block: full blocks registered so far. For a request that does not share
        # content it counts the blocks vLLM *would* have registered, so a preemption can register them.
        self.num_cached = 0
