"""The named invariants of tests/invariants.py over every registered policy, prefix caching on and off.

Policies come from the registry (``policies.base.policy_names()``), so a new policy is covered the day it is
registered. Each case draws small workloads and limits with hypothesis (tight KV pools, few slots, horizons,
queue caps and timeouts) so preemption, rejection and cut-off paths are taken.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import policy_names
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.errors import ConfigError
from tests.invariants import (
    check_fast_forward_exact,
    check_kv_at_end,
    check_kv_steps,
    check_requests_conserved,
    fast_forwarded_steps,
    run_checked,
    workload_ids,
)

POLICIES = policy_names()
_TRACE_DIR = tempfile.TemporaryDirectory()  # the drawn trace files (one per distinct row list)
TRACES = Path(os.environ.get("SERVESIM_TRACE_DIR", _TRACE_DIR.name))
SLOT_ENGINES = ("llamacpp", "ollama")  # KV sized by the context (n_ctx / num_ctx), not a block count
MAX_MODEL_LEN = 512

CASES = [(p, pc) for p in POLICIES for pc in (True, False)]
IDS = [f"{p}-prefix_{'on' if pc else 'off'}" for p, pc in CASES]


@st.composite
def run_configs(draw, policy: str, prefix: bool, *, horizon: bool = True, admission: bool = True):
    """A small RunConfig for ``policy`` built the way tests/test_policy_presets.py builds them."""
    engine: dict = {"preset": policy, "max_model_len": MAX_MODEL_LEN, "enable_prefix_caching": prefix,
                    "cost_model": draw(st.sampled_from(["constant", "roofline"]))}  # fmt: skip
    if policy in SLOT_ENGINES:
        n = draw(st.integers(1, 3))
        ctx = draw(st.sampled_from([1024, 2048]))
        engine |= {"n_parallel": n, "n_ctx": ctx * n} if policy == "llamacpp" else {"num_parallel": n, "num_ctx": ctx}
    else:
        engine["num_gpu_blocks_override"] = draw(st.integers(32, 100))
        engine["max_num_seqs"] = draw(st.integers(1, 8))
    if policy == "trtllm":
        engine["capacity_scheduler_policy"] = draw(
            st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH"])
        )
    if policy == "vllm-v0":
        engine["preemption_mode"] = draw(st.sampled_from([None, "swap", "recompute"]))
    if admission and draw(st.booleans()):
        engine["max_waiting"] = draw(st.integers(1, 20))
    if admission and draw(st.booleans()):
        engine["queue_timeout_s"] = draw(st.floats(0.05, 5.0))
    engine = {k: v for k, v in engine.items() if v is not None}
    prompt = {"dist": "uniform", "low": 1, "high": draw(st.integers(2, 400))}
    output = {"dist": "uniform", "low": 1, "high": draw(st.integers(2, 100))}
    kind = draw(st.sampled_from(["open", "closed", "sessions", "trace"]))  # every workload kind's source
    if kind == "trace":  # a servesim JSONL file of drawn rows (ties and shared segments included)
        n = draw(st.integers(1, 20))
        times = sorted(draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n)))
        rows = []
        for i, t in enumerate(times):
            p = draw(st.integers(1, 400))
            row = {"request_id": f"q{i}", "arrival_time": t, "prompt_len": p, "output_len": draw(st.integers(1, 100))}
            if p > 32 and draw(st.booleans()):
                row["segments"] = [[["sys", draw(st.integers(0, 1))], 32], [["u", i], p - 32]]
            rows.append(row)
        path = TRACES / f"t{abs(hash(json.dumps(rows))):x}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        workload = {"trace": str(path), "too_long": "clip"}
    elif kind == "open":
        workload = {"num_requests": draw(st.integers(1, 30)), "rate": draw(st.floats(1.0, 60.0)),
                    "prompt": prompt, "output": output}  # fmt: skip
    elif kind == "closed":
        workload = {"kind": "closed", "num_clients": draw(st.integers(1, 6)), "num_requests": draw(st.integers(1, 30)),
                    "think_time": draw(st.floats(0.0, 1.0)),
                    "think_dist": draw(st.sampled_from(["fixed", "exponential"])), "prompt": prompt, "output": output}
    else:
        workload = {"kind": "sessions", "num_sessions": draw(st.integers(1, 6)),
                    "turns": {"dist": "uniform", "low": 1, "high": draw(st.integers(1, 4))},
                    "message": prompt, "output": output, "think_time": draw(st.floats(0.0, 1.0))}
        if draw(st.booleans()):
            workload["num_clients"] = draw(st.integers(1, 4))
        else:
            workload["rate"] = draw(st.floats(1.0, 30.0))
        if draw(st.booleans()):
            workload["system_prompt"] = {"num_prompts": draw(st.integers(1, 2)), "len": draw(st.integers(8, 96))}
    if admission and draw(st.booleans()):
        workload["client_timeout_s"] = draw(st.floats(0.05, 5.0))
    if kind in ("open", "closed") and draw(st.booleans()):
        workload["shared_prefix"] = {"num_groups": draw(st.integers(1, 3)), "prefix_len": draw(st.integers(8, 96))}
    raw = {"engine": engine, "workload": workload, "simulation": {"seed": draw(st.integers(0, 2**16))}}
    if horizon and draw(st.booleans()):
        raw["simulation"]["horizon"] = draw(st.floats(0.05, 5.0))
    return raw


def _config(raw):
    return config_from_dict(raw)


def _needs_prefix_support(policy: str, prefix: bool) -> None:
    """Skip (visibly) a policy that refuses prefix caching: Sarathi-Serve and Orca have none."""
    if not prefix:
        return
    cfg = config_from_dict({"engine": {"preset": policy, "max_model_len": MAX_MODEL_LEN,
                                       "enable_prefix_caching": True}})  # fmt: skip
    try:
        resolve(cfg).make_policy()
    except ConfigError as e:
        if "prefix" not in str(e):
            raise
        pytest.skip(f"{policy} refuses prefix caching: {e}")


def _settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


@pytest.mark.parametrize(("policy", "prefix"), CASES, ids=IDS)
def test_requests_conserved(policy, prefix):
    _needs_prefix_support(policy, prefix)
    @_settings(12)
    @given(raw=run_configs(policy, prefix))
    def check(raw):
        cfg = _config(raw)
        res, _ = run_checked(cfg, check_kv=False)
        check_requests_conserved(res, workload_ids(cfg, MAX_MODEL_LEN), cfg.simulation.horizon)

    check()


@pytest.mark.parametrize(("policy", "prefix"), CASES, ids=IDS)
def test_kv_blocks_conserved(policy, prefix):
    _needs_prefix_support(policy, prefix)
    @_settings(10)
    @given(raw=run_configs(policy, prefix))
    def check(raw):
        cfg = _config(raw)
        res, obs = run_checked(cfg, check_kv=True)
        # checked after every priced step and every fast-forwarded run (one check covers a run's rows)
        assert (obs.kv_checks > 0) == (len(res.steps) > 0) and obs.kv_checks <= len(res.steps)
        check_kv_steps(res.steps, obs.policy.kv.usable_blocks)
        if cfg.simulation.horizon is None:
            check_kv_at_end(res, obs)

    check()


@pytest.mark.parametrize(("policy", "prefix"), CASES, ids=IDS)
def test_fast_forward_exact(policy, prefix):
    _needs_prefix_support(policy, prefix)
    @_settings(10)
    @given(raw=run_configs(policy, prefix))
    def check(raw):
        cfg = _config(raw)
        on, _ = run_checked(cfg, fast_forward=True, check_kv=False)
        off, obs_off = run_checked(cfg, fast_forward=False, check_kv=False)
        assert fast_forwarded_steps(off, obs_off) == 0  # stepping one at a time: every row is a schedule call
        check_fast_forward_exact(on, off)

    check()
