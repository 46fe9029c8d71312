"""Decode runs: the block count of a run, bulk slot allocation, and engine runs that go on past finishes.

``KVCacheManager.decode_run_blocks`` predicts the blocks a run takes; ``grow_decodes`` and
``allocate_slots``'s O(1) decode path must leave exactly the state its general path leaves; and an
engine with fast-forward must produce the same timestamps and step rows as one without it, while
calling the scheduler far less often (open arrivals: runs continue past finishes; closed loop: a run
stops at the first finish, since the finish brings the next arrival).
"""

from __future__ import annotations

import bisect
import random

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import make_policy
from sim.core.request import Request, RequestSpec
from sim.cost.costmodel import ConstantCostModel
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import ClosedSource, OpenSource
from sim.kv import KVCacheManager
from tests.helpers import limits


# ---- a. decode_run_blocks ---------------------------------------------------------------------------
def brute_force_run_blocks(c, held, fin, k, bs) -> np.ndarray:
    """out[s] = sum_i max(0, ceil((c_i + min(s, f_i)) / bs) - held_i), for s = 0..k."""
    out = np.zeros(k + 1, dtype=np.int64)
    for s in range(k + 1):
        out[s] = sum(
            max(0, -(-(ci + min(s, fi)) // bs) - hi) for ci, hi, fi in zip(c, held, fin, strict=True)
        )
    return out


rows_st = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 3), st.integers(1, 120)),  # computed, extra held, finish
    min_size=0,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(rows=rows_st, bs=st.integers(1, 32), k=st.integers(1, 150))
