"""BlockPool's two-list free queue against a plain-list reference model (engines.md KV-6, vLLM 0.33).

The pool keeps its free queue as a stack (``_front``) followed by a FIFO with holes (``_back``), with
absolute positions, compaction of the consumed head and a cached-free count derived from positions.
None of that may be visible: the reference model below is the queue as vLLM 0.33 describes it, a list
from front (next allocated) to back, with ref counts, hashes and cached-free flags in plain lists.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sim.kv.block_pool import BlockPool, KVBlock

NUM_HASHES = 4  # few distinct hashes: duplicates (two blocks under one hash) happen often


class RefPool:
    """The free queue as a list (front first), and everything else as plain per-block lists."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.n = num_blocks
        self.caching = caching
        self.queue: list[int] = list(range(1, num_blocks))  # starts ordered by block id
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.cached_free = [False] * num_blocks  # freed via the back path, not popped or touched since
        self.map: dict[int, list[int]] = {}  # hash -> block ids, oldest registration first

    # -- allocation -----------------------------------------------------------------------------
    def get_new_blocks(self, m: int) -> list[int]:
        if m > len(self.queue):
            raise ValueError("not enough free blocks")
        if m <= 0:
            return []
        out = self.queue[:m]
        del self.queue[:m]
        for b in out:
            self.ref[b] = 1
            self.cached_free[b] = False
            if self.hash[b] is not None:  # lazy eviction of the stale hash
                self._evict(b)
        return out

    def _evict(self, b: int) -> None:
        h = self.hash[b]
        assert h is not None
        members = self.map[h]
        members.remove(b)
        if not members:
            del self.map[h]
        self.hash[b] = None

    # -- freeing --------------------------------------------------------------------------------
    def release(self, first: list[int], last: list[int]) -> None:
        counts = Counter(b for b in (*first, *last) if b != 0)
        for b, c in counts.items():
            if c > self.ref[b]:
                raise ValueError(f"double free of {b}")
        zero_first: list[int] = []
        zero_last: list[int] = []
        for group, zero in ((first, zero_first), (last, zero_last)):
            for b in group:
                if b == 0:
                    continue  # the null block is never freed
                self.ref[b] -= 1
                if self.ref[b] == 0:
                    zero.append(b)
        self.queue = zero_first + self.queue + zero_last
        for b in zero_last:
            self.cached_free[b] = True

    def free_blocks(self, blocks: list[int]) -> None:
        if self.caching:
            self.release(
                [b for b in blocks if self.hash[b] is None], [b for b in blocks if self.hash[b] is not None]
            )
        else:
            self.release(list(blocks), [])

    # -- hits -----------------------------------------------------------------------------------
    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if b == 0:
                continue
            if self.ref[b] == 0:
                self.queue.remove(b)
                self.cached_free[b] = False
            self.ref[b] += 1

    def cache_full_blocks(self, blocks: list[int], hashes: list[int], start: int, end: int) -> None:
        if not self.caching:
            return
        for i in range(start, end):
            b, h = blocks[i], hashes[i]
            if b == 0:
                continue
            if self.hash[b] is not None:
                if self.hash[b] != h:
                    raise ValueError("re-cache under another hash")
                continue
            self.hash[b] = h
            self.map.setdefault(h, []).append(b)

    def get_cached_block(self, h: int) -> int | None:
        members = self.map.get(h)
        return members[0] if members else None

    def reset_prefix_cache(self) -> bool:
        if len(self.queue) != self.n - 1:
            return False
        self.hash = [None] * self.n
        self.map = {}
        self.cached_free = [False] * self.n
        return True

    # -- observables ----------------------------------------------------------------------------
    def num_cached_free(self) -> int:
        return sum(self.cached_free[b] for b in self.queue)


