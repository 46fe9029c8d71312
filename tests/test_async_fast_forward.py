"""The async loop's fast-forward (sim/engine/fastforward_async.py AsyncFastForward) against stepping batch by
batch: every request timestamp, every step row and every inter-token gap equal, with runs taken."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.app.config import config_from_dict
from sim.engine import fastforward
from tests.invariants import (
    check_fast_forward_exact,
    check_kv_at_end,
    check_requests_conserved,
    fast_forwarded_steps,
    run_checked,
    workload_ids,
)


def _raw(seed: int = 0, *, rate: float = 4.0, n: int = 40, blocks: int | None = None, seqs: int = 16,
         prefix: bool = True, shared: bool = False, timeout: float | None = None, horizon: float | None = None,
         cost: str = "roofline") -> dict:  # fmt: skip
    engine = {"policy": "vllm", "async_scheduling": True, "max_model_len": 2048, "max_num_seqs": seqs,
              "enable_prefix_caching": prefix, "cost_model": cost}  # fmt: skip
    if blocks is not None:
        engine["num_gpu_blocks_override"] = blocks
    workload = {"num_requests": n, "rate": rate, "prompt": {"dist": "uniform", "low": 8, "high": 600},
                "output": {"dist": "uniform", "low": 2, "high": 300}}  # fmt: skip
    if shared:
        workload["shared_prefix"] = {"num_groups": 2, "prefix_len": 64}
    if timeout is not None:
        workload["client_timeout_s"] = timeout
    sim = {"seed": seed}
    if horizon is not None:
        sim["horizon"] = horizon
    return {"engine": engine, "workload": workload, "simulation": sim}


def _exact(raw: dict) -> int:
    cfg = config_from_dict(raw)
    (fast, obs), (slow, _) = run_checked(cfg, fast_forward=True), run_checked(cfg, fast_forward=False)
    check_fast_forward_exact(fast, slow)
    check_requests_conserved(fast, workload_ids(cfg, 2048), cfg.simulation.horizon)
    if cfg.simulation.horizon is None:
        check_kv_at_end(fast, obs)
    return fast_forwarded_steps(fast, obs)


@pytest.mark.parametrize("kw", [
    {}, {"prefix": False}, {"rate": 1.0}, {"rate": 20.0, "n": 80},
    {"blocks": 150, "seqs": 32, "rate": 10.0},  # KV pressure: preemption, runs cut where blocks run out
    {"shared": True},  # hashed rows: stepped schedule by schedule inside the run
    {"timeout": 3.0, "rate": 12.0, "n": 60}, {"horizon": 6.0}, {"cost": "constant"},
])  # fmt: skip
def test_async_fast_forward_is_exact(kw):
    assert _exact(_raw(**kw)) > 0, "no batch was fast-forwarded"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), rate=st.floats(0.5, 30.0), n=st.integers(1, 40),
       blocks=st.sampled_from([None, 140, 250]), seqs=st.integers(1, 12), prefix=st.booleans(),
       timeout=st.sampled_from([None, 1.0, 4.0]), shared=st.booleans())  # fmt: skip
def test_async_fast_forward_is_exact_on_random_workloads(seed, rate, n, blocks, seqs, prefix, timeout, shared):
    _exact(_raw(seed, rate=rate, n=n, blocks=blocks, seqs=seqs, prefix=prefix, timeout=timeout, shared=shared))


def test_a_run_begins_with_the_batch_that_finishes_a_prompt(monkeypatch):
    """The async fast-forward may start while the batch in flight finishes prompts (their first tokens
    land with it), so an arrival costs about the schedule calls it costs the synchronous loop, not one
    more (before: ~1.36x on the Azure trace); and the run stays exact. Runs that end at each arrival (no
    chains, tests/test_decode_chains.py), where a run's start is what this is about."""
    monkeypatch.setattr(fastforward, "CHAINS", False)
    raw = _raw(3, rate=2.0, n=40, prefix=False)
    cfg = config_from_dict(raw)
    (fast, obs), (slow, _) = run_checked(cfg, fast_forward=True), run_checked(cfg, fast_forward=False)
    check_fast_forward_exact(fast, slow)
    sync_raw = {**raw, "engine": {**raw["engine"], "async_scheduling": False}}
    _, sync_obs = run_checked(config_from_dict(sync_raw), fast_forward=True)
    assert obs.schedule_calls <= 1.1 * sync_obs.schedule_calls, (obs.schedule_calls, sync_obs.schedule_calls)
    assert fast_forwarded_steps(fast, obs) > 0
