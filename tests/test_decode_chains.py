"""Decode runs that go on through arrivals (sim/engine/chain.py; fastforward_async.py for vLLM's async
loop, sync_chain.py for the synchronous one): against stepping one step or batch at a time and against
runs that end at every arrival, every request timestamp, step row and token gap equal, with arrivals
taken inside chains."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.engine.chain as chain_mod
import sim.engine.fastforward as ff_mod
from policies import base
from policies.admission import with_admission
from policies.vllm import VllmPolicy
from policies.vllm_options import VllmOptions
from sim.app.config import config_from_dict
from sim.engine.fastforward import _own_waiting_pass, delay_to
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


TIMES = ("arrival_time", "queued_time", "scheduled_time", "first_token_time", "finish_time")


def _bit_exact(a, b) -> None:
    """The steps' clock and the requests' times equal to the bit (check_fast_forward_exact allows 1e-9)."""
    for col in ("start", "duration"):
        assert np.array_equal(a.steps[col].to_numpy(), b.steps[col].to_numpy()), col
    ra, rb = a.requests.sort_values("request_id"), b.requests.sort_values("request_id")
    for col in TIMES:
        if col in ra.columns:
            assert np.array_equal(ra[col].to_numpy(float), rb[col].to_numpy(float), equal_nan=True), col


def _exact(raw: dict) -> tuple[int, int]:
    """Chains against stepping and against runs cut at arrivals; (arrivals' schedules taken in chains,
    requests that joined a chain)."""
    cfg = config_from_dict(raw)
    fast, obs = _runs(raw, True)
    slow, _ = run_checked(cfg, fast_forward=False)
    cut, cut_obs = _runs(raw, False)
    check_fast_forward_exact(fast, slow)
    check_fast_forward_exact(fast, cut)
    _bit_exact(fast, slow)
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
    monkeypatch.setattr(chain_mod, "CHAIN_STEPS", 40)
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


class _OnePerStep(VllmPolicy):
    """vLLM, but a schedule admits at most one waiting request: a plug-in with its own ``schedule``."""

    name = "vllm-one-per-step"

    def schedule(self, now):
        waiting = self.waiting
        if len(waiting) <= 1:
            return super().schedule(now)
        rest = waiting
        self.waiting = type(waiting)([rest.popleft()])
        try:
            return super().schedule(now)
        finally:
            rest.extendleft(reversed(list(self.waiting)))
            self.waiting = rest


def test_a_policy_with_a_schedule_of_its_own_takes_no_chains(monkeypatch):
    """A chain asks for the waiting pass alone (``schedule_waiting``): a subclass whose ``schedule`` has
    rules of its own would have them skipped at an arrival's step (found by review: two arrivals at one
    boundary were both admitted), and admission control checks its queue there. Neither takes chains."""
    monkeypatch.setitem(base._REGISTRY, "vllm-one-per-step", lambda limits, options: _OnePerStep(limits, options))
    monkeypatch.setitem(base._OPTIONS, "vllm-one-per-step", VllmOptions)
    limits = base.PolicyLimits(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512, block_size=16,
                               num_gpu_blocks=100, enable_prefix_caching=False, enable_chunked_prefill=True)
    assert _own_waiting_pass(VllmPolicy(limits))
    assert not _own_waiting_pass(_OnePerStep(limits))
    assert not _own_waiting_pass(with_admission(VllmPolicy(limits), 4, None))
    raw = {"engine": {"policy": "vllm-one-per-step", "max_model_len": 2048, "max_num_seqs": 64, "cost_model": "constant"},
           "workload": {"num_requests": 40, "rate": 20.0, "arrival": "gamma", "burstiness": 0.1,
                        "prompt": {"dist": "uniform", "low": 8, "high": 64},
                        "output": {"dist": "uniform", "low": 20, "high": 200}},
           "simulation": {"seed": 0}, "frontend": {"enabled": False}}  # fmt: skip
    assert _exact(raw) == (0, 0)


def test_a_run_does_not_end_past_its_last_step():
    """delay_to: where no delay lands on a run's end, the one that stays short (Engine.land then sets
    the end); one past it left the clock an ulp or two late for the rest of the run (found by review,
    the synchronous loop, a closed loop with no think time)."""
    now, t = 0.01717393065309194, 0.08416377333833917
    d = delay_to(now, t)
    assert now + d <= t and now + math.nextafter(d, math.inf) > t
    raw = {"model": {"name": "Mistral-7B"}, "hardware": {"gpu": "RTX 4090"},
           "engine": {"policy": "vllm", "async_scheduling": False, "max_model_len": 256, "max_num_seqs": 2,
                      "enable_prefix_caching": True, "cost_model": "roofline"},
           "workload": {"kind": "closed", "num_clients": 2, "num_requests": 4, "think_time": 0.0,
                        "prompt": {"dist": "uniform", "low": 17, "high": 32}, "output": {"dist": "uniform", "low": 1, "high": 5}},
           "simulation": {"seed": 317309}, "frontend": {"enabled": False}}  # fmt: skip
    cfg = config_from_dict(raw)
    fast, _ = run_checked(cfg, fast_forward=True)
    slow, _ = run_checked(cfg, fast_forward=False)
    _bit_exact(fast, slow)
