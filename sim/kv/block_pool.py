"""Paged KV block pool: fixed blocks, ref counts, an O(1) LRU free queue and a hash -> block map.

The pool knows blocks only (no requests, tokens or scheduling), in the way vLLM V1 layers its
``BlockPool`` under the ``KVCacheManager`` (engines.md §1.3). Rules implemented here:

- KV-2: block 0 is the null block, taken out at init and never handed out, freed or evicted.
- KV-3: ``usage = 1 - free / (num_blocks - 1)``; cached blocks nobody references count as free.
- KV-6: the free queue starts ordered by block id, allocation pops from the front, freed blocks with a
  hash go to the back in the order given and freed blocks without one to the front (vLLM 0.33, checked
  against vllm-oracle), a popped block that still carries a hash is evicted from the map then (lazy
  eviction), and a prefix hit on a free block removes it from the middle (``touch``).

The free queue is an ``OrderedDict`` keyed by block id: ``popitem(last=False)`` is the front, ``del`` is
a removal from the middle, assignment appends to the back and ``move_to_end(last=False)`` moves to the
front, all O(1) and implemented in C.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class KVBlock:
    """One KV block. ``block_hash`` is set while the block is registered in the prefix cache."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "is_null", "cached_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.is_null = False
        self.cached_free = False  # free, but kept for prefix hits (at the LRU end of the queue)

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash}, null={self.is_null})"


# A hash maps to one block, or to {block_id: block} when several blocks hold the same content. Two
# requests that prefill the same block in the same step (or one that could not hit the last block
# because of the KV-5 cap) each fill their own copy; vLLM keeps both registered (its
# BlockHashToBlockMap), a lookup returns the oldest, and evicting one leaves the other hittable.
_Entry = KVBlock | dict[int, KVBlock]