def test_decode_run_blocks_matches_brute_force(rows, bs, k):
    kv = KVCacheManager(num_gpu_blocks=2, block_size=bs, enable_caching=False, max_model_len=10**6)
    c = [r[0] for r in rows]
    held = [-(-r[0] // bs) + r[1] for r in rows]  # held >= ceil(c / bs)
    fin = [r[2] for r in rows]
    got = kv.decode_run_blocks(c, held, fin, k)
    want = brute_force_run_blocks(c, held, fin, k, bs)
    assert isinstance(got, list) and len(got) == k + 1
    assert got == want.tolist()


def test_decode_run_blocks_small_cases():
    kv = KVCacheManager(num_gpu_blocks=2, block_size=4, enable_caching=False, max_model_len=1024)
    # One row at 4 computed tokens holding 1 block: steps 1..4 need a second block at step 1, a third at 5.
    assert kv.decode_run_blocks([4], [1], [10], 6) == [0, 1, 1, 1, 1, 2, 2]
    # Mid-block row holding a spare block: nothing until slot 9 (step 6), and it finishes at step 5.
    assert kv.decode_run_blocks([3], [2], [5], 8) == [0] * 9
    # No rows at all.
    assert kv.decode_run_blocks([], [], [], 3) == [0] * 4
    # A row holding fewer blocks than its tokens need is refused (its slots would be wrong).
    with pytest.raises(ValueError, match="holds 0 blocks for 40 tokens"):
        kv.decode_run_blocks([40], [0], [5], 5)


# ---- b. grow_decodes / allocate_slots' O(1) path against the general path -----------------------------
def _spec(rng: random.Random, i: int, bs: int) -> RequestSpec:
    """Unique, shared-prefix, or wholly duplicated content (prompt and output: decode blocks are shared)."""
    kind = rng.choice(["unique", "unique", "prefix", "dup"])
    rid = f"r{i}"
    if kind == "unique":
        return RequestSpec(rid, 0.0, rng.randint(1, 40), 10**6)
    if kind == "prefix":
        g, lp, lu = rng.randint(0, 2), rng.choice([bs, 2 * bs, 5, 17]), rng.randint(1, 20)
        return RequestSpec(rid, 0.0, lp + lu, 10**6, segments=((("sys", g), lp), (("u", rid), lu)))
    g = rng.randint(0, 1)
    length = [2 * bs, 13][g]  # a multiple of bs: the KV-5 cap leaves the last block to be filled again
    return RequestSpec(rid, 0.0, length, 10**6, segments=((("dup", g), length),), output_key=("out", g))


def _state(kv: KVCacheManager, reqs: list[Request]) -> tuple:
    kv.check_invariants()
    return (
        tuple((r.request_id, tuple(kv.get_block_ids(r))) for r in reqs),
        tuple(kv._reqs[r.request_id].num_cached if kv.holds(r) else None for r in reqs),
        tuple(kv.pool.free_block_ids()),
        kv.num_cached_free_blocks,
        kv.pool.num_cached_blocks,
        kv.pool.num_cached_hashes,
        tuple((r.num_computed_tokens, r.num_tokens, r.num_output_tokens) for r in reqs),
        # which block answers each hash, and the order of the duplicates behind it (not the map's order:
        # nothing iterates it)
        tuple(sorted((h, tuple(e) if isinstance(e, dict) else (e.block_id,)) for h, e in kv.pool._cached.items())),
    )


def drive(
    mode: str, seed: int, bs: int, caching: bool, num_blocks: int, max_len: int, ops: int = 120
) -> list:
    """A random life of a KV manager: admissions (with prefix hits), decode steps, decode runs, finishes,
    preemptions (which register unique content) and resumes. Decode slots come from:

    - ``ref``: the manager's general path (``_allocate``) per row, for a step and for a run;
    - ``fast``: ``allocate_slots(req, 1)`` per row (its O(1) path), and ``grow_decodes`` for a run.

    Every mode draws the same random numbers, so the states must agree after every operation.
    """
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, bs, caching, max_len)
    every: list[Request] = []
    running: list[Request] = []
    waiting: list[Request] = []
    trace: list = []

    def preempt(req: Request) -> None:
        running.remove(req)
        kv.free(req, preempted=True)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        waiting.append(req)

    def sample(req: Request, m: int = 1) -> None:
        req.num_output_tokens += m
        req.num_tokens += m

    for _ in range(ops):
        op = rng.choice(["admit", "admit", "decode", "decode", "run", "run", "finish", "preempt", "reset"])
        note: object = None
        if op == "admit":
            if waiting and rng.random() < 0.5:
                req = waiting[0]
            else:
                req = Request(_spec(rng, len(every), bs))
                every.append(req)
                waiting.append(req)
            if req.num_tokens >= max_len:
                waiting.remove(req)
                continue
            hits, hit_tokens = kv.get_computed_blocks(req)
            new = kv.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hits)
            note = None if new is None else (len(new), hit_tokens)
            if new is not None:
                waiting.remove(req)
                running.append(req)
                req.num_computed_tokens = req.num_tokens
                sample(req)
        elif op == "decode" and running:
            n = len(running)
            start = rng.choice([0, 0, rng.randint(0, n)])
            stop = rng.choice([n, n, rng.randint(start, n)])
            alloc = kv._allocate if mode == "ref" else kv.allocate_slots
            got = stop
            for i in range(start, stop):
                if alloc(running[i], 1) is None:
                    got = i
                    break
            note = got
            rows = running[start:got]
            failed = running[got] if got < stop else None
            for req in rows:
                req.num_computed_tokens += 1
                sample(req)
            if failed is not None:
                trace.append(("failed row", got, _state(kv, every)))  # the failing row changed nothing
                preempt(failed)
        elif op == "run" and running:
            k = rng.randint(1, 3 * bs + 2)
            k = min(k, *(max_len - r.num_tokens for r in running))
            c = [r.num_computed_tokens for r in running]
            held = kv.num_blocks_held_rows(running)
            cum = kv.decode_run_blocks(c, held, [k] * len(running), k)
            if cum[k] > kv.num_free_blocks:
                k = bisect.bisect_right(cum, kv.num_free_blocks) - 1
            if k >= 1:
                free0 = kv.num_free_blocks
                for req in running:  # as fastforward.apply_run: tokens first, then the slots
                    sample(req, k - 1)
                if mode == "ref":
                    for req in running:
                        assert kv._allocate(req, k) is not None
                else:
                    kv.grow_decodes(running, k)
                assert free0 - kv.num_free_blocks == cum[k]  # the prediction is the pop count
                for req in running:
                    req.num_computed_tokens += k
                    sample(req)
            note = k
        elif op == "finish" and running:
            req = running.pop(rng.randrange(len(running)))
            kv.free(req)
        elif op == "preempt" and running:
            preempt(running[rng.randrange(len(running))])
        elif op == "reset":
            note = kv.reset_prefix_cache()
        for req in [r for r in running if r.num_tokens >= max_len]:
            running.remove(req)
            kv.free(req)
        trace.append((op, note, _state(kv, every)))
    return trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    bs=st.sampled_from([1, 2, 3, 4, 8, 16]),
    caching=st.booleans(),
    num_blocks=st.integers(6, 90),
    max_len=st.sampled_from([48, 4096]),
)
def test_bulk_decode_allocation_equals_row_by_row(seed, bs, caching, num_blocks, max_len):
    ref = drive("ref", seed, bs, caching, num_blocks, max_len)
    got = drive("fast", seed, bs, caching, num_blocks, max_len)
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a == b, f"first difference at operation {i} ({b[0]})"


