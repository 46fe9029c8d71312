"""Paged KV block pool: fixed blocks, ref counts, an LRU free queue and a hash -> block map.

The pool knows blocks only (no requests, tokens or scheduling), in the way vLLM V1 layers its
``BlockPool`` under the ``KVCacheManager`` (engines.md §1.3). Rules implemented here:

- KV-2: block 0 is the null block, taken out at init and never handed out, freed or evicted.
- KV-3: ``usage = 1 - free / (num_blocks - 1)``; cached blocks nobody references count as free.
- KV-6: the free queue starts ordered by block id, allocation pops from the front, freed blocks with a
  hash go to the back in the order given and freed blocks without one to the front (vLLM 0.33, checked
  against vllm-oracle), a popped block that still carries a hash is evicted from the map then (lazy
  eviction), and a prefix hit on a free block removes it from the middle (``touch``).

Why the queue is two lists. Blocks only ever join at the front or at the back, so the queue is a
stack (``_front``, whose last element is the queue's front) followed by a FIFO (``_back``, read from
``_head``). A request frees and allocates tens of blocks at a time, and list slicing moves them in C
instead of one linked-list operation per block (vLLM's doubly linked list; an ``OrderedDict`` here
before). A hit on a free block leaves a ``None`` hole at its position: hashed blocks record it
(``qpos``) when they join the back; an unhashed one, which no prefix lookup returns, is searched for.
Only blocks released as cached (hashed, or content the manager leaves unhashed) join the back, so the
cached-free blocks are exactly the live back entries past ``_cf_start`` (the blocks queued at init, or
before a cache reset, come before it): counting them needs no per-block flag. Stores into block objects
are expensive at tens of thousands of blocks (bench/README.md, speed.py), hence so few of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar, cast


class KVBlock:
    """One KV block. ``block_hash`` is set while the block is registered in the prefix cache."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "is_null", "qpos", "dup", "next_hint")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.is_null = False
        self.qpos = -1  # hashed blocks: absolute position of the latest entry in the back FIFO
        self.dup = False  # registered under a hash that other blocks hold too (a dict entry)
        # The block registered after this one in the same block table: where a prefix walk most likely
        # finds the next hash (a guess, checked against the hash; see longest_cached_prefix).
        self.next_hint: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash}, null={self.is_null})"


# A hash maps to one block, or to {block_id: block} when several blocks hold the same content. Two
# requests that prefill the same block in the same step (or one that could not hit the last block
# because of the KV-5 cap) each fill their own copy; vLLM keeps both registered (its
# BlockHashToBlockMap), a lookup returns the oldest, and evicting one leaves the other hittable.
_Entry = KVBlock | dict[int, KVBlock]

_T = TypeVar("_T")


def _as_list(xs: Iterable[_T]) -> list[_T]:
    """``xs`` itself when it is a list, else a list of it. Compiled, a loop over a typed list reads each
    item's fields in place; over a sequence or an iterable, each item is a generic object (an attribute
    lookup, a comparison, an iterator step per block)."""
    return cast(list[_T], xs) if type(xs) is list else list(xs)


_COMPACT_AT = 4096  # drop the consumed head of the back FIFO once it is this long and over half the list