class BlockPool:
    """Fixed pool of ``num_blocks`` KV blocks, block 0 reserved as the null block (engines.md KV-2)."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVBlock] = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        # KV-2: the null block leaves the free queue at init and never comes back.
        self.null_block = self._free.popitem(last=False)[1]
        self.null_block.is_null = True
        self._cached: dict[int, _Entry] = {}
        self._num_cached = 0  # blocks carrying a hash (>= number of distinct hashes)
        self._num_cached_free = 0  # free blocks that hold reusable content (released to the LRU end)

    # ---- counters ---------------------------------------------------------------------------------
    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, including cached ones nobody references (KV-3)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """KV usage as vLLM reports it: ``1 - free / (num_blocks - 1)`` (engines.md KV-3)."""
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (a hash held by two blocks counts twice)."""
        return self._num_cached

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks still holding reusable KV (vLLM's cached-but-unreferenced blocks): the part of
        ``num_free_blocks`` that a prefix hit can revive. Allocation takes the other free blocks first."""
        return self._num_cached_free

    @property
    def num_cached_hashes(self) -> int:
        """Distinct hashes in the prefix cache (vllm-oracle's ``num_cached_hashes``)."""
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free queue from front (next to be allocated) to back; for tests and traces."""
        return list(self._free)

    # ---- allocation -------------------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Pop ``n`` blocks from the front of the free queue, evicting their stale hashes (KV-6)."""
        free = self._free
        if n > len(free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(free)} free")
        out: list[KVBlock] = []
        pop = free.popitem
        for _ in range(n):
            blk = pop(last=False)[1]
            if blk.cached_free:
                blk.cached_free = False
                self._num_cached_free -= 1
            if blk.block_hash is not None:
                self._evict(blk)
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 rejoin the free queue.

        vLLM 0.33 ``BlockPool.free_blocks`` (checked against vllm-oracle): a block that carries a hash
        joins the back, so cached blocks are evicted in LRU order; a block without one (a partial tail,
        or every block when caching is off) goes to the front, to be reused before any cached block is
        evicted. Both groups keep the order given; the manager passes a request's blocks tail first, so
        within a request the longest-prefix blocks are evicted before the head blocks (engines.md KV-6).
        """
        blocks = [b for b in blocks if not b.is_null]
        if self.enable_caching:
            self.release(
                [b for b in blocks if b.block_hash is None], [b for b in blocks if b.block_hash is not None]
            )
        else:
            self.release(blocks, ())

    def release(self, reuse_first: Sequence[KVBlock], reuse_last: Sequence[KVBlock]) -> None:
        """``free_blocks`` with the placement chosen by the caller: blocks of ``reuse_first`` that reach
        ref 0 go to the front of the free queue (the first one given at the very front), those of
        ``reuse_last`` to the back. The manager uses it for content it leaves unhashed (its docstring)."""
        reuse_first = [b for b in reuse_first if not b.is_null]
        reuse_last = [b for b in reuse_last if not b.is_null]
        for group in (reuse_first, reuse_last):
            for b in group:
                if b.ref_cnt <= 0:
                    raise ValueError(f"double free of block {b.block_id} (ref_cnt {b.ref_cnt})")
        for group in (reuse_first, reuse_last):
            for b in group:
                b.ref_cnt -= 1
        free = self._free
        for b in reversed(reuse_first):
            if b.ref_cnt == 0:
                free[b.block_id] = b
                free.move_to_end(b.block_id, last=False)
        for b in reuse_last:
            if b.ref_cnt == 0:
                free[b.block_id] = b
                b.cached_free = True
                self._num_cached_free += 1

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the middle of the queue (KV-6)."""
        free = self._free
        for b in blocks:
            if b.is_null:
                continue
            if b.ref_cnt == 0:
                del free[b.block_id]
                if b.cached_free:
                    b.cached_free = False
                    self._num_cached_free -= 1
            b.ref_cnt += 1

    # ---- prefix cache -----------------------------------------------------------------------------
    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        """The block registered under ``block_hash`` (the oldest, if several), or None."""
        entry = self._cached.get(block_hash)
        if entry is None or type(entry) is KVBlock:
            return entry
        return next(iter(entry.values()))

    def cache_full_blocks(
        self, blocks: Sequence[KVBlock], hashes: Sequence[int], start: int, end: int
    ) -> None:
        """Register ``blocks[start:end]`` under ``hashes[start:end]`` (full blocks only, KV-4).

        A block already registered under the same hash (a prefix hit) is skipped. A hash already held
        by another block keeps that block as the lookup answer and adds this one beside it.
        """
        if not self.enable_caching:
            return
        cached = self._cached
        for i in range(start, end):
            blk = blocks[i]
            if blk.is_null:
                continue
            h = hashes[i]
            if blk.block_hash is not None:
                if blk.block_hash != h:
                    raise ValueError(
                        f"block {blk.block_id} is cached under {blk.block_hash}, cannot re-cache as {h}"
                    )
                continue
            blk.block_hash = h
            self._num_cached += 1
            entry = cached.get(h)
            if entry is None:
                cached[h] = blk
            elif type(entry) is KVBlock:
                cached[h] = {entry.block_id: entry, blk.block_id: blk}
            else:
                entry[blk.block_id] = blk

    def _evict(self, blk: KVBlock) -> None:
        h = blk.block_hash
        assert h is not None
        entry = self._cached[h]
        if entry is blk:
            del self._cached[h]
        else:
            assert type(entry) is dict
            del entry[blk.block_id]
            if len(entry) == 1:
                self._cached[h] = next(iter(entry.values()))
        blk.block_hash = None
        self._num_cached -= 1

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use, as vLLM does."""
        if len(self._free) != self.num_blocks - 1:
            return False
        for b in self.blocks:
            b.block_hash = None
            b.cached_free = False
        self._cached.clear()
        self._num_cached = 0
        self._num_cached_free = 0
        return True

    # ---- checking ---------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the queue, ref counts and hash map disagree (used by tests)."""
        free = self._free
        null = self.null_block

        def fail(msg: str) -> None:
            raise AssertionError(msg)

        if not null.is_null or null.block_id in free or null.block_hash is not None:
            fail(f"null block corrupted: {null!r}, in free queue: {null.block_id in free}")
        n_hashed = 0
        for b in self.blocks[1:]:
            if b.is_null:
                fail(f"block {b.block_id} marked null")
            if b.ref_cnt < 0:
                fail(f"block {b.block_id} has negative ref_cnt {b.ref_cnt}")
            if (b.block_id in free) != (b.ref_cnt == 0):
                fail(f"block {b.block_id}: ref_cnt {b.ref_cnt} but in free queue = {b.block_id in free}")
            if b.block_hash is not None:
                n_hashed += 1
                entry = self._cached.get(b.block_hash)
                held = entry is b or (type(entry) is dict and entry.get(b.block_id) is b)
                if not held:
                    fail(f"block {b.block_id} has hash {b.block_hash} but the map does not hold it")
        n_cached_free = sum(1 for b in self.blocks if b.cached_free)
        if n_cached_free != self._num_cached_free:
            fail(f"cached-free counter {self._num_cached_free} != {n_cached_free} flagged blocks")
        if any(b.cached_free and b.block_id not in free for b in self.blocks):
            fail("a block flagged cached-free is not in the free queue")
        for bid, b in free.items():
            if b is not self.blocks[bid]:
                fail(f"free queue key {bid} maps to block {b.block_id}")
        n_mapped = 0
        for h, entry in self._cached.items():
            members = [entry] if type(entry) is KVBlock else list(entry.values())
            if not members:
                fail(f"hash {h} maps to an empty set")
            for b in members:
                n_mapped += 1
                if b.block_hash != h:
                    fail(f"map says hash {h} -> block {b.block_id}, block says {b.block_hash}")
        if not (n_hashed == n_mapped == self._num_cached):
            fail(f"cached count mismatch: blocks {n_hashed}, map {n_mapped}, counter {self._num_cached}")