def test_the_driver_reaches_the_interesting_cases():
    """Guard against a driver that silently stopped exercising runs, failures and shared content."""
    failed = runs = registered = hits = 0
    for seed in range(30):
        trace = drive("fast", seed, bs=[1, 2, 4][seed % 3], caching=True, num_blocks=40, max_len=4096)
        failed += sum(1 for t in trace if t[0] == "failed row")
        runs += sum(1 for t in trace if t[0] == "run" and t[1] and t[1] > 1)
        for prev, t in zip(trace, trace[1:], strict=False):
            if t[0] == "run" and t[2][4] > prev[2][4]:
                registered += 1  # a run registered decode blocks of shared content
            if t[0] == "admit" and t[1] and t[1][1] > 0:
                hits += 1  # an admission with a prefix hit
    assert failed >= 10 and runs >= 100 and registered >= 10 and hits >= 10, (failed, runs, registered, hits)


def _manager_with_rows(bs: int, caching: bool, num_blocks: int, prompts: list[int], shared: set[int]):
    """Rows admitted one after another (whole prompt), each with its first token sampled."""
    kv = KVCacheManager(num_blocks, bs, caching, 4096)
    reqs = []
    for i, p in enumerate(prompts):
        segs = ((("s", i), p),) if i in shared else None
        req = Request(RequestSpec(f"q{i}", 0.0, p, 1000, segments=segs))
        hits, ht = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, p - ht, ht, hits) is not None
        req.num_computed_tokens = p
        req.num_output_tokens, req.num_tokens = 1, p + 1
        reqs.append(req)
    return kv, reqs


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("shared_row", [None, 2, 3])
def test_decode_slots_fail_at_the_first_row_that_cannot_get_one(caching, shared_row):
    """Rows at a block boundary each need a block; with 2 free blocks the third such row fails and
    changes nothing, the rows after it are untouched, and the O(1) path's state equals the general
    path's up to the failure."""
    bs = 4
    prompts = [8, 5, 4, 12, 6, 16]  # computed 8, 5, 4, 12, 6, 16: rows 0, 2, 3, 5 sit on a boundary
    shared = {shared_row} if shared_row is not None else set()
    used = sum(-(-p // bs) for p in prompts)
    states = []
    for mode in ("fast", "ref", "stretch"):
        kv, reqs = _manager_with_rows(bs, caching, used + 1 + 2, prompts, shared)
        assert kv.num_free_blocks == 2
        before = [kv.get_block_ids(r) for r in reqs]
        if mode == "stretch":  # sim/kv/rows.py: the same O(1) path for a stretch of rows in one call
            got = kv.allocate_decode_slots(reqs)
        else:
            alloc = kv.allocate_slots if mode == "fast" else kv._allocate
            got = next((i for i, r in enumerate(reqs) if alloc(r, 1) is None), len(reqs))
        assert got == 3
        assert [kv.get_block_ids(r) for r in reqs[3:]] == before[3:]
        assert [len(kv.get_block_ids(r)) for r in reqs[:3]] == [3, 2, 2]
        assert kv.num_free_blocks == 0
        states.append(_state(kv, reqs))
    assert states[0] == states[1] == states[2]
    # With no free block at all, rows off a block boundary still get their slot; the others fail.
    kv, reqs = _manager_with_rows(bs, caching, used + 1, prompts, shared)
    assert [kv.allocate_slots(r, 1) is not None for r in reqs] == [False, True, False, False, True, False]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 9, 17])
def test_grow_decodes_equals_row_by_row_allocate_slots(caching, k):
    """Mixed shared and unique rows at every offset in a block: one bulk pop keeps the row order."""
    bs = 4
    prompts = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13]
    shared = {1, 4, 7, 8}
    states = []
    for mode in ("bulk", "ref"):
        kv, reqs = _manager_with_rows(bs, caching, 200, prompts, shared)
        for r in reqs:
            r.num_output_tokens += k - 1
            r.num_tokens += k - 1
        if mode == "bulk":
            kv.grow_decodes(reqs, k)
        else:
            for r in reqs:
                assert kv.allocate_slots(r, k) is not None
        states.append(_state(kv, reqs))
    assert states[0] == states[1]


