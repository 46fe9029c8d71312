"""Engine-level properties: conservation, queueing theory, determinism, fast-forward equivalence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.request import RequestSpec, Status
from tests.engine_helpers import run_specs


def _specs(rows):
    return [
        RequestSpec(request_id=f"r{i}", arrival_time=t, prompt_len=p, output_len=o)
        for i, (t, p, o) in enumerate(rows)
    ]


workloads = st.lists(
    st.tuples(st.floats(0, 50), st.integers(1, 300), st.integers(1, 60)), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=workloads,
    policy=st.sampled_from(["vllm", "static"]),
    blocks=st.integers(12, 80),
    budget=st.integers(16, 512),
    seqs=st.integers(1, 8),
    horizon=st.one_of(st.none(), st.floats(1, 80)),
    chunked=st.booleans(),
)
def test_conservation(rows, policy, blocks, budget, seqs, horizon, chunked):
    """Every request is finished, rejected with a reason, in flight, or not arrived; tokens add up."""
    specs = _specs(rows)
    max_len = 512
    chunked = chunked and policy != "static"  # HF generate has no chunked prefill (it refuses the switch)
    if not chunked:
        budget = max(budget, max_len)
    eng, rec, src = run_specs(
        specs, policy=policy, horizon=horizon, block_size=8, num_gpu_blocks=blocks,
        max_num_batched_tokens=budget, max_num_seqs=seqs, max_model_len=max_len,
        enable_prefix_caching=False, enable_chunked_prefill=chunked,
    )
    seen = {r.request_id for r in eng.requests} | {s.request_id for s in src.remaining()}
    assert seen == {s.request_id for s in specs}
    assert len(eng.requests) + len(src.remaining()) == len(specs)
    steps = rec.steps_frame()
    scheduled = 0
    for r in eng.requests:
        if r.status is Status.REJECTED:
            assert r.finish_reason
        elif r.status is Status.FINISHED:
            assert r.num_output_tokens == min(r.output_len, max_len - r.prompt_len)
            assert r.first_token_time is not None and r.finish_time >= r.first_token_time >= r.arrival_time
        else:
            assert horizon is not None, "without a horizon every admitted request must finish"
        assert r.num_tokens == r.prompt_len + r.num_output_tokens
        scheduled += r.num_computed_tokens + r.num_discarded_tokens
    if policy == "vllm":
        # Each computed token was scheduled exactly once (prefix caching off): no token lost or invented.
        assert int(steps["num_scheduled_tokens"].sum()) == scheduled
    if horizon is None:
        assert eng.policy.kv.num_free_blocks == eng.policy.kv.usable_blocks
    else:
        # not arrived: due after the horizon (the step that crossed it may end later still)
        assert all(s.arrival_time > min(eng.horizon, eng.env.now) for s in src.remaining())


def test_md1_waiting_time_at_low_load():
    """One server, deterministic service D, Poisson arrivals: Wq = rho * D / (2 (1 - rho))."""
    rng = np.random.default_rng(1)
    lam, d, n = 0.3, 1.0, 20000
    t = np.cumsum(rng.exponential(1 / lam, n))
    specs = _specs([(float(x), 4, 1) for x in t])
    eng, _, _ = run_specs(specs, step_s=d, max_num_seqs=1, enable_prefix_caching=False)
    wq = np.array([r.scheduled_time - r.arrival_time for r in eng.requests])
    rho = lam * d
    theory = rho * d / (2 * (1 - rho))
    se = wq.std() / math.sqrt(n) * 4  # queue waits are autocorrelated: a generous 4x the iid error
    assert abs(wq.mean() - theory) < 4 * se, (wq.mean(), theory)
    ttft = np.array([r.first_token_time - r.arrival_time for r in eng.requests])
    assert np.allclose(ttft - wq, d)


def _run(ff, seed=3, n=150, **kw):
    rng = np.random.default_rng(seed)
    rows = list(zip(np.cumsum(rng.exponential(0.5, n)), rng.integers(10, 400, n), rng.integers(1, 200, n),
                    strict=True))
    specs = _specs([(float(a), int(b), int(c)) for a, b, c in rows])
    eng, rec, _ = run_specs(specs, fast_forward=ff, step_s=0.05, **kw)
    return eng, rec


@pytest.mark.parametrize("kw", [
    dict(max_num_seqs=32),
    dict(max_num_seqs=8, num_gpu_blocks=200),
    dict(max_num_seqs=64, num_gpu_blocks=120, enable_prefix_caching=False),
])
def test_fast_forward_is_exact(kw):
    """Jumping over quiet decode stretches must not change any timestamp or step count."""
    slow, rs = _run(False, **kw)
    fast, rf = _run(True, **kw)
    a = [(r.request_id, r.first_token_time, r.finish_time, r.num_preemptions) for r in slow.requests]
    b = [(r.request_id, r.first_token_time, r.finish_time, r.num_preemptions) for r in fast.requests]
    assert [x[0] for x in a] == [x[0] for x in b]
    assert np.allclose([x[1:] for x in a], [x[1:] for x in b], rtol=1e-9)
    s, f = rs.steps_frame(), rf.steps_frame()
    assert len(s) == len(f)
    assert np.allclose(s["kv_usage"], f["kv_usage"]) and (s["num_free_blocks"] == f["num_free_blocks"]).all()
    assert (s["num_cached_blocks"] == f["num_cached_blocks"]).all()
    vs, ws = rs.itl()
    vf, wf = rf.itl()
    assert ws.sum() == wf.sum()
    assert np.isclose(np.repeat(vs, ws).sum(), np.repeat(vf, wf).sum())
    assert rs.trace is not None and len(rs.trace) == len(rf.trace)


def test_same_seed_same_result():
    a, _ = _run(True, seed=7, max_num_seqs=16)
    b, _ = _run(True, seed=7, max_num_seqs=16)
    assert [(r.first_token_time, r.finish_time) for r in a.requests] == [
        (r.first_token_time, r.finish_time) for r in b.requests
    ]


def test_horizon_leaves_requests_in_flight_and_not_arrived():
    specs = _specs([(0.0, 10, 100), (1.0, 10, 100), (500.0, 10, 5)])
    eng, _, src = run_specs(specs, horizon=20.0, step_s=1.0)
    assert [s.request_id for s in src.remaining()] == ["r2"]
    assert all(r.status is Status.RUNNING for r in eng.requests)
    assert eng.env.now >= 20.0


def test_a_new_request_starts_every_field_at_its_declared_default():
    """Request's ``__init__`` is written out (sim/core/request.py): a field added to the dataclass and
    forgotten there would start unset or stale; this compares each field with its declaration."""
    import dataclasses

    from sim.core.request import Request

    spec = RequestSpec("r7", 2.5, 100, 20, priority=3)
    req = Request(spec)
    from_spec = {"spec": spec, "request_id": "r7", "prompt_len": 100, "output_len": 20, "priority": 3,
                 "arrival_time": 2.5, "num_tokens": 100}  # fmt: skip
    fields = dataclasses.fields(Request)
    assert {f.name for f in fields} >= set(from_spec)
    for f in fields:
        if f.name in from_spec:
            want = from_spec[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            want = f.default_factory()
        else:
            want = f.default
        assert getattr(req, f.name) == want, f.name
    assert Request(spec)._hashes is not req._hashes  # a fresh list each
