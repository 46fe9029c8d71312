"""KV cache manager: requests and tokens on top of the block pool (vLLM V1 ``KVCacheManager`` layering).

It never knows SimPy or scheduling: a policy asks it for prefix hits (``get_computed_blocks``), for
slots (``allocate_slots``, which returns None and changes nothing when blocks run out), and frees a
request when it finishes or is preempted. Rules: engines.md §1.3 KV-1, KV-4..KV-8, and the vLLM 0.33
``scheduler_reserve_full_isl`` admission gate (shared/tools/vllm-oracle/README.md).

Hashing shortcut. vLLM hashes every full block of every request and registers it when allocated.
Here a request whose content nobody else can hold (``not req.spec.shares_content``) is never hashed
while it runs: its lookup returns no hit without hashing, and its full blocks are registered only
when it is freed by a preemption, so that its resume hits its own blocks (KV-7). Scheduling, hits,
evictions, free counts and usage are identical to vLLM's, because unique content can only ever be
hit by its own resume. The one visible difference is the size of the hash map
(``num_cached_blocks``), which leaves out the blocks of such requests until a preemption.

The same holds for the part of a request that is its own: a block reaching past ``req.hash_end``
(spec.hash_end: the generated tokens of a request with token or hash ids, the rest of a generated
shared-prefix prompt) holds content no other request has, so it is looked up, hashed and registered
only as the whole of a unique request is: never while it runs, all at a preemption. Its blocks still
join the back of the free queue when freed (``release``), as registered blocks do. Content that later
requests repeat only once this one is done (``req.hash_on_free``: a conversation's turn, which its next
turn resends) is registered when it is freed, a finish too: no lookup could have found it before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim.core.errors import ConfigError
from sim.core.request import Request
from sim.kv.block_pool import BlockPool, KVBlock
from sim.kv.growth import DecodeGrowth
from sim.kv.rows import RowBatchOps
from sim.kv.table import RequestBlocks

if TYPE_CHECKING:
    from sim.kv.swap import CpuBlockPool

_NO_BLOCKS: tuple[KVBlock, ...] = ()  # allocate_slots' answer when no block was needed


class KVCacheManager(DecodeGrowth, RowBatchOps):
    """Paged KV memory for one replica: a GPU block pool plus per-request block tables."""

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        enable_caching: bool,
        max_model_len: int,
        num_cpu_blocks: int = 0,
    ) -> None:
        if num_gpu_blocks < 2:
            raise ConfigError(
                f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {num_gpu_blocks}"
            )
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        if max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {max_model_len}")
        if num_cpu_blocks < 0:
            raise ConfigError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_gpu_blocks, enable_caching)
        # Swap (CPU pool, vLLM V0 engines.md §1.5) arrives in a later issue: swap_out / swap_in will
        # move a request's table between self.pool and a CPU BlockPool of this size.
        self.num_cpu_blocks = num_cpu_blocks
        self._cpu: CpuBlockPool | None = None  # built on first use (``cpu``)
        self._reqs: dict[str, RequestBlocks] = {}
        # KV-8 counters; vLLM's PrefixCacheStats.record puts a resumed request in the preempted_*
        # counters only, never in both.
        self._queries = 0
        self._hits = 0
        self._requests = 0
        self._preempted_queries = 0
        self._preempted_hits = 0
        self._preempted_requests = 0

    # ---- prefix lookup ----------------------------------------------------------------------------
    def get_computed_blocks(self, req: Request, record: bool = True) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of ``req`` as (blocks, tokens); touches nothing (engines.md KV-5).

        Walks the hash chain from block 0 to the first miss, over at most ``(num_tokens - 1) //
        block_size`` blocks so that one token is always recomputed for logits. With ``record`` it counts
        the KV-8 stats at every lookup (vLLM 0.11, engines.md KV-8); vLLM 0.33 counts only lookups that
        lead to an admission: pass ``record=False`` and call ``record_prefix_cache_stats`` on admission.
        """
        if not self.enable_caching:
            return [], 0
        num_tokens = req.num_tokens
        preempted = req.num_preemptions > 0
        hit: list[KVBlock] = []
        if req.hash_end or preempted:
            max_blocks = (num_tokens - 1) // self.block_size
            if not preempted and max_blocks * self.block_size > req.hash_end:
                max_blocks = req.hash_end // self.block_size  # past it nobody else holds the content
            if max_blocks > 0:
                hashes = req.block_hashes(self.block_size, max_blocks * self.block_size)
                hit = self.pool.longest_cached_prefix(hashes, max_blocks)
        # else: unique content never preempted -- nobody can hold its blocks (module docstring).
        hit_tokens = len(hit) * self.block_size
        if record:
            self.record_prefix_cache_stats(req, hit_tokens)
        return hit, hit_tokens

    def record_prefix_cache_stats(self, req: Request, hit_tokens: int) -> None:
        """Count one lookup of ``req`` that found ``hit_tokens`` (KV-8; vLLM's PrefixCacheStats.record).

        A request that was preempted before goes to the preempted_* counters only. Nothing is counted
        with caching off, as vLLM skips the lookup then.
        """
        if not self.enable_caching:
            return
        if req.num_preemptions > 0:
            self._preempted_requests += 1
            self._preempted_queries += req.num_tokens
            self._preempted_hits += hit_tokens
        else:
            self._requests += 1
            self._queries += req.num_tokens
            self._hits += hit_tokens

    # ---- allocation -------------------------------------------------------------------------------
    def _num_to_allocate(self, num_tokens: int, num_held: int, hits: list[KVBlock]) -> int:
        """KV-1: new blocks to cover ``num_tokens``, counting free prefix hits as allocations."""
        n = -(-num_tokens // self.block_size) - num_held - len(hits)
        if n < 0:
            n = 0
        for b in hits:
            if b.ref_cnt == 0:
                n += 1
        return n

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVBlock] | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        watermark_blocks: int = 0,
    ) -> Sequence[KVBlock] | None:
        """Give ``req`` slots for ``num_new_tokens`` more tokens (plus prefix hits and lookahead).

        Returns the newly allocated blocks (possibly none), or None when there are not enough free
        blocks, in which case nothing has changed. ``full_sequence_must_fit`` is vLLM 0.33's
        ``scheduler_reserve_full_isl`` gate: the whole current sequence must fit, though only this
        chunk is allocated. Full blocks are registered in the prefix cache here, at allocation, so a
        request admitted later in the same step can already hit them (vllm-oracle README).
        ``watermark_blocks``: vLLM V1's watermark, blocks that must stay free after this allocation
        (the caller passes it for admissions only, as vLLM applies it to waiting/preempted requests).
        """
        if num_new_tokens == 1 and not num_lookahead_tokens:
            # A decode row (or a one-token chunk), O(1): it needs a new block only when its computed
            # tokens sit on a block boundary (c > 0 off a boundary: its blocks cover slot c + 1), and
            # cache bookkeeping only when the new token completes a block (what is cached never lags
            # more than the one token in flight under async scheduling). An admission (prefix hits,
            # the full-sequence gate, the watermark) has c = 0 or whole hit blocks: never off a boundary.
            c = req.num_computed_tokens
            bs = self.block_size
            caching = self.enable_caching
            if c % bs and ((c + 1) % bs or not caching):
                return _NO_BLOCKS
            # Content nobody shares (the whole request, or its own part past hash_end) needs no hashing,
            # so its bookkeeping is inlined here, for a running row (async scheduling: c == num_tokens
            # while its newest token is in flight).
            st = self._reqs.get(req.request_id)
            t = req.num_tokens
            if (st is not None and c <= t and c < self.max_model_len
                    and not (caching and c < req.hash_end)
                    and not (new_computed_blocks or num_new_computed_tokens or full_sequence_must_fit
                             or watermark_blocks)):
                blocks = st.blocks
                need = c // bs + 1 - len(blocks)
                new: Sequence[KVBlock] = _NO_BLOCKS
                if need > 0:
                    if need > self.pool.num_free_blocks:
                        return None
                    new = self.pool.get_new_blocks(need)
                    blocks.extend(new)
                if caching:
                    full = (c + 1 if c < t else t) // bs  # what is known: async may have c == t
                    if full > st.num_cached:
                        st.num_cached = full if full < len(blocks) else len(blocks)
                return new
        return self._allocate(req, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                              num_lookahead_tokens, full_sequence_must_fit, watermark_blocks)

    def _allocate(
        self,
        req: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVBlock] | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        watermark_blocks: int = 0,
    ) -> Sequence[KVBlock] | None:
        """The general path of ``allocate_slots`` (tests compare the O(1) path against it)."""
        st = self._reqs.get(req.request_id)
        if num_new_tokens <= 0:
            raise ValueError(f"request {req.request_id}: num_new_tokens must be > 0, got {num_new_tokens}")
        num_held = len(st.blocks) if st is not None else 0
        hits = new_computed_blocks if new_computed_blocks else []
        if hits:
            if num_held:
                raise ValueError(f"request {req.request_id}: prefix hits given to a request holding blocks")
            if num_new_computed_tokens != len(hits) * self.block_size:
                raise ValueError(
                    f"request {req.request_id}: num_new_computed_tokens {num_new_computed_tokens} != "
                    f"{len(hits)} hit blocks x {self.block_size}"
                )
        pool = self.pool
        num_free = pool.num_free_blocks - watermark_blocks
        computed = req.num_computed_tokens + num_new_computed_tokens

        if full_sequence_must_fit:
            full = min(req.num_tokens, self.max_model_len)
            if self._num_to_allocate(full, num_held, hits) > num_free:
                return None

        need_slot = computed + num_new_tokens + num_lookahead_tokens
        if need_slot > self.max_model_len:
            need_slot = self.max_model_len
        num_new_blocks = -(-need_slot // self.block_size) - num_held - len(hits)
        if num_new_blocks < 0:
            num_new_blocks = 0
        if hits:
            if self._num_to_allocate(need_slot, num_held, hits) > num_free:
                return None
        elif num_new_blocks > num_free:
            return None

        # Commit: nothing above changed any state.
        if st is None:
            st = self._reqs[req.request_id] = RequestBlocks()
        if hits:
            pool.touch(hits)
            st.blocks.extend(hits)
            st.num_cached = len(hits)
        new_blocks = pool.get_new_blocks(num_new_blocks) if num_new_blocks else []
        if new_blocks:
            st.blocks.extend(new_blocks)
        if self.enable_caching:
            # KV-4: cache full blocks up to min(computed + new, num_tokens) -- never lookahead tokens.
            to_cache = computed + num_new_tokens
            if to_cache > req.num_tokens:
                to_cache = req.num_tokens
            num_full = to_cache // self.block_size
            if num_full > st.num_cached:
                if num_full > len(st.blocks):
                    num_full = len(st.blocks)
                self._register(req, st, num_full)
                st.num_cached = num_full
        return new_blocks

    def _register(self, req: Request, st: RequestBlocks, num_full: int) -> None:
        """Register ``req``'s full blocks from ``st.num_cached`` up to ``num_full``, those that may be
        shared (within ``hash_end``); the caller then counts all ``num_full`` as cached."""
        reg = req.hash_end // self.block_size
        if reg > num_full:
            reg = num_full
        if reg > st.num_cached:
            hashes = req.block_hashes(self.block_size, reg * self.block_size)
            self.pool.cache_full_blocks(st.blocks, hashes, st.num_cached, reg)

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register ``req``'s full blocks among its first ``num_tokens`` tokens (vLLM's cache_blocks):
        async scheduling registers the blocks of outputs that were not known at allocation."""
        st = self._reqs.get(req.request_id)
        if st is None or not self.enable_caching:
            return
        num_full = min(num_tokens, req.num_tokens) // self.block_size
        if num_full > st.num_cached:
            if num_full > len(st.blocks):
                num_full = len(st.blocks)
            self._register(req, st, num_full)
            st.num_cached = num_full

    def free(self, req: Request, preempted: bool = False) -> None:
        """Release ``req``'s blocks tail first (KV-6) and forget it; hashes stay for later hits (KV-7)."""
        st = self._reqs.pop(req.request_id, None)
        if st is None:
            return
        n = min(st.num_cached, len(st.blocks))
        own = n * self.block_size > req.hash_end  # blocks past hash_end were counted cached, not registered
        if (preempted or req.hash_on_free) and self.enable_caching and own:
            # Register what vLLM would have registered at allocation, so the resume (or the request that
            # repeats this one's content once it is done) can hit it. Those within hash_end were registered
            # as they filled (a conversation's turn holds its whole history: start past it).
            hashes = req.block_hashes(self.block_size, n * self.block_size)
            self.pool.cache_full_blocks(st.blocks, hashes, req.hash_end // self.block_size, n)
        if not self.enable_caching or not own:
            self.pool.free_blocks(reversed(st.blocks))
        else:
            # The blocks vLLM would have hashed (the first num_cached) go to the back of the free queue,
            # the rest to the front, as BlockPool.free_blocks places hashed and unhashed blocks.
            self.pool.release(st.blocks[n:][::-1], st.blocks[:n][::-1])

    # ---- queries ----------------------------------------------------------------------------------
    def num_blocks_needed(self, req: Request, num_tokens: int) -> int:
        """New blocks ``req`` would need, on top of what it holds, to cover ``num_tokens`` tokens.

        For policies that reserve memory up front (static batching, Orca, TGI).
        """
        num_tokens = min(num_tokens, self.max_model_len)
        return max(-(-num_tokens // self.block_size) - self.num_blocks_held(req), 0)

    def num_blocks_held(self, req: Request) -> int:
        st = self._reqs.get(req.request_id)
        return len(st.blocks) if st is not None else 0

    def get_block_ids(self, req: Request) -> list[int]:
        st = self._reqs.get(req.request_id)
        return [b.block_id for b in st.blocks] if st is not None else []

    def holds(self, req: Request) -> bool:
        return req.request_id in self._reqs

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks holding reusable KV (cached, unreferenced): part of ``num_free_blocks``."""
        return self.pool.num_cached_free_blocks

    @property
    def usable_blocks(self) -> int:
        return self.pool.usable_blocks

    @property
    def usage(self) -> float:
        """engines.md KV-3: ``1 - free / (num_gpu_blocks - 1)``."""
        return self.pool.usage

    def prefix_cache_stats(self) -> dict[str, int]:
        """Cumulative KV-8 counters, named as vLLM's PrefixCacheStats fields."""
        return {
            "queries": self._queries,
            "hits": self._hits,
            "requests": self._requests,
            "preempted_queries": self._preempted_queries,
            "preempted_hits": self._preempted_hits,
            "preempted_requests": self._preempted_requests,
        }

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens of first lookups (vLLM's prefix_cache_hits / _queries)."""
        return self._hits / self._queries if self._queries else 0.0

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def check_invariants(self) -> None:
        """Pool invariants, plus: each block's ref_cnt equals the number of requests holding it."""
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        for rid, st in self._reqs.items():
            ids = [b.block_id for b in st.blocks]
            if len(set(ids)) != len(ids):
                raise AssertionError(f"request {rid} holds a block twice: {ids}")
            for bid in ids:
                holders[bid] = holders.get(bid, 0) + 1
        for b in self.pool.blocks[1:]:
            if b.ref_cnt != holders.get(b.block_id, 0):
                raise AssertionError(
                    f"block {b.block_id}: ref_cnt {b.ref_cnt} but held by {holders.get(b.block_id, 0)} requests"
                )
        if self.pool.num_free_blocks + len(holders) != self.pool.usable_blocks:
            raise AssertionError(
                f"leak: free {self.pool.num_free_blocks} + held {len(holders)} != usable {self.pool.usable_blocks}"
            )

    # ---- swap (vLLM V0 preemption_mode="swap", engines.md §1.5 V0-5, V0-6) ---------------------------
    @property
    def cpu(self) -> CpuBlockPool:
        """The CPU swap pool of ``num_cpu_blocks`` blocks (sim.kv.swap.CpuBlockPool), built on first use."""
        pool = self._cpu
        if pool is None:
            from sim.kv.swap import CpuBlockPool

            pool = self._cpu = CpuBlockPool(self.num_cpu_blocks)
        return pool

    def is_swapped(self, req: Request) -> bool:
        return self.cpu.holds(req.request_id)

    def swap_out(self, req: Request) -> int:
        """Copy ``req``'s GPU blocks to the CPU pool and free them on the GPU; returns the blocks copied.

        Raises SwapSpaceError when the CPU pool cannot take them: vLLM V0 aborts the engine there
        (engines.md V0-5). Freed GPU blocks keep their hashes, as any freed block does (KV-6).
        """
        from sim.kv.swap import SwapSpaceError

        st = self._reqs.get(req.request_id)
        n = len(st.blocks) if st is not None else 0
        cpu = self.cpu
        if n > cpu.num_free_blocks:
            raise SwapSpaceError(
                f"Aborted due to the lack of CPU swap space (vLLM V0): request {req.request_id} needs {n} "
                f"CPU blocks to swap out, {cpu.num_free_blocks} of {cpu.num_blocks} are free; raise "
                "[engine] swap_space or use preemption_mode = \"recompute\""
            )
        cpu.put(req.request_id, n)
        self.free(req)
        return n

    def num_swap_in_blocks(self, req: Request) -> int:
        """GPU blocks a swap-in needs: the swapped blocks plus the slot of the next token (V0's
        ``_can_swap`` counts the full blocks and the blocks the pending token touches)."""
        return -(-(req.num_computed_tokens + 1) // self.block_size)

    def swap_in(self, req: Request) -> int | None:
        """Copy ``req`` back from the CPU pool onto new GPU blocks; returns the blocks copied from CPU,
        or None (nothing changed) when the GPU lacks the blocks. The caller applies V0's watermark."""
        need = self.num_swap_in_blocks(req)
        if need > self.pool.num_free_blocks:
            return None
        copied = self.cpu.take(req.request_id)
        st = self._reqs[req.request_id] = RequestBlocks()
        st.blocks = self.pool.get_new_blocks(need)
        num_full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        if self.enable_caching and num_full:
            self._register(req, st, num_full)
        st.num_cached = num_full
        return copied

    def drop_swapped(self, req: Request) -> None:
        """Forget a swapped-out request without copying it back (it was aborted)."""
        self.cpu.drop(req.request_id)

    @property
    def num_cpu_used_blocks(self) -> int:
        return self.cpu.num_used_blocks if self._cpu is not None else 0

    def swap_stats(self) -> dict[str, int]:
        return self.cpu.stats()

    def peek_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """``get_computed_blocks`` without counting KV-8 stats, for schedulers that look ahead (TRT-5)."""
        saved = (self._queries, self._hits, self._requests,
                 self._preempted_queries, self._preempted_hits, self._preempted_requests)  # fmt: skip
        try:
            return self.get_computed_blocks(req)
        finally:
            (self._queries, self._hits, self._requests,
             self._preempted_queries, self._preempted_hits, self._preempted_requests) = saved  # fmt: skip

    def receive_transferred(self, req: Request) -> int:
        """Take in the prompt KV of ``req`` computed on another replica (a P/D hand-off, sim/app/disagg.py)
        as cached free blocks, so that ``req``'s admission finds them as a prefix hit.

        Blocks already cached here (a shared prefix) are kept, not copied; new ones are taken from the
        free queue, registered under the request's block hashes and freed to its back (most recently
        used). Only as many as there are free blocks; a lookup stops at the first missing one. Covers at
        most ``(prompt_len - 1) // block_size`` blocks (the lookup never covers the last token, KV-5).
        Returns the number of leading blocks the admission can hit.
        """
        bs = self.block_size
        n = (req.prompt_len - 1) // bs
        if n <= 0 or not self.enable_caching:
            return 0
        pool = self.pool
        hashes = req.block_hashes(bs, n * bs)
        found = [pool.get_cached_block(h) for h in hashes[:n]]
        kept = [b for b in found if b is not None]
        pool.touch(kept)  # held while new blocks are taken, so taking them cannot evict these
        missing = [i for i, b in enumerate(found) if b is None]
        new = pool.get_new_blocks(min(len(missing), pool.num_free_blocks))
        placed = missing[: len(new)]
        pool.cache_full_blocks(new, [hashes[i] for i in placed], 0, len(new))
        for i, blk in zip(placed, new, strict=True):
            found[i] = blk
        usable = next((i for i, b in enumerate(found) if b is None), n)
        pool.free_blocks(reversed([b for b in found if b is not None]))
        return usable