def test_grow_decodes_refuses_a_run_the_pool_cannot_hold():
    kv, reqs = _manager_with_rows(4, False, 4, [4, 4], set())  # 3 usable blocks, 2 held
    with pytest.raises(RuntimeError):
        kv.grow_decodes(reqs, 1)  # each row needs a block, one is free


# ---- c. engine: fast-forwarded runs stay exact ---------------------------------------------------------
class _Counting(Recorder):
    """A recorder (with the step trace) that also records each decode run it is told of (steps, earliest
    finish step) and the requests waiting then; ``schedules``: the engine's count of policy.schedule
    calls, set after the run. (The fast-forward is compiled: a patched module function would not be seen.)"""

    def __init__(self, policy) -> None:
        super().__init__(trace=True)
        self.policy = policy
        self.schedules = 0
        self.runs: list[tuple[int, int]] = []
        self.waiting: list[int] = []  # requests waiting while each run was applied

    def on_decode_run(self, run, starts, *args, **kwargs) -> None:
        self.runs.append((len(starts), min(run.finish_step)))
        self.waiting.append(self.policy.num_waiting)
        super().on_decode_run(run, starts, *args, **kwargs)


def _engine_run(source, fast_forward: bool, cost=None, horizon=None, policy="vllm", **lim):
    env = simpy.Environment()
    pol = make_policy(policy, limits(**lim))
    rec = counter = _Counting(pol)
    cost = cost or ConstantCostModel(step_s=0.05, per_token_s=2e-4)  # step time grows with the rows
    eng = Engine(env, pol, cost, source, rec, horizon, fast_forward)
    env.run()
    counter.schedules = eng.num_schedules
    return eng, rec, counter


STEP_COLUMNS = ["num_free_blocks", "num_cached_blocks", "num_running", "num_finished"]


def _assert_exact(slow, fast) -> None:
    (es, rs, _), (ef, rf, _) = slow, fast
    a = sorted(es.requests, key=lambda r: r.request_id)
    b = sorted(ef.requests, key=lambda r: r.request_id)
    assert [r.request_id for r in a] == [r.request_id for r in b]
    assert [r.status for r in a] == [r.status for r in b]

    def times(reqs, attr):
        return np.array([np.nan if getattr(r, attr) is None else getattr(r, attr) for r in reqs])

    for attr in ("first_token_time", "finish_time"):
        assert np.allclose(times(a, attr), times(b, attr), rtol=1e-9, atol=0, equal_nan=True), attr
    assert [r.num_output_tokens for r in a] == [r.num_output_tokens for r in b]
    assert [r.num_preemptions for r in a] == [r.num_preemptions for r in b]
    assert es.env.now == pytest.approx(ef.env.now, rel=1e-9)
    assert es.policy.kv.prefix_cache_stats() == ef.policy.kv.prefix_cache_stats()
    s, f = rs.steps_frame(), rf.steps_frame()
    assert len(s) == len(f)
    for col in STEP_COLUMNS:
        assert s[col].tolist() == f[col].tolist(), col
    for col in ["num_waiting", "num_prefill_tokens", "num_decode_tokens", "num_preempted"]:
        assert s[col].tolist() == f[col].tolist(), col
    for col in ["start", "duration", "kv_usage"]:
        assert np.allclose(s[col], f[col], rtol=1e-9, atol=1e-12), col
    # Inter-token gaps: same count and same total.
    vs, ws = rs.itl()
    vf, wf = rf.itl()
    assert ws.sum() == wf.sum()
    assert np.isclose(np.repeat(vs, ws).sum(), np.repeat(vf, wf).sum(), rtol=1e-9)
    # The step trace, entry by entry (scheduled rows in order, finishes, free blocks).
    assert len(rs.trace) == len(rf.trace)
    for x, y in zip(rs.trace, rf.trace, strict=True):
        for key in ("scheduled", "preempted", "finished", "num_running", "num_waiting", "num_free_blocks"):
            assert x[key] == y[key], (key, x, y)
        assert np.isclose(x["time"], y["time"], rtol=1e-9, atol=0)