def snapshot(pool: BlockPool, hashes) -> tuple:
    """Everything observable about the pool, for 'nothing changed' checks."""
    looked = tuple((h, None if (b := pool.get_cached_block(h)) is None else b.block_id) for h in hashes)
    return (
        tuple(pool.free_block_ids()),
        pool.num_free_blocks,
        pool.num_cached_free_blocks,
        pool.num_cached_blocks,
        pool.num_cached_hashes,
        tuple(b.ref_cnt for b in pool.blocks),
        tuple(b.block_hash for b in pool.blocks),
        looked,
    )


def assert_same(pool: BlockPool, ref: RefPool, hashes) -> None:
    queue = pool.free_block_ids()
    assert queue == ref.queue
    assert pool.num_free_blocks == len(ref.queue)
    assert pool.usage == pytest.approx(1.0 - len(ref.queue) / (ref.n - 1))
    assert pool.num_cached_free_blocks == ref.num_cached_free()
    assert pool.num_cached_blocks == sum(h is not None for h in ref.hash)
    assert pool.num_cached_hashes == len(ref.map)
    assert [b.ref_cnt for b in pool.blocks] == ref.ref
    assert [b.block_hash for b in pool.blocks] == ref.hash
    for h in hashes:
        got = pool.get_cached_block(h)
        assert (None if got is None else got.block_id) == ref.get_cached_block(h), h
    pool.check_invariants()


