"""KVCacheManager: KV-1, KV-4..KV-8, the full-sequence admission gate, and a stateful property test."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.core.errors import ConfigError
from sim.core.request import Request, RequestSpec
from sim.kv import KVCacheManager

BS = 16


def make_req(rid: str, tokens: tuple[int, ...] | None = None, prompt_len: int | None = None,
             output_len: int = 8) -> Request:
    """A request with literal token ids (shares content) or, without them, unique content."""
    plen = len(tokens) if tokens is not None else prompt_len
    assert plen is not None
    return Request(RequestSpec(request_id=rid, arrival_time=0, prompt_len=plen, output_len=output_len,
                               token_ids=tokens))


def toks(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def advance(req: Request, n: int) -> None:
    """What the scheduler does after a step: tokens computed, a token sampled once the prompt is done."""
    req.num_computed_tokens += n
    if req.num_computed_tokens >= req.num_tokens:
        req.add_output_tokens(1)


def admit(mgr: KVCacheManager, req: Request, max_tokens: int | None = None, **kw):
    """Scheduler-style admission: prefix lookup, then allocate the rest (or ``max_tokens`` of it)."""
    hits, hit_tokens = mgr.get_computed_blocks(req)
    n = req.num_tokens - hit_tokens
    if max_tokens is not None:
        n = min(n, max_tokens)
    got = mgr.allocate_slots(req, n, hit_tokens, hits, **kw)
    if got is not None:
        req.num_computed_tokens = hit_tokens
    return got, hit_tokens


def snapshot(mgr: KVCacheManager):
    pool = mgr.pool
    return (
        pool.free_block_ids(),
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        pool.num_cached_blocks,
        pool.num_cached_hashes,
        {rid: ([b.block_id for b in s.blocks], s.num_cached) for rid, s in mgr._reqs.items()},
        mgr.prefix_cache_stats(),
    )


class CountingRequest(Request):
    """Counts block_hashes calls (the subclass has a __dict__, so the counter can live on it)."""

    def block_hashes(self, block_size: int, num_tokens: int) -> list[int]:
        self.__dict__["calls"] = self.__dict__.get("calls", 0) + 1
        return Request.block_hashes(self, block_size, num_tokens)


# ---- engines.md §6 conformance ------------------------------------------------------------------------
@pytest.mark.parametrize("prompt_len, expected_hit", [(32, 16), (33, 32), (16, 0), (17, 16), (48, 32)])
def test_conformance_3_prefix_hit_cap(prompt_len: int, expected_hit: int):
    mgr = KVCacheManager(64, BS, enable_caching=True, max_model_len=1024)
    first = make_req("a", toks(0, prompt_len))
    admit(mgr, first)
    mgr.free(first)
    again = make_req("b", toks(0, prompt_len))
    hits, hit_tokens = mgr.get_computed_blocks(again)
    assert hit_tokens == expected_hit  # KV-5: at least one token is always recomputed
    assert len(hits) == expected_hit // BS
    assert mgr.prefix_cache_stats()["queries"] == 2 * prompt_len
    assert mgr.prefix_cache_stats()["hits"] == expected_hit


def test_conformance_4_eviction_order_tail_of_first_freed_request_goes_first():
    mgr = KVCacheManager(9, BS, enable_caching=True, max_model_len=1024)  # 8 usable = X's 4 + Y's 4
    x = make_req("x", toks(0, 64))
    y = make_req("y", toks(1000, 64))
    admit(mgr, x)
    admit(mgr, y)
    x_ids = mgr.get_block_ids(x)
    assert x_ids == [1, 2, 3, 4] and mgr.num_free_blocks == 0
    x_hashes = [mgr.pool.blocks[i].block_hash for i in x_ids]
    assert None not in x_hashes
    mgr.free(x)
    mgr.free(y)
    assert mgr.pool.free_block_ids() == [4, 3, 2, 1, 8, 7, 6, 5]  # tail first, X before Y (KV-6)

    probe = make_req("probe", toks(0, 65))  # X's 64 tokens + 1, so all 4 of X's blocks may hit
    assert mgr.get_computed_blocks(probe)[1] == 64

    w = make_req("w", prompt_len=10)  # a 1-block allocation
    assert mgr.allocate_slots(w, 10)[0].block_id == 4
    assert mgr.pool.get_cached_block(x_hashes[3]) is None  # X's block 3 evicted
    assert all(mgr.pool.get_cached_block(h) is not None for h in x_hashes[:3])
    hits, hit_tokens = mgr.get_computed_blocks(probe)
    assert hit_tokens == 48 and [b.block_id for b in hits] == [1, 2, 3]
    mgr.check_invariants()


# ---- KV-1, KV-3 ---------------------------------------------------------------------------------------
def test_kv1_block_count_and_usage():
    mgr = KVCacheManager(21, BS, enable_caching=True, max_model_len=1024)
    req = make_req("a", prompt_len=40, output_len=100)
    new = mgr.allocate_slots(req, 40)
    assert len(new) == 3  # ceil(40 / 16)
    assert mgr.usage == pytest.approx(3 / 20)  # KV-3
    advance(req, 40)
    # decodes up to token 48 need no new block
    for _ in range(8):
        assert list(mgr.allocate_slots(req, 1)) == []  # no new block
        advance(req, 1)
    assert req.num_computed_tokens == 48
    assert len(mgr.allocate_slots(req, 1)) == 1  # token 49 opens block 4
    assert mgr.num_blocks_held(req) == 4
    # lookahead slots are allocated too, capped by max_model_len
    assert len(mgr.allocate_slots(req, 1, num_lookahead_tokens=20)) == 1  # ceil(70/16) = 5
    mgr.free(req)
    assert mgr.num_free_blocks == 20 and mgr.usage == 0.0
    mgr.check_invariants()


def test_max_model_len_caps_slots():
    mgr = KVCacheManager(21, BS, enable_caching=True, max_model_len=40)
    req = make_req("a", prompt_len=30, output_len=100)
    assert len(mgr.allocate_slots(req, 30, num_lookahead_tokens=100)) == 3  # min(130, 40) -> 3 blocks
    assert mgr.num_blocks_needed(req, 1000) == 0
    other = make_req("b", prompt_len=30)
    assert mgr.num_blocks_needed(other, 33) == 3
    assert mgr.num_blocks_needed(other, 1000) == 3  # capped at max_model_len 40


def test_config_errors_name_the_value():
    with pytest.raises(ConfigError, match="num_gpu_blocks.*1"):
        KVCacheManager(1, BS, True, 100)
    with pytest.raises(ConfigError, match="block_size.*0"):
        KVCacheManager(10, 0, True, 100)


def test_zero_new_tokens_rejected():
    mgr = KVCacheManager(10, BS, True, 100)
    with pytest.raises(ValueError):
        mgr.allocate_slots(make_req("a", prompt_len=5), 0)


# ---- failure changes nothing ----------------------------------------------------------------------------
def test_allocate_failure_returns_none_and_changes_nothing():
    mgr = KVCacheManager(8, BS, enable_caching=True, max_model_len=1024)  # 7 usable
    owner = make_req("owner", toks(0, 64))
    admit(mgr, owner)
    mgr.free(owner)  # 4 cached, free (ref 0) blocks
    filler = make_req("filler", prompt_len=40)
    assert len(mgr.allocate_slots(filler, 40)) == 3  # takes the never-used blocks 5,6,7 first
    assert mgr.num_free_blocks == 4
    big = make_req("big", toks(0, 64) + toks(5000, 40))  # hits 4 free blocks, then needs 3 more
    hits, hit_tokens = mgr.get_computed_blocks(big)
    assert hit_tokens == 64 and all(b.ref_cnt == 0 for b in hits)
    before = snapshot(mgr)
    # 4 hits (all evictable, so they count) + 3 new = 7 > 4 free
    assert mgr.allocate_slots(big, 40, hit_tokens, hits) is None
    assert snapshot(mgr) == before
    assert not mgr.holds(big)
    # a running request that cannot grow also changes nothing
    filler.num_computed_tokens = 40
    assert mgr.allocate_slots(filler, 1, num_lookahead_tokens=100) is None
    assert snapshot(mgr) == before
    mgr.check_invariants()


def test_hits_on_referenced_blocks_are_not_counted_as_allocations():
    mgr = KVCacheManager(7, BS, enable_caching=True, max_model_len=1024)  # 6 usable
    a = make_req("a", toks(0, 64), output_len=20)
    admit(mgr, a)  # 4 blocks, held
    assert mgr.num_free_blocks == 2
    b = make_req("b", toks(0, 64) + toks(900, 20))
    hits, hit_tokens = mgr.get_computed_blocks(b)
    assert hit_tokens == 64
    # 84 tokens -> 6 blocks; 4 are shared hits with ref 1, so 2 new blocks fit in 2 free
    new = mgr.allocate_slots(b, 20, hit_tokens, hits)
    assert new is not None and len(new) == 2
    assert [mgr.pool.blocks[i].ref_cnt for i in mgr.get_block_ids(a)] == [2, 2, 2, 2]
    mgr.check_invariants()
    mgr.free(a)
    assert mgr.num_free_blocks == 0  # still referenced by b
    mgr.free(b)
    assert mgr.num_free_blocks == 6
    mgr.check_invariants()


# ---- scheduler_reserve_full_isl ------------------------------------------------------------------------
def test_full_sequence_must_fit_checks_whole_sequence_but_allocates_one_chunk():
    mgr = KVCacheManager(11, BS, enable_caching=True, max_model_len=1024)  # 10 usable
    hog = make_req("hog", prompt_len=96)
    mgr.allocate_slots(hog, 96)  # 6 blocks, 4 free
    long = make_req("long", prompt_len=100)  # 7 blocks in all, the first chunk of 32 needs 2
    before = snapshot(mgr)
    assert mgr.allocate_slots(long, 32, full_sequence_must_fit=True) is None
    assert snapshot(mgr) == before
    got = mgr.allocate_slots(long, 32)  # without the gate the chunk fits
    assert got is not None and len(got) == 2
    mgr.free(long)
    mgr.free(hog)
    got = mgr.allocate_slots(long, 32, full_sequence_must_fit=True)
    assert len(got) == 2 and mgr.num_blocks_held(long) == 2  # only this chunk is allocated
    mgr.check_invariants()


def test_full_sequence_gate_counts_prefix_hits():
    mgr = KVCacheManager(8, BS, enable_caching=True, max_model_len=1024)  # 7 usable
    a = make_req("a", toks(0, 64), output_len=50)
    admit(mgr, a)  # 4 held
    b = make_req("b", toks(0, 64) + toks(700, 40))  # 104 tokens = 7 blocks, 4 hit (held by a)
    got, hit_tokens = admit(mgr, b, max_tokens=8, full_sequence_must_fit=True)
    assert hit_tokens == 64 and got is not None  # needs 3 more blocks for the full sequence: 3 free
    assert mgr.num_blocks_held(b) == 5  # 4 hits + 1 block for the 8-token chunk
    mgr.check_invariants()


# ---- same-step hits and preemption ---------------------------------------------------------------------
def test_blocks_registered_at_allocation_are_hit_in_the_same_step():
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", toks(0, 64))
    b = make_req("b", toks(0, 64))
    admit(mgr, a)  # a's prefill is scheduled this step, not computed yet (num_computed_tokens still 0)
    assert a.num_computed_tokens == 0
    hits, hit_tokens = mgr.get_computed_blocks(b)
    assert hit_tokens == 48 and [x.block_id for x in hits] == mgr.get_block_ids(a)[:3]
    assert mgr.allocate_slots(b, 16, hit_tokens, hits) is not None
    assert [mgr.pool.blocks[i].ref_cnt for i in mgr.get_block_ids(a)] == [2, 2, 2, 1]
    # b's own 4th block duplicates a's 4th: both registered, a's answers lookups
    assert mgr.pool.num_cached_blocks == 5 and mgr.pool.num_cached_hashes == 4
    mgr.check_invariants()


def test_chunked_prefill_registers_only_filled_blocks():
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", toks(0, 100))
    admit(mgr, a, max_tokens=40)  # blocks 0,1 full, block 2 half
    assert mgr.pool.num_cached_blocks == 2
    advance(a, 40)
    mgr.allocate_slots(a, 40)  # up to 80 tokens: 5 full
    assert mgr.pool.num_cached_blocks == 5
    mgr.check_invariants()


def test_tokens_beyond_the_sequence_get_slots_but_are_not_cached():
    """Draft tokens (num_new_tokens past num_tokens) are never registered: KV-4 caps at num_tokens."""
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", toks(0, 20))
    assert len(mgr.allocate_slots(a, 40)) == 3
    assert mgr.pool.num_cached_blocks == 1


@pytest.mark.parametrize("shares", [True, False])
def test_preempted_request_hits_its_own_blocks(shares: bool):
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    req = make_req("p", toks(0, 50) if shares else None, prompt_len=50, output_len=30)
    admit(mgr, req)
    advance(req, 50)  # prompt done, 1 output token: num_tokens 51
    for _ in range(20):  # decode to 70 computed, 71 tokens
        mgr.allocate_slots(req, 1)
        advance(req, 1)
    assert req.num_computed_tokens == 70 and req.num_tokens == 71
    old_ids = mgr.get_block_ids(req)
    mgr.free(req, preempted=True)
    req.num_computed_tokens = 0
    req.num_preemptions += 1
    hits, hit_tokens = mgr.get_computed_blocks(req)
    # vLLM registered full blocks up to 70 computed tokens at allocation: 4 blocks; cap (71-1)//16 = 4
    assert hit_tokens == 64 and [b.block_id for b in hits] == old_ids[:4]
    stats = mgr.prefix_cache_stats()
    assert stats["preempted_requests"] == 1 and stats["preempted_queries"] == 71
    assert stats["preempted_hits"] == 64
    assert stats["requests"] == 1 and stats["queries"] == 50 and stats["hits"] == 0  # not both
    assert mgr.allocate_slots(req, 71 - 64, hit_tokens, hits) is not None
    mgr.check_invariants()


def test_victim_already_scheduled_this_step_keeps_blocks_registered_at_allocation():
    """A preempted non-sharing request registers what vLLM registered when allocating, not less."""
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    req = make_req("v", prompt_len=64)
    mgr.allocate_slots(req, 40)  # vLLM registers 2 blocks here
    advance(req, 40)
    mgr.allocate_slots(req, 24)  # registers blocks 3,4 -- then preempted before the step runs
    mgr.free(req, preempted=True)
    req.num_computed_tokens = 0
    req.num_preemptions += 1
    assert mgr.pool.num_cached_blocks == 4
    assert mgr.get_computed_blocks(req)[1] == 48  # cap (64 - 1) // 16 = 3 blocks


# ---- hashing shortcut ----------------------------------------------------------------------------------
def test_non_sharing_requests_are_never_hashed():
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", prompt_len=70, output_len=40)
    assert not a.spec.shares_content
    assert mgr.get_computed_blocks(a) == ([], 0)
    mgr.allocate_slots(a, 70)
    advance(a, 70)
    for _ in range(30):
        mgr.allocate_slots(a, 1)
        advance(a, 1)
    mgr.free(a)  # finished, not preempted
    again = make_req("a2", prompt_len=70)
    mgr.get_computed_blocks(again)
    assert a._hashes == [] and again._hashes == []
    assert mgr.pool.num_cached_blocks == 0
    assert mgr.prefix_cache_stats()["queries"] == 140  # still counted (KV-8)
    mgr.check_invariants()


@pytest.mark.parametrize("preempted", [False, True])
def test_non_sharing_request_is_freed_in_the_order_of_a_hashed_one(preempted: bool):
    """vLLM 0.33 frees hashed blocks to the back of the queue and unhashed ones to the front; the shortcut
    places the blocks vLLM would have hashed as if they were (bench/vllm_diff.py, content="unique")."""
    order = {}
    for shares in (True, False):
        mgr = KVCacheManager(12, BS, enable_caching=True, max_model_len=1024)  # blocks 1..11
        r = make_req("r", toks(0, 40) if shares else None, prompt_len=40)
        admit(mgr, r)  # blocks 1, 2 full, 3 partial
        mgr.free(r, preempted=preempted)
        order[shares] = mgr.pool.free_block_ids()
        mgr.check_invariants()
    assert order[True] == order[False] == [3, *range(4, 12), 2, 1]


def test_decode_inside_a_block_does_not_hash():
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    # an output a later request can repeat (its key named): its blocks are registered as they fill
    req = CountingRequest(RequestSpec(request_id="c", arrival_time=0, prompt_len=20, output_len=40,
                                      token_ids=toks(0, 20), output_key=("out", "c")))
    mgr.allocate_slots(req, 20)
    advance(req, 20)
    calls = req.__dict__.get("calls", 0)
    assert calls == 1  # one full block registered
    for _ in range(11):  # computed 20 -> 31: no block fills
        mgr.allocate_slots(req, 1)
        advance(req, 1)
    assert req.__dict__.get("calls", 0) == calls
    mgr.allocate_slots(req, 1)  # token 32 fills block 2
    assert req.__dict__["calls"] == calls + 1
    assert mgr.pool.num_cached_blocks == 2


def test_caching_disabled_no_hits_no_stats():
    mgr = KVCacheManager(32, BS, enable_caching=False, max_model_len=1024)
    a = make_req("a", toks(0, 64))
    admit(mgr, a)
    mgr.free(a, preempted=True)
    b = make_req("b", toks(0, 64))
    assert mgr.get_computed_blocks(b) == ([], 0)
    assert mgr.pool.num_cached_blocks == 0
    assert mgr.prefix_cache_stats()["requests"] == 0 and mgr.hit_rate == 0.0


def test_stats_count_every_lookup_and_hit_rate():
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", toks(0, 48))
    admit(mgr, a)
    b = make_req("b", toks(0, 48))
    mgr.get_computed_blocks(b)  # blocked at the head of the queue: counted each time (KV-8)
    mgr.get_computed_blocks(b)
    s = mgr.prefix_cache_stats()
    assert (s["requests"], s["queries"], s["hits"]) == (3, 144, 64)
    assert mgr.hit_rate == pytest.approx(64 / 144)


def test_stats_recorded_at_admission_only_with_record_false():
    """vLLM 0.33 counts a lookup only when the request is admitted (the vllm policy does this)."""
    mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
    a = make_req("a", toks(0, 48))
    admit(mgr, a)
    b = make_req("b", toks(0, 48))
    for _ in range(3):
        hits, hit_tokens = mgr.get_computed_blocks(b, record=False)  # blocked: not counted
    assert mgr.prefix_cache_stats()["requests"] == 1
    mgr.record_prefix_cache_stats(b, hit_tokens)
    s = mgr.prefix_cache_stats()
    assert (s["requests"], s["queries"], s["hits"]) == (2, 96, 32)


# ---- stateful property test ----------------------------------------------------------------------------
PREFIXES = [toks(10_000 * (g + 1), 80) for g in range(3)]


class ManagerMachine(RuleBasedStateMachine):
    """A random scheduler: admit (with prefix hits), grow, preempt and finish requests."""

    def __init__(self) -> None:
        super().__init__()
        self.mgr = KVCacheManager(14, 4, enable_caching=True, max_model_len=96)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.n = 0

    @rule(group=st.integers(-1, 2), shared=st.integers(0, 80), tail=st.integers(1, 12),
          out=st.integers(1, 10))
    def new_request(self, group: int, shared: int, tail: int, out: int) -> None:
        self.n += 1
        rid = f"r{self.n}"
        if group < 0:  # unique content: the hashing shortcut path
            req = make_req(rid, prompt_len=tail + shared % 20, output_len=out)
        else:
            req = make_req(rid, PREFIXES[group][:shared] + toks(100 * self.n, tail), output_len=out)
        self.waiting.append(req)

    def _try(self, req: Request, fn):
        before = snapshot(self.mgr)
        got = fn()
        if got is None:
            after = snapshot(self.mgr)
            assert after[:5] == before[:5]  # nothing changed (stats may count the lookup)
        return got

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 50), chunk=st.integers(1, 40), full=st.booleans())
    def admit(self, i: int, chunk: int, full: bool) -> None:
        req = self.waiting[i % len(self.waiting)]
        hits, hit_tokens = self.mgr.get_computed_blocks(req)
        assert hit_tokens % 4 == 0 and hit_tokens < req.num_tokens
        n = min(req.num_tokens - hit_tokens, chunk)
        got = self._try(req, lambda: self.mgr.allocate_slots(req, n, hit_tokens, hits,
                                                             full_sequence_must_fit=full))
        if got is None:
            return
        req.num_computed_tokens = hit_tokens
        advance(req, n)
        self.waiting.remove(req)
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50), chunk=st.integers(1, 40), lookahead=st.integers(0, 3))
    def step(self, i: int, chunk: int, lookahead: int) -> None:
        req = self.running[i % len(self.running)]
        if req.num_output_tokens >= req.output_len:
            self.mgr.free(req)
            self.running.remove(req)
            return
        n = min(req.num_tokens - req.num_computed_tokens, chunk)
        got = self._try(req, lambda: self.mgr.allocate_slots(req, n, num_lookahead_tokens=lookahead))
        if got is not None:
            advance(req, n)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50))
    def preempt(self, i: int) -> None:
        req = self.running.pop(i % len(self.running))
        self.mgr.free(req, preempted=True)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.insert(0, req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 50))
    def finish(self, i: int) -> None:
        self.mgr.free(self.running.pop(i % len(self.running)))

    @invariant()
    def consistent(self) -> None:
        mgr = self.mgr
        mgr.check_invariants()  # pool invariants, ref_cnt == holders, free + held == usable
        held: set[int] = set()
        for req in self.running:
            ids = mgr.get_block_ids(req)
            assert 0 not in ids
            assert len(ids) * 4 >= min(req.num_computed_tokens, 96)
            held.update(ids)
        for req in self.waiting:
            assert not mgr.holds(req)
        assert mgr.num_free_blocks + len(held) == mgr.usable_blocks
        assert all(b.ref_cnt >= 0 for b in mgr.pool.blocks)


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


def test_private_part_is_counted_cached_but_never_hashed_until_a_preemption():
    """Past ``hash_end`` a request's blocks hold content nobody else has (token ids' output, a generated
    shared-prefix request's own part): never hashed while it runs, placed in the free queue as registered
    blocks would be, and registered when a preemption frees them so the resume hits them (KV-7)."""
    def run(private_from: int | None, preempted: bool) -> tuple[list[int], int, int, int]:
        mgr = KVCacheManager(32, BS, enable_caching=True, max_model_len=1024)
        req = CountingRequest(RequestSpec(request_id="c", arrival_time=0, prompt_len=40, output_len=40,
                                          segments=((("g", 0), 20), (("u", "c"), 20)), private_from=private_from))
        assert mgr.get_computed_blocks(req) == ([], 0)
        mgr.allocate_slots(req, 40)
        advance(req, 40)
        for _ in range(10):  # computed 40 -> 50: the third block (32..48) fills
            mgr.allocate_slots(req, 1)
            advance(req, 1)
        hashed_while_running = mgr.pool.num_cached_blocks
        mgr.free(req, preempted=preempted)
        mgr.check_invariants()
        again = CountingRequest(req.spec)
        if preempted:  # the resume: its prompt and what it generated
            again.num_preemptions, again.num_tokens = 1, req.num_tokens
        hit = mgr.get_computed_blocks(again)[1]
        return mgr.pool.free_block_ids(), hashed_while_running, mgr.pool.num_cached_blocks, hit

    order_all, hashed_all, cached_all, hit_all = run(None, False)  # every block may be shared
    order_own, hashed_own, cached_own, hit_own = run(16, False)  # own past token 16
    assert (hashed_all, cached_all, hit_all) == (3, 3, 32)  # blocks 0..2 registered; a lookup stops at 39
    assert (hashed_own, cached_own, hit_own) == (1, 1, 16)  # block 0 alone lies within hash_end
    assert order_own == order_all  # the same free queue: unregistered own blocks join the back too
    order_pre, hashed_pre, cached_pre, hit_pre = run(16, True)
    assert (hashed_pre, cached_pre, hit_pre) == (1, 3, 48)  # the preemption registered the rest for the resume
    assert order_pre == order_all