def _open_specs(seed: int, n: int, gap: float, shared: bool) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(gap, n))
    prompts = rng.integers(5, 300, n)
    outputs = rng.integers(1, 400, n)
    specs = []
    for i in range(n):
        segs = None
        if shared and i % 2:
            p = int(prompts[i])
            head = min(p, 64)
            segs = ((("sys", i % 3), head),) + (((("u", i), p - head),) if p > head else ())
        specs.append(RequestSpec(f"r{i:03d}", float(t[i]), int(prompts[i]), int(outputs[i]), segments=segs))
    return specs


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_num_seqs=64),
        dict(max_num_seqs=64, enable_prefix_caching=False),
        dict(max_num_seqs=64, block_size=4, num_gpu_blocks=3000),
        dict(max_num_seqs=64, shared=True),
        # KV pressure: runs are cut where the free blocks run out, and requests get preempted.
        dict(max_num_seqs=64, block_size=4, num_gpu_blocks=900, pressured="preempts"),
        # Rows that end at max_model_len inside a run; prompts at or past it are rejected.
        dict(max_num_seqs=64, max_model_len=320),
        # A full batch: requests wait, so a run must stop at the first finish (it frees a seat).
        dict(max_num_seqs=3, pressured=True),
        # A horizon cuts the last run and leaves requests in flight.
        dict(max_num_seqs=64, horizon=77.7, pressured=True),
    ],
)
def test_open_arrival_runs_go_past_finishes_and_stay_exact(kw):
    kw = dict(kw)
    shared = kw.pop("shared", False)
    pressured = kw.pop("pressured", False)
    horizon = kw.pop("horizon", None)
    n = 120
    specs = _open_specs(11, n, gap=1.2, shared=shared)
    slow = _engine_run(OpenSource(specs), False, horizon=horizon, **kw)
    fast = _engine_run(OpenSource(specs), True, horizon=horizon, **kw)
    _assert_exact(slow, fast)
    counter = fast[2]
    assert slow[2].runs == []  # without fast-forward every step is scheduled
    assert slow[2].schedules == len(slow[1].steps_frame())
    # With requests waiting, a finish may let one in: the run must end at the first finish.
    blocked = [(k, ff) for (k, ff), w in zip(counter.runs, counter.waiting, strict=True) if w]
    assert all(k <= ff for k, ff in blocked), blocked[:5]
    if kw.get("max_num_seqs") == 3:
        assert len(blocked) >= 10
    if pressured:  # the batch or the pool, not the arrivals, limits the runs here
        if pressured == "preempts":
            assert slow[1].steps_frame()["num_preempted"].sum() > 0
        return
    # Each arrival needs a schedule call; finishes inside runs need none.
    assert counter.schedules < 0.75 * (n + n), (counter.schedules, n)
    past = sum(1 for k, first_finish in counter.runs if k > first_finish)
    assert past >= 5, f"only {past} runs continued past a finish: {counter.runs[:20]}"


class _ClosedWorkload:
    """A closed loop: ``num_clients`` clients, each sends again ``think_time`` after its answer."""

    def __init__(self, num_clients: int, num_requests: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.num_clients, self.num_requests = num_clients, num_requests
        self.prompts = rng.integers(5, 200, num_requests).tolist()
        self.outputs = rng.integers(1, 150, num_requests).tolist()
        self.thinks = rng.exponential(2.0, num_requests).tolist()

    def spec(self, index: int, client: int, arrival_time: float) -> RequestSpec:
        return RequestSpec(f"c{index:03d}", arrival_time, self.prompts[index], self.outputs[index])

    def think_time(self, index: int) -> float:
        return self.thinks[index]


def test_arrivals_exactly_at_step_starts_join_that_step():
    """Steps of 0.25 s and arrivals on the same grid (exact binary fractions): an arrival at a step's
    start joins that step, so a run must end before any step that starts at an arrival time."""
    specs = _open_specs(3, 100, gap=1.2, shared=False)
    specs = [
        RequestSpec(s.request_id, round(s.arrival_time * 4) / 4, s.prompt_len, s.output_len) for s in specs
    ]
    cost = ConstantCostModel(step_s=0.25)
    slow = _engine_run(OpenSource(specs), False, cost=cost, max_num_seqs=64)
    fast = _engine_run(OpenSource(specs), True, cost=cost, max_num_seqs=64)
    _assert_exact(slow, fast)
    starts = set(slow[1].steps_frame()["start"].tolist())
    assert sum(s.arrival_time in starts for s in specs) >= 20  # the case really occurs
    assert len(fast[2].runs) >= 20


@pytest.mark.parametrize("clients", [1, 3, 8])
@pytest.mark.parametrize("think_scale", [0.0, 1.0])
def test_closed_loop_runs_end_before_the_arrivals_their_finishes_cause(clients, think_scale):
    """A closed-loop client sends again a think time after its answer (ClosedSource.response_delay), so a
    run may pass a finish whose next send comes after the run; with no think time it stops at the first
    finish. Exact either way."""
    n = 80

    def source():
        w = _ClosedWorkload(clients, n, seed=5)
        w.thinks = [t * think_scale for t in w.thinks]
        return ClosedSource(w)

    slow = _engine_run(source(), False, max_num_seqs=64)
    fast = _engine_run(source(), True, max_num_seqs=64)
    assert len(slow[0].requests) == len(fast[0].requests) == n
    _assert_exact(slow, fast)
    runs = fast[2].runs
    assert len(runs) >= 10
    past = [r for r in runs if r[0] > r[1]]
    if think_scale == 0.0:
        assert not past, past[:5]
    elif clients > 1:  # (one client: its finish ends the run, nothing runs past it)
        assert past, "no run went past a finish"
    assert fast[2].schedules < slow[2].schedules / 3


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("k", [1, 3, 4, 9])
def test_grow_decodes_with_explicit_counts_equals_advancing_the_requests(caching, k):
    """``computed=``: the caller advances the counters later; the manager must take the same blocks
    and count the same cached blocks as when the requests are current."""
    bs = 4
    prompts = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13]
    lazy_kv, lazy = _manager_with_rows(bs, caching, 200, prompts, set())
    lazy_kv.grow_decodes(lazy, k, computed=[r.num_computed_tokens for r in lazy])
    kv, reqs = _manager_with_rows(bs, caching, 200, prompts, set())
    for r in reqs:
        r.num_output_tokens += k - 1
        r.num_tokens += k - 1
    kv.grow_decodes(reqs, k)
    assert [lazy_kv.get_block_ids(r) for r in lazy] == [kv.get_block_ids(r) for r in reqs]
    assert [lazy_kv._reqs[r.request_id].num_cached for r in lazy] == [kv._reqs[r.request_id].num_cached
                                                                     for r in reqs]
    assert lazy_kv.pool.free_block_ids() == kv.pool.free_block_ids()


