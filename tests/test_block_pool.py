"""BlockPool: null block, LRU free queue, lazy eviction, duplicate hashes, invariants (engines.md KV-2/3/6)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.kv import BlockPool, KVBlock


def test_null_block_is_reserved_and_never_handed_out():
    pool = BlockPool(8, enable_caching=True)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.usable_blocks == 7 and pool.num_free_blocks == 7
    got = pool.get_new_blocks(7)
    assert [b.block_id for b in got] == [1, 2, 3, 4, 5, 6, 7]  # KV-6: initially ordered by block id
    assert all(b.ref_cnt == 1 and not b.is_null for b in got)
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.free_blocks(got)
    pool.free_blocks([pool.null_block])  # ignored, never enters the free queue
    assert 0 not in pool.free_block_ids()
    assert sorted(b.block_id for b in pool.get_new_blocks(7)) == list(range(1, 8))
    pool.check_invariants()


def test_too_small_pool_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(1, enable_caching=True)


def test_usage_formula_counts_cached_unreferenced_as_free():
    pool = BlockPool(11, enable_caching=True)
    assert pool.usage == 0.0
    blocks = pool.get_new_blocks(4)
    assert pool.usage == pytest.approx(1 - 6 / 10)  # KV-3: 1 - free / (num_blocks - 1)
    pool.cache_full_blocks(blocks, [11, 12, 13, 14], 0, 4)
    pool.free_blocks(blocks)
    assert pool.num_cached_blocks == 4  # still cached...
    assert pool.usage == 0.0  # ...but counted as free


def test_free_appends_cached_blocks_and_prepends_uncached_ones():
    """vLLM 0.33 BlockPool.free_blocks (the vllm-oracle, bench/vllm_diff.py): blocks with a hash join the
    back in the order given (LRU eviction); blocks without one join the front, the first given at the very
    front, so they are reused before any cached block is evicted."""
    pool = BlockPool(8, enable_caching=True)
    a = pool.get_new_blocks(3)  # 1, 2, 3
    b = pool.get_new_blocks(3)  # 4, 5, 6
    assert pool.free_block_ids() == [7]
    pool.cache_full_blocks(a, [11, 12, 13], 0, 2)  # 1, 2 full and cached; 3 is a partial tail
    pool.cache_full_blocks(b, [21, 22, 23], 0, 1)  # 4 cached
    pool.free_blocks(reversed(a))
    assert pool.free_block_ids() == [3, 7, 2, 1]
    pool.free_blocks(reversed(b))
    assert pool.free_block_ids() == [6, 5, 3, 7, 2, 1, 4]
    assert [x.block_id for x in pool.get_new_blocks(4)] == [6, 5, 3, 7]
    assert pool.num_cached_blocks == 3  # nothing evicted yet
    assert [x.block_id for x in pool.get_new_blocks(1)] == [2]  # the LRU cached block, tail first
    assert pool.get_cached_block(12) is None and pool.get_cached_block(11) is a[0]
    pool.check_invariants()


def test_free_without_caching_reuses_the_last_freed_first():
    pool = BlockPool(6, enable_caching=False)
    a = pool.get_new_blocks(2)  # 1, 2
    b = pool.get_new_blocks(2)  # 3, 4
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    assert pool.free_block_ids() == [4, 3, 2, 1, 5]
    pool.check_invariants()


def test_release_places_blocks_as_told():
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(4)  # 1..4, none hashed
    pool.touch(blocks[:1])  # block 1 has a second holder: it stays out of the queue
    pool.release(blocks[2:][::-1], blocks[:2][::-1])  # 4, 3 to the front; 2, 1 to the back
    assert pool.free_block_ids() == [4, 3, 5, 2]
    assert blocks[0].ref_cnt == 1
    with pytest.raises(ValueError, match="double free"):
        pool.release([blocks[3]], [])
    pool.check_invariants()


def test_free_decrements_shared_blocks_and_only_zero_ref_returns():
    pool = BlockPool(5, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)  # a second holder
    assert [b.ref_cnt for b in blocks] == [2, 2]
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 2 and [b.ref_cnt for b in blocks] == [1, 1]
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 4
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks(blocks[:1])
    assert blocks[0].ref_cnt == 0  # the failed call changed nothing
    pool.check_invariants()


def test_touch_removes_from_middle_of_free_queue():
    pool = BlockPool(6, enable_caching=True)
    blocks = pool.get_new_blocks(5)
    pool.cache_full_blocks(blocks, [100, 101, 102, 103, 104], 0, 5)
    pool.free_blocks(blocks)
    assert pool.free_block_ids() == [1, 2, 3, 4, 5]
    hit = pool.get_cached_block(102)
    assert hit is blocks[2]
    pool.touch([hit])
    assert hit.ref_cnt == 1 and pool.free_block_ids() == [1, 2, 4, 5]
    assert pool.get_cached_block(102) is hit  # a touched block keeps its hash
    pool.check_invariants()


def test_lazy_eviction_only_when_popped():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [7, 8, 9], 0, 3)
    pool.free_blocks(reversed(blocks))  # queue: 3, 2, 1
    assert pool.num_cached_blocks == 3
    (first,) = pool.get_new_blocks(1)
    assert first.block_id == 3 and first.block_hash is None and first.ref_cnt == 1
    assert pool.get_cached_block(9) is None
    assert pool.get_cached_block(7) is blocks[0] and pool.get_cached_block(8) is blocks[1]
    assert pool.num_cached_blocks == 2 and pool.num_cached_hashes == 2
    pool.check_invariants()


def test_duplicate_hash_keeps_existing_answer_and_survives_eviction_of_one_copy():
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [42], 0, 1)
    pool.cache_full_blocks([b], [42], 0, 1)
    assert pool.get_cached_block(42) is a  # the existing mapping answers lookups
    assert pool.num_cached_blocks == 2 and pool.num_cached_hashes == 1
    pool.free_blocks([a, b])  # queue: 3, 1(a), 2(b)
    pool.get_new_blocks(2)  # pops 3 then a: a's copy is evicted
    assert a.block_hash is None
    assert pool.get_cached_block(42) is b  # b still holds the content, as in vLLM
    pool.check_invariants()


def test_prefix_walk_takes_a_hint_only_where_it_is_the_lookup_answer():
    """``longest_cached_prefix`` tries the block registered after the previous hit in its table before
    the map: taken only if it carries the hash and no other block does (else the map's oldest answers)."""
    pool = BlockPool(12, enable_caching=True)
    z = pool.get_new_blocks(1)[0]
    pool.cache_full_blocks([z], [6], 0, 1)  # hash 6's first holder
    x, y, w = pool.get_new_blocks(3)
    pool.cache_full_blocks([x, y, w], [5, 6, 8], 0, 3)  # x -> y -> w hinted; y duplicates 6
    assert x.next_hint is y and y.next_hint is w and y.dup and z.dup and not x.dup
    assert pool.longest_cached_prefix([5, 6, 8], 3) == [x, z, w]  # 6: the oldest (z), not the hint (y)
    assert pool.longest_cached_prefix([5, 6, 8], 2) == [x, z]
    # y's copy evicted: z alone holds 6 again (no longer dup), and y is reused for other content
    pool.free_blocks([w, y])
    pool.free_blocks([z])  # queue: the unused blocks, then w, y, z (hashed blocks join the back)
    while y.block_hash is not None:
        pool.get_new_blocks(1)
    assert not z.dup and pool.get_cached_block(6) is z
    pool.cache_full_blocks([y], [9], 0, 1)
    assert pool.longest_cached_prefix([5, 7], 2) == [x]  # x's stale hint (y, now under 9) is not taken
    assert pool.longest_cached_prefix([5, 6, 9], 3) == [x, z, y]  # the map still finds 9
    pool.check_invariants()


def test_cache_full_blocks_skips_same_hash_and_rejects_conflict():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2], 0, 1)
    pool.cache_full_blocks(blocks, [1, 2], 0, 2)  # block 0 already cached under 1: skipped
    assert pool.num_cached_blocks == 2 and [b.block_hash for b in blocks] == [1, 2]
    with pytest.raises(ValueError, match="re-cache"):
        pool.cache_full_blocks(blocks, [5, 2], 0, 1)
    pool.check_invariants()