class QueueMachine(RuleBasedStateMachine):
    """Random pool operations applied to BlockPool and RefPool alike; they must never disagree.

    ``held`` lists one entry per reference the test holds (a block touched twice appears twice).
    ``compact_at`` is lowered in most runs so that compaction of the back FIFO happens in small pools.
    """

    @initialize(
        num_blocks=st.integers(2, 20),
        caching=st.booleans(),
        compact_at=st.sampled_from([4096, 1, 2, 3, 6]),
    )
    def setup(self, num_blocks: int, caching: bool, compact_at: int) -> None:
        self.pool = BlockPool(num_blocks, enable_caching=caching, compact_at=compact_at)
        self.ref = RefPool(num_blocks, caching)
        self.held: list[int] = []

    # -- helpers --------------------------------------------------------------------------------
    def blocks(self, ids) -> list[KVBlock]:
        return [self.pool.blocks[i] for i in ids]

    def take_refs(self, data) -> list[int]:
        """A random selection of held references, in a random order; removed from ``held``."""
        idx = data.draw(st.lists(st.integers(0, len(self.held) - 1), unique=True, max_size=len(self.held)))
        ids = [self.held[i] for i in idx]
        for i in sorted(idx, reverse=True):
            del self.held[i]
        return ids

    def with_null(self, data, ids: list[int]) -> list[int]:
        """Sometimes slip the null block in: the pool must ignore it."""
        if data.draw(st.integers(0, 3)) == 0:
            ids = list(ids)
            ids.insert(data.draw(st.integers(0, len(ids))), 0)
        return ids

    def snap(self) -> tuple:
        return snapshot(self.pool, range(NUM_HASHES))

    # -- rules ----------------------------------------------------------------------------------
    @rule(n=st.integers(0, 7))
    def allocate(self, n: int) -> None:
        if n > len(self.ref.queue):
            before = self.snap()
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            assert self.snap() == before
            return
        got = self.pool.get_new_blocks(n)
        want = self.ref.get_new_blocks(n)
        assert [b.block_id for b in got] == want
        self.held.extend(want)

    @precondition(lambda self: self.ref.queue)
    @rule(spare=st.integers(0, 2))
    def allocate_nearly_all(self, spare: int) -> None:
        """Drain the queue down to ``spare`` blocks: reaches the back FIFO and its cached blocks."""
        n = max(len(self.ref.queue) - spare, 0)
        got = self.pool.get_new_blocks(n)
        want = self.ref.get_new_blocks(n)
        assert [b.block_id for b in got] == want
        self.held.extend(want)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_blocks(self, data) -> None:
        ids = self.with_null(data, self.take_refs(data))
        self.pool.free_blocks(self.blocks(ids))
        self.ref.free_blocks(ids)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data) -> None:
        ids = self.with_null(data, self.take_refs(data))
        sides = [data.draw(st.booleans()) for _ in ids]
        first = [b for b, s in zip(ids, sides, strict=True) if s]
        last = [b for b, s in zip(ids, sides, strict=True) if not s]
        # Sequences of either kind: the pool copies non-list/tuple iterables.
        self.pool.release(self.blocks(first), tuple(self.blocks(last)))
        self.ref.release(first, last)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def cache_full_blocks(self, data) -> None:
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, max_size=6))
        ids = self.with_null(data, ids)
        start = data.draw(st.integers(0, len(ids)))
        end = data.draw(st.integers(start, len(ids)))
        chosen: dict[int, int] = {}
        hashes = []
        for i, b in enumerate(ids):
            if not start <= i < end:
                hashes.append(data.draw(st.integers(0, NUM_HASHES - 1)))  # outside the range: ignored
            elif self.ref.hash[b] is not None:
                hashes.append(self.ref.hash[b])  # already registered under it: skipped
            else:
                h = chosen.get(b)
                if h is None:
                    h = chosen[b] = data.draw(st.integers(0, NUM_HASHES - 1))
                hashes.append(h)
        self.pool.cache_full_blocks(self.blocks(ids), hashes, start, end)
        self.ref.cache_full_blocks(ids, hashes, start, end)

    @precondition(lambda self: any(h is not None for h in self.ref.hash))
    @rule(data=st.data())
    def cache_under_another_hash_is_refused(self, data) -> None:
        b = data.draw(st.sampled_from([i for i, h in enumerate(self.ref.hash) if h is not None]))
        other = (self.ref.hash[b] + 1) % NUM_HASHES
        before = self.snap()
        with pytest.raises(ValueError):
            self.pool.cache_full_blocks(self.blocks([b]), [other], 0, 1)
        assert self.snap() == before

    @precondition(lambda self: self.ref.map)
    @rule(data=st.data())
    def touch_cached_hit(self, data) -> None:
        h = data.draw(st.sampled_from(sorted(self.ref.map)))
        blk = self.pool.get_cached_block(h)
        assert blk is not None and blk.block_id == self.ref.get_cached_block(h)
        self.pool.touch([blk])
        self.ref.touch([blk.block_id])
        self.held.append(blk.block_id)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def touch_held(self, data) -> None:
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, max_size=4))
        self.pool.touch(self.blocks(ids))
        self.ref.touch(ids)
        self.held.extend(ids)

    @precondition(lambda self: self.ref.queue)
    @rule(data=st.data())
    def touch_free(self, data) -> None:
        """A hit on any free block (front, back, cached or not), possibly twice in one call."""
        ids = data.draw(st.lists(st.sampled_from(self.ref.queue), min_size=1, max_size=4))
        ids = self.with_null(data, ids)
        self.pool.touch(self.blocks(ids))
        self.ref.touch(ids)
        self.held.extend(b for b in ids if b != 0)

    @rule(data=st.data(), via_release=st.booleans())
    def double_free_changes_nothing(self, data, via_release: bool) -> None:
        """Some good references plus one too many: ValueError, and the pool as it was."""
        good_idx = (
            data.draw(st.lists(st.integers(0, len(self.held) - 1), unique=True, max_size=len(self.held)))
            if self.held
            else []
        )
        ids = [self.held[i] for i in good_idx]
        candidates = list(self.ref.queue)  # a free block: any release of it is a double free
        counts = Counter(ids)
        candidates += [b for b in set(self.held) if counts[b] == self.ref.ref[b]]  # all refs already given
        if not candidates:
            return
        bad = data.draw(st.sampled_from(sorted(candidates)))
        ids.insert(data.draw(st.integers(0, len(ids))), bad)
        before = self.snap()
        with pytest.raises(ValueError):
            if via_release:
                sides = [data.draw(st.booleans()) for _ in ids]
                first = [b for b, s in zip(ids, sides, strict=True) if s]
                last = [b for b, s in zip(ids, sides, strict=True) if not s]
                self.pool.release(self.blocks(first), self.blocks(last))
            else:
                self.pool.free_blocks(self.blocks(ids))
        with pytest.raises(ValueError):
            if via_release:
                self.ref.release(first, last)
            else:
                self.ref.free_blocks(ids)
        assert self.snap() == before

    @rule()
    def reset_prefix_cache(self) -> None:
        assert self.pool.reset_prefix_cache() == self.ref.reset_prefix_cache()

    @invariant()
    def same_as_reference(self) -> None:
        if not hasattr(self, "pool"):
            return
        assert_same(self.pool, self.ref, range(NUM_HASHES))
        assert sorted(self.held) == sorted(b for b in range(1, self.ref.n) for _ in range(self.ref.ref[b]))


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_large_pool_compacts_and_matches_reference():
    """~10,000 blocks, allocate/free cycles with hits on free blocks (holes): the consumed head of the
    back FIFO is dropped several times (at the real ``_COMPACT_AT``) and the queue never differs from
    the reference model."""
    t0 = time.perf_counter()
    n = 10_000
    pool = BlockPool(n, enable_caching=True)
    ref = RefPool(n, True)
    rng = random.Random(20261129)
    hashes = range(40)
    held: list[int] = []
    bases = {pool._base}
    compactions = 0

    def blocks(ids):
        return [pool.blocks[i] for i in ids]

    for cycle in range(36):
        # Allocate a large batch: pops the front stack, then a long stretch of the back FIFO.
        m = rng.randint(len(ref.queue) // 3, len(ref.queue) * 3 // 4)
        got = pool.get_new_blocks(m)
        want = ref.get_new_blocks(m)
        assert [b.block_id for b in got] == want
        held.extend(want)
        if pool._base not in bases:
            compactions += 1
            bases.add(pool._base)
        # Register about half of the new blocks under few hashes (duplicates galore).
        reg = [b for b in want if rng.random() < 0.5]
        hs = [rng.choice(hashes) for _ in reg]
        pool.cache_full_blocks(blocks(reg), hs, 0, len(reg))
        ref.cache_full_blocks(reg, hs, 0, len(reg))
        # Free most of what is held, in a random order, part via free_blocks and part via release.
        rng.shuffle(held)
        k = len(held) * rng.randint(60, 95) // 100
        out, held = held[:k], held[k:]
        half = len(out) // 2
        pool.free_blocks(blocks(out[:half]))
        ref.free_blocks(out[:half])
        sides = [rng.random() < 0.3 for _ in out[half:]]
        first = [b for b, s in zip(out[half:], sides, strict=True) if s]
        last = [b for b, s in zip(out[half:], sides, strict=True) if not s]
        pool.release(blocks(first), blocks(last))
        ref.release(first, last)
        # Prefix hits on free blocks leave holes in the back FIFO (and take blocks off the front).
        for _ in range(rng.randint(20, 120)):
            h = rng.choice(hashes)
            blk = pool.get_cached_block(h)
            assert (None if blk is None else blk.block_id) == ref.get_cached_block(h)
            if blk is not None:
                pool.touch([blk])
                ref.touch([blk.block_id])
                held.append(blk.block_id)
        for b in rng.sample(ref.queue, min(30, len(ref.queue))):
            pool.touch([pool.blocks[b]])
            ref.touch([b])
            held.append(b)
        if cycle == 20:  # free everything and forget the cache once, mid-way
            pool.free_blocks(blocks(held))
            ref.free_blocks(held)
            held = []
            assert pool.reset_prefix_cache() and ref.reset_prefix_cache()
        if cycle % 3 == 0 or cycle == 20:
            assert_same(pool, ref, hashes)
    assert_same(pool, ref, hashes)
    assert compactions >= 3, f"only {compactions} compactions: the test no longer exercises them"
    assert time.perf_counter() - t0 < 10  # a generous bound: normally well under 2 s