def test_grow_decodes_with_explicit_counts_refuses_hashed_rows():
    kv, reqs = _manager_with_rows(4, True, 200, [4, 8], {1})  # row 1 has shared (hashed) content
    with pytest.raises(ValueError, match="unhashed"):
        kv.grow_decodes(reqs, 4, computed=[r.num_computed_tokens for r in reqs])


def _duplicate_content_specs(seed: int) -> tuple[list[RequestSpec], dict]:
    """Requests with identical prompts and outputs (and continuations of those outputs), shared system
    heads and unique ones, small pools, priorities: rows with the same content complete blocks of the
    same hash inside one decode run (found by a review: the order they register in is observable)."""
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    max_len = rng.choice([128, 512])
    lim = dict(max_num_seqs=rng.choice([4, 16, 64]), max_num_batched_tokens=rng.choice([64, 512]),
               max_model_len=max_len, block_size=bs,
               num_gpu_blocks=rng.choice([max_len // bs + 3, 2 * max_len // bs, 4 * max_len // bs]),
               enable_prefix_caching=True, enable_chunked_prefill=True)
    if rng.random() < 0.3:
        lim["scheduling_policy"] = "priority"
    specs, t = [], 0.0
    for i in range(rng.randint(5, 40)):
        t += rng.expovariate(1 / rng.choice([0.5, 5.0, 20.0]))
        kind, out = rng.random(), rng.randint(1, max_len // 2)
        if kind < 0.5:
            g = rng.randint(0, 1)
            p = [3 * bs + 1, 7 * bs][g]
            segs, okey = ((("dup", g), p),), ("out", g)
            if rng.random() < 0.4:  # a continuation: the prompt repeats the duplicated output so far
                extra = rng.randint(1, 40)
                segs, p, okey = segs + ((("out", g), extra),), p + extra, ("cont", i)
        elif kind < 0.8:
            p = rng.randint(1, max_len // 3)
            head = min(p, 2 * bs)
            segs, okey = ((("sys", i % 2), head),) + (((("u", i), p - head),) if p > head else ()), None
        else:
            p, segs, okey = rng.randint(1, max_len // 3), None, None
        prio = rng.randint(0, 2) if lim.get("scheduling_policy") == "priority" else 0
        specs.append(RequestSpec(f"r{i:04d}", t, p, out, priority=prio, segments=segs, output_key=okey))
    return specs, lim


@pytest.mark.parametrize("seed", [1184, *range(1, 25)])
def test_identical_content_in_one_run_registers_blocks_as_step_by_step(seed):
    """Seed 1184 failed before rows with hashed content grew step by step inside a run: a later
    admission saw a different block first in the hash map and started at a different step."""
    specs, lim = _duplicate_content_specs(seed)
    cost = ConstantCostModel(step_s=0.25, per_token_s=0.0)
    slow = _engine_run(OpenSource(specs), False, cost=cost, **lim)
    fast = _engine_run(OpenSource(specs), True, cost=cost, **lim)
    _assert_exact(slow, fast)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("max_num_seqs", [2, 64])
def test_vllm_v0_head_blocked_by_the_budget_is_tried_again(seed, max_num_seqs):
    """V0 with chunked prefill and a small budget: a head blocked because a prompt chunk used the
    budget fits in the next step, when that prompt has become a decode; with a full batch, each step's
    lookup counts in V0's prefix-cache stats. A decode run must skip neither (found by a review)."""
    specs = _open_specs(seed, 50, 1.0, shared=True)
    lim = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=16, max_model_len=512, block_size=16,
               num_gpu_blocks=5000, enable_prefix_caching=True, enable_chunked_prefill=True)
    cost = ConstantCostModel(step_s=0.25, per_token_s=0.0)
    slow = _engine_run(OpenSource(specs), False, cost=cost, policy="vllm-v0", **lim)
    fast = _engine_run(OpenSource(specs), True, cost=cost, policy="vllm-v0", **lim)
    _assert_exact(slow, fast)


@pytest.mark.parametrize("seed", range(6))
def test_sarathi_runs_stop_before_the_pool_runs_dry(seed):
    """SAR-2.1 preempts whenever no block is free, even for a row that needs none: a run must leave a
    block free (Quiet.keep_free), or the step after it would differ from stepping one by one."""
    rng = np.random.default_rng(seed)
    n = 6
    specs = [RequestSpec(f"s{i}", float(i) * 0.01, int(rng.integers(3, 30)), int(rng.integers(40, 120)))
             for i in range(n)]
    kw = dict(policy="sarathi", block_size=4, num_gpu_blocks=int(rng.integers(30, 45)), max_num_seqs=8,
              max_num_batched_tokens=64, enable_prefix_caching=False, max_model_len=512)
    slow = _engine_run(OpenSource(specs), False, **kw)
    fast = _engine_run(OpenSource(specs), True, **kw)
    assert sum(r.num_preemptions for r in slow[0].requests) > 0  # the pool does run dry
    assert fast[2].runs  # and stretches were fast-forwarded
    _assert_exact(slow, fast)


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("lag", [0, 1])
def test_a_stretch_of_decode_slots_equals_row_by_row(caching, lag):
    """allocate_decode_slots == allocate_slots(req, 1) per row, with its newest token known (lag 0) or in
    flight (lag 1: async scheduling, computed == num_tokens), shared and unique rows at every offset,
    over many steps: the same blocks, cached counts and free queue."""
    bs = 4
    prompts = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13]
    states = []
    for mode in ("stretch", "ref"):
        kv, reqs = _manager_with_rows(bs, caching, 200, prompts, {1, 4, 7})
        for r in reqs:  # lag 1: the first token is still in flight (computed == num_tokens)
            r.num_output_tokens -= lag
            r.num_tokens -= lag
        for _ in range(9):
            if mode == "stretch":
                assert kv.allocate_decode_slots(reqs) == len(reqs)
            else:
                assert all(kv.allocate_slots(r, 1) is not None for r in reqs)
            for r in reqs:  # the step's token lands (the one before it, under lag 1)
                r.num_computed_tokens += 1
                r.num_output_tokens += 1
                r.num_tokens += 1
            states.append(_state(kv, reqs))  # after every step: a cached count may not lag even once
    assert states[:9] == states[9:]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_runs_are_sized_by_the_steps_that_can_start_before_the_next_arrival(async_scheduling):
    """A run is planned to its rows' finish but cut by the next arrival: the planned steps are bounded by
    what can start before it (fastforward._steps_before), never below what does start."""
    rng = random.Random(3)
    specs = [RequestSpec(f"r{i}", 2.0 * i, 64, rng.randint(300, 600)) for i in range(12)]
    cost = ConstantCostModel(step_s=0.05, per_token_s=2e-4)
    env = simpy.Environment(initial_time=0.0)
    eng = Engine(env, make_policy("vllm", limits(async_scheduling=async_scheduling)), cost, OpenSource(specs),
                 Recorder(), async_scheduling=async_scheduling)
    planned: list[tuple[int, float]] = []  # (steps planned, seconds to the next arrival) per run

    class Spy(type(eng.ff)):  # the fast-forward is compiled, open to interpreted subclasses
        def _price_until(self, rows, ctx, start, limit):
            planned.append((len(rows), limit - start))
            return super()._price_until(rows, ctx, start, limit)

    eng.ff = Spy(eng)
    env.run()
    # steps take >= 0.05 s, so at most span / 0.05 + 1 start before the next arrival; rows have hundreds
    # of tokens left, so without the bound a run would be planned to hundreds of steps (as after the last)
    bounded = [(k, span) for k, span in planned if span < float("inf")]
    assert len(bounded) >= 5 and all(k <= span / 0.05 + 3 for k, span in bounded), bounded
    assert max(k for k, span in planned if span == float("inf")) > 200
    ff = eng.ff
    span = 1.0
    bound = ff._steps_before(span, 4)
    fastest = float(cost.decode_step_times(1, np.zeros(1))[0])
    assert span / fastest <= bound <= span / fastest + 3


# ---- b2. grow_stepped: a segment of one-token schedules taken as events ---------------------------
def _segment_setup(seed: int, bs: int, num_blocks: int, lag: int) -> tuple[KVCacheManager, list[Request]]:
    """A manager holding running rows (unique, shared-prefix and duplicated content) and free cached
    blocks left by finished ones, each row at ``lag`` tokens in flight (1: async scheduling)."""
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, bs, True, 10**6)
    rows: list[Request] = []
    for i in range(rng.randint(1, 14)):
        req = Request(_spec(rng, i, bs))
        hits, hit_tokens = kv.get_computed_blocks(req)
        if kv.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hits) is None:
            continue
        req.num_computed_tokens = req.num_tokens
        if not lag:
            req.num_output_tokens += 1
            req.num_tokens += 1
        if rng.random() < 0.3:
            kv.free(req)  # its hashed blocks stay cached, free: pops evict them
        else:
            rows.append(req)
    return kv, rows


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), bs=st.sampled_from([1, 2, 3, 4, 16]), num_blocks=st.integers(40, 400),
       lag=st.sampled_from([0, 1]), m=st.integers(1, 40))  # fmt: skip
