"""The engine's async-scheduling loop (vLLM's two-deep batch queue) in simulated time."""

from __future__ import annotations

import numpy as np
import pytest

from sim.app.config import config_from_dict
from sim.app.simulate import simulate
from sim.core.errors import ConfigError

STEP = 0.02  # the constant cost model's step time


def _run(async_scheduling: bool, workload: dict, **engine):
    cfg = config_from_dict({
        "engine": {"policy": "vllm", "cost_model": "constant", "constant_step_s": STEP,
                   "async_scheduling": async_scheduling, "max_model_len": 2048, **engine},
        "workload": workload,
    })
    return simulate(cfg)


def _ttft(df):
    return (df["first_token_time"] - df["arrival_time"]).to_numpy()


def test_an_idle_engine_pays_no_extra_step():
    """Alone in the system, a request's prefill runs at once and its tokens come a step apart: async
    scheduling hides the scheduler behind the GPU and adds nothing."""
    w = {"num_requests": 1, "rate": 1.0, "prompt": {"dist": "fixed", "value": 100},
         "output": {"dist": "fixed", "value": 20}}
    s, a = _ttft(_run(False, w).requests), _ttft(_run(True, w).requests)
    assert a[0] == pytest.approx(s[0]) == pytest.approx(STEP)
    e2e = [r.requests["finish_time"] - r.requests["arrival_time"] for r in (_run(False, w), _run(True, w))]
    assert e2e[1].iloc[0] == pytest.approx(e2e[0].iloc[0])


def test_an_arrival_during_a_step_waits_for_the_batch_already_scheduled():
    """A request arriving while others decode first runs two batches later: one step more TTFT on
    average than the synchronous loop (vLLM's async scheduling, docs/async_scheduling.md sec. 1)."""
    w = {"num_requests": 40, "rate": 20.0, "prompt": {"dist": "fixed", "value": 64},
         "output": {"dist": "fixed", "value": 60}}
    s, a = _run(False, w), _run(True, w)
    assert (s.requests["status"] == "finished").all() and (a.requests["status"] == "finished").all()
    extra = float(np.mean(_ttft(a.requests) - _ttft(s.requests)))
    assert 0.5 * STEP < extra < 1.5 * STEP, extra
    assert (a.requests["num_output_tokens"] == 60).all()


def test_async_scheduling_is_a_vllm_knob():
    with pytest.raises(ConfigError, match="async_scheduling = true is modelled for preset 'vllm' only"):
        _run(True, {"num_requests": 1}, policy="tgi")


def test_async_scheduling_is_the_vllm_default_only():
    """vLLM's GPU default: on for preset vllm unless the config says false; off (not modelled) for the others."""
    from sim.app.simulate import resolve

    base = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"}}
    assert resolve(config_from_dict({**base, "engine": {"policy": "vllm"}})).limits.async_scheduling is True
    off = {**base, "engine": {"policy": "vllm", "async_scheduling": False}}
    assert resolve(config_from_dict(off)).limits.async_scheduling is False
    for preset in ("vllm-v0", "sarathi", "trtllm"):
        assert resolve(config_from_dict({**base, "engine": {"policy": preset}})).limits.async_scheduling is False