class BlockPool:
    """Fixed pool of ``num_blocks`` KV blocks, block 0 reserved as the null block (engines.md KV-2)."""

    def __init__(self, num_blocks: int, enable_caching: bool, compact_at: int = _COMPACT_AT) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks: list[KVBlock] = [KVBlock(i) for i in range(num_blocks)]
        # KV-2: the null block never enters the free queue.
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self._front: list[KVBlock] = []
        self._back: list[KVBlock | None] = list(self.blocks[1:])
        self._compact_at = compact_at
        self._head = 0  # index of the first unread entry of _back
        self._base = 0  # absolute position of _back[0] (positions are absolute: compaction renumbers nothing)
        self._holes = 0  # None entries in _back[_head:]
        self._cf_start = num_blocks - 1  # back entries from here on are cached-free
        self._num_free = num_blocks - 1
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
        return self._num_free

    @property
    def usage(self) -> float:
        """KV usage as vLLM reports it: ``1 - free / (num_blocks - 1)`` (engines.md KV-3)."""
        return 1.0 - self._num_free / (self.num_blocks - 1)

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
        ids = [b.block_id for b in reversed(self._front)]
        ids.extend(b.block_id for b in self._back[self._head:] if b is not None)
        return ids

    # ---- allocation -------------------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Pop ``n`` blocks from the front of the free queue, evicting their stale hashes (KV-6)."""
        if n > self._num_free:
            raise ValueError(f"cannot allocate {n} blocks: only {self._num_free} free")
        if n <= 0:
            return []
        front = self._front
        if n <= len(front):
            out = front[-n:]
            del front[-n:]
            out.reverse()
        else:
            out = front[::-1]
            front.clear()
            self._pop_back(n - len(out), out)
        self._num_free -= n
        if self._num_cached:
            for blk in out:
                blk.ref_cnt = 1
                if blk.block_hash is not None:
                    self._evict(blk)
        else:  # nothing is hashed: nothing to evict
            for blk in out:
                blk.ref_cnt = 1
        return out

    def _pop_back(self, m: int, out: list[KVBlock]) -> None:
        """Move the first ``m`` live entries of the back FIFO to ``out``, skipping holes."""
        back, h, base = self._back, self._head, self._base
        if not self._holes:
            out.extend(back[h:h + m])  # type: ignore[arg-type]
            cf = base + h + m - max(base + h, self._cf_start)
            if cf > 0:
                self._num_cached_free -= cf
            h += m
        else:
            # One compiled pass over the entries (a session's turn leaves a hole for each block of its
            # history it touched, so popping walks many holes): ~10 instructions a hole, where slicing
            # windows and counting their holes three times was ~250.
            cf = self._cf_start - base  # entries from this index on are cached-free
            holes = cached = 0
            while m:
                b = back[h]
                h += 1
                if b is None:
                    holes += 1
                    continue
                out.append(b)
                if h > cf:
                    cached += 1
                m -= 1
            self._holes -= holes
            self._num_cached_free -= cached
        if h >= self._compact_at and 2 * h >= len(back):
            del back[:h]
            self._base += h
            h = 0
        self._head = h

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching 0 rejoin the free queue.

        vLLM 0.33 ``BlockPool.free_blocks`` (checked against vllm-oracle): a block that carries a hash
        joins the back, so cached blocks are evicted in LRU order; a block without one (a partial tail,
        or every block when caching is off) goes to the front, to be reused before any cached block is
        evicted. Both groups keep the order given; the manager passes a request's blocks tail first, so
        within a request the longest-prefix blocks are evicted before the head blocks (engines.md KV-6).
        """
        blocks = list(blocks)
        if self.enable_caching:
            self.release(
                [b for b in blocks if b.block_hash is None], [b for b in blocks if b.block_hash is not None]
            )
        else:
            self.release(blocks, ())

    def release(self, reuse_first: Sequence[KVBlock], reuse_last: Sequence[KVBlock]) -> None:
        """``free_blocks`` with the placement chosen by the caller: blocks of ``reuse_first`` that reach
        ref 0 go to the front of the free queue (the first one given at the very front), those of
        ``reuse_last`` to the back. The manager uses it for content it leaves unhashed (its docstring).
        A double free raises ValueError and changes nothing.

        One pass per block: a block is touched once (its fields are cache misses at this pool's size)."""
        # typed lists (_as_list): three generic attribute lookups a block were 3 % of a run
        first, last = _as_list(reuse_first), _as_list(reuse_last)
        zero_first = self._decref(first)
        back = self._back
        n0 = len(back)
        pos = self._base + n0
        for i in range(len(last)):
            b = last[i]
            r = b.ref_cnt
            if r == 1:
                b.ref_cnt = 0
                back.append(b)
            elif r > 1:
                b.ref_cnt = r - 1
            elif not b.is_null:
                del back[n0:]
                self._undo((*first, *last[:i]), b)
        n_last = len(back) - n0
        if self._num_cached:  # record where the hashed ones sit: only those can be hit (touched)
            for j in range(n0, n0 + n_last):
                blk = back[j]  # appended just above: never a hole
                if blk is not None and blk.block_hash is not None:
                    blk.qpos = pos + j - n0
        if zero_first:
            zero_first.reverse()
            self._front.extend(zero_first)
        self._num_cached_free += n_last
        self._num_free += len(zero_first) + n_last

    def _decref(self, group: list[KVBlock]) -> list[KVBlock]:
        """Drop one reference from each block of ``group``; returns those reaching 0."""
        zero: list[KVBlock] = []
        for i in range(len(group)):
            b = group[i]
            r = b.ref_cnt
            if r > 1:
                b.ref_cnt = r - 1
            elif r == 1:
                b.ref_cnt = 0
                zero.append(b)
            elif not b.is_null:
                self._undo(group[:i], b)
        return zero

    @staticmethod
    def _undo(done: Sequence[KVBlock], bad: KVBlock) -> None:
        """Give back the references a release took before meeting ``bad`` (a double free), and raise."""
        for u in done:
            if not u.is_null:
                u.ref_cnt += 1
        raise ValueError(f"double free of block {bad.block_id} (ref_cnt {bad.ref_cnt})")

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the middle of the queue (KV-6).

        One pass with the queue's fields in locals and its counters written once (a session's turn
        touches its whole history)."""
        back, head, base, cf_start = self._back, self._head, self._base, self._cf_start
        nback = len(back)
        holes = left = cf_left = 0
        for b in _as_list(blocks):
            if b.ref_cnt == 0:
                if b.is_null:
                    continue
                i = b.qpos - base
                if not (head <= i < nback and back[i] is b):
                    # An unhashed block (no prefix hit finds one; a direct call may): search for it.
                    try:
                        i = back.index(b, head)
                    except ValueError:
                        i = -1
                if i >= 0:
                    back[i] = None
                    holes += 1
                    if i + base >= cf_start:
                        cf_left += 1
                else:
                    self._front.remove(b)
                left += 1
            b.ref_cnt += 1
        if left:
            self._holes += holes
            self._num_cached_free -= cf_left
            self._num_free -= left

    # ---- prefix cache -----------------------------------------------------------------------------
    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        """The block registered under ``block_hash`` (the oldest, if several), or None."""
        entry = self._cached.get(block_hash)
        if entry is None or isinstance(entry, KVBlock):
            return entry
        return next(iter(entry.values()))

    def longest_cached_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[KVBlock]:
        """``get_cached_block`` of ``hashes[0..]`` up to the first miss (at most ``max_blocks``): the
        prefix lookup, in one loop that touches only the hit blocks and the first miss."""
        cached = self._cached
        hs = _as_list(hashes)
        hit: list[KVBlock] = []
        prev: KVBlock | None = None
        for i in range(max_blocks):
            h = hs[i]
            # The block registered after the previous hit in its table usually holds the next hash: a
            # block carrying hash h is the lookup's answer when no other block holds h (not dup), which
            # saves the map's lookup (cache misses in a map of every cached block).
            cand = prev.next_hint if prev is not None else None
            if cand is not None and not cand.dup:
                ch = cand.block_hash  # a local: compiled, an optional int compares unboxed once narrowed
                if ch is not None and ch == h:
                    hit.append(cand)
                    prev = cand
                    continue
            entry = cached.get(h)
            if entry is None:
                break
            prev = entry if isinstance(entry, KVBlock) else next(iter(entry.values()))
            hit.append(prev)
        return hit

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
        bl, hs = _as_list(blocks), _as_list(hashes)
        prev = bl[start - 1] if start > 0 else None
        for i in range(start, end):
            blk = bl[i]
            if prev is not None:
                prev.next_hint = blk
            prev = blk
            if blk.is_null:
                continue
            h = hs[i]
            if blk.block_hash is not None:
                if blk.block_hash != h:
                    raise ValueError(
                        f"block {blk.block_id} is cached under {blk.block_hash}, cannot re-cache as {h}"
                    )
                continue
            blk.block_hash = h
            self._num_cached += 1
            entry = cached.setdefault(h, blk)
            if entry is blk:
                continue
            blk.dup = True
            if isinstance(entry, KVBlock):
                entry.dup = True
                cached[h] = {entry.block_id: entry, blk.block_id: blk}
            else:
                entry[blk.block_id] = blk

    def _evict(self, blk: KVBlock) -> None:
        h = blk.block_hash
        assert h is not None
        if not blk.dup:  # the hash's only block: the map's entry is this block
            del self._cached[h]
        else:
            entry = self._cached[h]
            assert type(entry) is dict
            del entry[blk.block_id]
            if len(entry) == 1:
                last = next(iter(entry.values()))
                last.dup = False
                self._cached[h] = last
            blk.dup = False
        blk.block_hash = None
        self._num_cached -= 1

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use, as vLLM does."""
        if self._num_free != self.num_blocks - 1:
            return False
        for b in self.blocks:
            b.block_hash = None
            b.dup = False
        self._cf_start = self._base + len(self._back)  # nothing queued so far holds reusable content
        self._cached.clear()
        self._num_cached = 0
        self._num_cached_free = 0
        return True

    # ---- checking ---------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the queue, ref counts and hash map disagree (used by tests)."""
        null = self.null_block

        def fail(msg: str) -> None:
            raise AssertionError(msg)

        queue = self.free_block_ids()
        free = set(queue)
        if len(free) != len(queue):
            fail(f"a block is in the free queue twice: {queue}")
        if len(queue) != self._num_free:
            fail(f"free counter {self._num_free} != {len(queue)} blocks in the free queue")
        live = self._back[self._head:]
        if live.count(None) != self._holes:
            fail(f"hole counter {self._holes} != {live.count(None)} holes in the free queue")
        n_cached_free = 0
        for i, b in enumerate(live, start=self._base + self._head):
            if b is not None:
                if b.block_hash is not None and b.qpos != i:
                    fail(f"block {b.block_id} sits at queue position {i} but records {b.qpos}")
                n_cached_free += i >= self._cf_start
        if n_cached_free != self._num_cached_free:
            fail(f"cached-free counter {self._num_cached_free} != {n_cached_free} cached-free blocks")
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
        n_mapped = 0
        for h, entry in self._cached.items():
            members = [entry] if isinstance(entry, KVBlock) else list(entry.values())
            if not members:
                fail(f"hash {h} maps to an empty set")
            for b in members:
                n_mapped += 1
                if b.dup != (len(members) > 1):
                    fail(f"block {b.block_id}: dup flag {b.dup} but hash {h} has {len(members)} blocks")
                if b.block_hash != h:
                    fail(f"map says hash {h} -> block {b.block_id}, block says {b.block_hash}")
        if not (n_hashed == n_mapped == self._num_cached):
            fail(f"cached count mismatch: blocks {n_hashed}, map {n_mapped}, counter {self._num_cached}")