def test_caching_disabled_registers_nothing():
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2], 0, 2)
    assert pool.num_cached_blocks == 0 and pool.get_cached_block(1) is None


def test_reset_prefix_cache_refused_while_blocks_in_use():
    pool = BlockPool(4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2], 0, 2)
    assert pool.reset_prefix_cache() is False
    assert pool.num_cached_blocks == 2
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.num_cached_blocks == 0 and pool.get_cached_block(1) is None
    assert all(b.block_hash is None for b in pool.blocks)
    pool.check_invariants()


def test_check_invariants_detects_corruption():
    pool = BlockPool(4, enable_caching=True)
    blk = pool.get_new_blocks(1)[0]
    blk.ref_cnt = 0  # out of the free queue with ref 0
    with pytest.raises(AssertionError, match="free queue"):
        pool.check_invariants()
    blk.ref_cnt = 1
    blk.block_hash = 99  # hash the map does not know
    with pytest.raises(AssertionError, match="map"):
        pool.check_invariants()


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / free / share / cache sequences; owners model the requests holding blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(12, enable_caching=True)
        self.owners: list[list[KVBlock]] = []
        self.next_hash = 0

    @rule(n=st.integers(0, 5))
    def allocate(self, n: int) -> None:
        if n > self.pool.num_free_blocks:
            free_before = self.pool.free_block_ids()
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            assert self.pool.free_block_ids() == free_before
            return
        got = self.pool.get_new_blocks(n)
        assert all(not b.is_null and b.ref_cnt == 1 and b.block_hash is None for b in got)
        self.owners.append(got)

    @precondition(lambda self: self.owners)
    @rule(i=st.integers(0, 100), reverse=st.booleans())
    def free(self, i: int, reverse: bool) -> None:
        blocks = self.owners.pop(i % len(self.owners))
        before = self.pool.free_block_ids()
        order = list(reversed(blocks)) if reverse else blocks
        self.pool.free_blocks(order)
        newly = [b for b in order if b.ref_cnt == 0]
        front = [b.block_id for b in newly if b.block_hash is None]  # vLLM 0.33: uncached reused first
        back = [b.block_id for b in newly if b.block_hash is not None]
        assert self.pool.free_block_ids() == front + before + back

    @precondition(lambda self: self.owners)
    @rule(i=st.integers(0, 100))
    def cache(self, i: int) -> None:
        blocks = self.owners[i % len(self.owners)]
        hashes = []
        for b in blocks:
            if b.block_hash is None:
                self.next_hash += 1
                hashes.append(self.next_hash % 5)  # few distinct values: duplicates happen
            else:
                hashes.append(b.block_hash)
        self.pool.cache_full_blocks(blocks, hashes, 0, len(blocks))

    @rule(h=st.integers(0, 4))
    def share_cached(self, h: int) -> None:
        blk = self.pool.get_cached_block(h)
        if blk is None:
            return
        self.pool.touch([blk])
        assert blk.block_id not in self.pool.free_block_ids()
        self.owners.append([blk])

    @invariant()
    def consistent(self) -> None:
        self.pool.check_invariants()
        held: dict[int, int] = {}
        for blocks in self.owners:
            for b in blocks:
                held[b.block_id] = held.get(b.block_id, 0) + 1
        for b in self.pool.blocks[1:]:
            assert b.ref_cnt == held.get(b.block_id, 0)
        assert self.pool.num_free_blocks + len(held) == self.pool.usable_blocks
        assert 0 not in held


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_cached_free_counter_follows_hits_and_evictions():
    """Free-but-cached blocks: counted when a hashed block is freed, uncounted on a hit or an eviction."""
    from sim.kv.block_pool import BlockPool

    pool = BlockPool(num_blocks=5, enable_caching=True)  # 4 usable
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [11, 12], 0, 2)
    b = pool.get_new_blocks(1)  # never hashed
    pool.free_blocks(list(reversed(a)) + b)
    assert pool.num_cached_free_blocks == 2 and pool.num_free_blocks == 4
    pool.touch([pool.get_cached_block(11)])  # a prefix hit revives one
    assert pool.num_cached_free_blocks == 1
    pool.get_new_blocks(3)  # takes the unhashed blocks first, then evicts the cached one
    assert pool.num_cached_free_blocks == 0 and pool.get_cached_block(12) is None
    pool.check_invariants()
