"""Many rows in one call: what a scheduler's per-row loop asks of the KV manager, without a call per row.

A step of a large batch is mostly decode rows, each needing one slot (a new block only on a block
boundary) and, when its batch lands under async scheduling, its full blocks registered. These methods
do exactly what the row-by-row calls (``allocate_slots(req, 1)``, ``cache_blocks``) do, in the same
order, inlining their O(1) paths; rows those paths do not cover go through the row-by-row call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

from sim.core.request import Request
from sim.kv.table import RequestBlocks

if TYPE_CHECKING:
    from sim.kv.block_pool import BlockPool


@trait  # a mixin mypyc can compile (sim/native.py)
class RowBatchOps:
    """Mixed into KVCacheManager, whose block tables (``_reqs``), pool and row-by-row calls it uses."""

    block_size: int
    enable_caching: bool
    max_model_len: int
    pool: BlockPool
    _reqs: dict[str, RequestBlocks]

    # KVCacheManager's row-by-row calls
    def allocate_slots(self, req: Request, num_new_tokens: int) -> Any:
        raise NotImplementedError

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        raise NotImplementedError

    def allocate_decode_slots(self, reqs: list[Request]) -> int:
        """``allocate_slots(req, 1)`` for each row in order, up to the first that does not fit: how many
        got their slot. One call for a stretch of decode rows; allocate_slots's O(1) path, inlined."""
        bs = self.block_size
        caching = self.enable_caching
        table = self._reqs
        pool = self.pool
        max_len = self.max_model_len
        done = 0
        for req in reqs:
            c = req.num_computed_tokens
            if c % bs and ((c + 1) % bs or not caching):
                done += 1
                continue
            st = table.get(req.request_id)
            t = req.num_tokens
            if st is None or c > t or c >= max_len or (caching and c < req.hash_end):
                if self.allocate_slots(req, 1) is None:
                    return done
                done += 1
                continue
            blocks = st.blocks
            need = c // bs + 1 - len(blocks)
            if need > 0:
                if need > pool.num_free_blocks:
                    return done
                blocks.extend(pool.get_new_blocks(need))
            if caching:
                full = (c + 1 if c < t else t) // bs
                if full > st.num_cached:
                    st.num_cached = full if full < len(blocks) else len(blocks)
            done += 1
        return done

    def cache_blocks_many(self, rows: Sequence[tuple[Request, int]]) -> None:
        """``cache_blocks`` for each (request, num_tokens), in order: one call for a landed batch."""
        if not self.enable_caching:
            return
        reqs, bs = self._reqs, self.block_size
        for req, num_tokens in rows:
            st = reqs.get(req.request_id)
            if st is None:
                continue
            t = req.num_tokens
            num_full = (num_tokens if num_tokens < t else t) // bs
            if num_full > st.num_cached:
                if st.num_cached < req.hash_end // bs:  # some of them may be shared: registered
                    self.cache_blocks(req, num_tokens)
                else:
                    n = len(st.blocks)
                    st.num_cached = num_full if num_full < n else n
