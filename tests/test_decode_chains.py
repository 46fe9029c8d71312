"""Decode runs that go on through arrivals (sim/engine/chain.py; fastforward_async.py for vLLM's async
loop, sync_chain.py for the synchronous one): against stepping one step or batch at a time and against
runs that end at every arrival, every request timestamp, step row and token gap equal, with arrivals
taken inside chains."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.engine.fastforward as ff_mod
import sim.engine.fastforward_async as ffa
import sim.engine.sync_chain as sync_chain
from sim.app.config import config_from_dict
from tests.invariants import (
    check_fast_forward_exact,
    check_kv_at_end,
    check_requests_conserved,
    run_checked,
    workload_ids,
)


def _raw(seed: int = 0, *, rate: float = 6.0, n: int = 120, blocks: int | None = None, seqs: int = 64,
         prefix: bool = True, shared: bool = False, horizon: float | None = None, budget: int | None = None,
         chunked: bool = True, threshold: int | None = None, prompt: tuple[int, int] = (8, 900),
         output: tuple[int, int] = (1, 300), cost: str = "roofline", asyn: bool = True) -> dict:  # fmt: skip
    engine: dict = {"policy": "vllm", "async_scheduling": asyn, "max_model_len": 2048, "max_num_seqs": seqs,
                    "enable_prefix_caching": prefix, "enable_chunked_prefill": chunked, "cost_model": cost}
    if blocks is not None:
        engine["num_gpu_blocks_override"] = blocks
    if budget is not None:
        engine["max_num_batched_tokens"] = budget
    if threshold is not None:
        engine["long_prefill_token_threshold"] = threshold
    workload = {"num_requests": n, "rate": rate, "prompt": {"dist": "uniform", "low": prompt[0], "high": prompt[1]},
                "output": {"dist": "uniform", "low": output[0], "high": output[1]}}  # fmt: skip
    if shared:
        workload["shared_prefix"] = {"num_groups": 3, "prefix_len": 96}
    sim: dict = {"seed": seed}
    if horizon is not None:
        sim["horizon"] = horizon
    return {"engine": engine, "workload": workload, "simulation": sim}


def _runs(raw: dict, chains: bool):
    cfg = config_from_dict(raw)
    old = ff_mod.CHAINS
    ff_mod.CHAINS = chains
    try:
        return run_checked(cfg, fast_forward=True)
    finally:
        ff_mod.CHAINS = old


def _exact(raw: dict) -> tuple[int, int]:
    """Chains against stepping and against runs cut at arrivals; (arrivals' schedules taken in chains,
    requests that joined a chain)."""
    cfg = config_from_dict(raw)
    fast, obs = _runs(raw, True)
    slow, _ = run_checked(cfg, fast_forward=False)
    cut, cut_obs = _runs(raw, False)
    check_fast_forward_exact(fast, slow)
    check_fast_forward_exact(fast, cut)
    check_requests_conserved(fast, workload_ids(cfg, 2048), cfg.simulation.horizon)
    if cfg.simulation.horizon is None:
        check_kv_at_end(fast, obs)
    assert cut_obs.engine.ff.chained == 0  # type: ignore[attr-defined]
    ff = obs.engine.ff  # type: ignore[attr-defined]
    return ff.chained, ff.joined


@pytest.mark.parametrize("kw", [
    {},  # moderate load: most arrivals join a chain
    {"prefix": False},
    {"shared": True},  # prefix hits at an admission inside a chain, after the chain's pops
    {"shared": True, "blocks": 260, "rate": 9.0},  # decode pops evict cached blocks an arrival would hit
    {"rate": 14.0, "seqs": 8},  # max_num_seqs full: an arrival waits, the chain ends with it queued
    {"budget": 512, "prompt": (200, 1500)},  # prompts chunked: the chain ends with the first chunk in flight
    {"threshold": 128, "prompt": (100, 900)},  # long_prefill_token_threshold chunks a prompt too
    # without chunking, a prompt over the budget the decode rows leave waits (V1-5)
    {"chunked": False, "budget": 2048, "prompt": (1900, 2040), "output": (1, 8), "rate": 12.0},
    {"output": (1, 30), "rate": 10.0, "n": 300},  # short outputs, some of one token: done with its prompt
    {"horizon": 8.0},
    {"cost": "constant"},
])  # fmt: skip
@pytest.mark.parametrize("asyn", [True, False], ids=["async", "sync"])
def test_chains_are_exact(kw, asyn):
    chained, joined = _exact(_raw(**kw, asyn=asyn))
    if "chunked" not in kw:  # (there, few decode rows run long enough for a run at all)
        assert chained > 0, "no arrival was taken inside a chain"
    if not ({"seqs", "budget", "threshold", "chunked"} & set(kw)):
        assert joined > 0, "no request joined a chain"


@pytest.mark.parametrize("asyn", [True, False], ids=["async", "sync"])
def test_most_arrivals_join_a_chain_at_moderate_load(asyn):
    """What chains are for: at moderate load an arrival costs its own admission, not a run's end and a
    new run's start (issue 12 item 1)."""
    raw = _raw(1, rate=5.0, n=300, output=(20, 300), asyn=asyn)
    _, joined = _exact(raw)
    assert joined >= 0.6 * 300, joined


@pytest.mark.parametrize("asyn", [True, False], ids=["async", "sync"])
def test_a_chain_takes_no_arrival_past_its_schedule_cap(monkeypatch, asyn):
    raw = _raw(2, rate=5.0, n=150, asyn=asyn)
    _, free = _exact(raw)
    monkeypatch.setattr(ffa, "CHAIN_SCHEDULES", 40)
    monkeypatch.setattr(sync_chain, "CHAIN_STEPS", 40)
    fast, obs = _runs(raw, True)
    slow, _ = run_checked(config_from_dict(raw), fast_forward=False)
    check_fast_forward_exact(fast, slow)
    capped = obs.engine.ff  # type: ignore[attr-defined]
    assert 0 < capped.joined < free
    assert capped.runs > 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), rate=st.floats(0.5, 20.0), n=st.integers(1, 60),
       blocks=st.sampled_from([None, 150, 300]), seqs=st.integers(1, 64), prefix=st.booleans(),
       shared=st.booleans(), budget=st.sampled_from([None, 256, 1024]), asyn=st.booleans())  # fmt: skip
def test_chains_are_exact_on_random_workloads(seed, rate, n, blocks, seqs, prefix, shared, budget, asyn):
    _exact(_raw(seed, rate=rate, n=n, blocks=blocks, seqs=seqs, prefix=prefix, shared=shared, budget=budget,
                asyn=asyn))