def test_grow_stepped_leaves_the_state_of_schedule_by_schedule_rounds(seed, bs, num_blocks, lag, m):
    """``grow_stepped`` takes a segment's pops and registrations as events in (schedule, row) order; the
    state (block tables, free queue order, each hash's block and duplicates, cached counts) is the one
    rounds of ``grow_decodes(rows scheduled, 1)`` leave, as the fast-forwards did before. With ``lag``
    (async) a row that finishes at the segment's end takes one schedule less, and every row lands m."""
    ref, rows_r = _segment_setup(seed, bs, num_blocks, lag)
    new, rows_n = _segment_setup(seed, bs, num_blocks, lag)
    if not rows_r:
        return
    rng = random.Random(seed + 1)
    steps = [m - 1 if lag and rng.random() < 0.3 else m for _ in rows_r]
    c0 = [r.num_computed_tokens for r in rows_r]
    need = kv_need = ref.decode_run_blocks(c0, ref.num_blocks_held_rows(rows_r), steps, m)[m]
    if kv_need > ref.num_free_blocks:
        return  # the fast-forward never plans a segment its free blocks do not cover
    for j in range(1, m + 1):
        sched = [r for r, s in zip(rows_r, steps, strict=True) if s >= j]
        ref.grow_decodes(sched, 1)
        for r in sched:
            r.num_computed_tokens += 1
        for r in rows_r:
            r.num_output_tokens += 1
            r.num_tokens += 1
    free0 = new.num_free_blocks
    assert new.grow_stepped(rows_n, steps, lag)
    assert free0 - new.num_free_blocks == need
    for r, s in zip(rows_n, steps, strict=True):
        r.num_computed_tokens += s
        r.num_output_tokens += m
        r.num_tokens += m
    assert _state(new, rows_n) == _state(ref, rows_r)


def test_grow_stepped_refuses_a_row_it_cannot_take_and_changes_nothing():
    kv = KVCacheManager(64, 4, True, 40)
    req = Request(RequestSpec("a", 0.0, 30, 100, segments=((("s", 0), 30),)))
    assert kv.allocate_slots(req, 30) is not None
    req.num_computed_tokens = req.num_tokens = 30
    stranger = Request(RequestSpec("b", 0.0, 8, 100))
    before = _state(kv, [req])
    assert not kv.grow_stepped([req], [11], 1)  # past max_model_len 40
    assert not kv.grow_stepped([req, stranger], [2, 2], 1)  # a row without a block table
    assert _state(kv, [req]) == before
