"""Client timeouts (``workload.client_timeout_s``): a client that gives up is aborted in the engine,
wherever its request is, and its KV is freed; it ends ``timed_out`` and counts as failed."""

from __future__ import annotations

import pytest

from policies.base import policy_names
from sim.app.config import config_from_dict
from sim.app.results import summarize
from sim.app.simulate import simulate
from sim.core.errors import ConfigError
from tests.invariants import (
    check_fast_forward_exact,
    check_kv_at_end,
    check_requests_conserved,
    run_checked,
    workload_ids,
)

TIMEOUT = 2.0
OVERLOAD = {"num_requests": 60, "rate": 40.0, "prompt": {"dist": "uniform", "low": 50, "high": 400},
            "output": {"dist": "uniform", "low": 50, "high": 300}, "client_timeout_s": TIMEOUT}  # fmt: skip


def _raw(policy: str, **engine) -> dict:
    e = {"preset": policy, "max_model_len": 1024, "cost_model": "constant", "constant_step_s": 0.02, **engine}
    if policy == "llamacpp":
        e |= {"n_parallel": 4, "n_ctx": 4096}
    elif policy == "ollama":
        e |= {"num_parallel": 4, "num_ctx": 1024}
    else:
        e |= {"num_gpu_blocks_override": 120, "max_num_seqs": 8}
    return {"engine": e, "workload": dict(OVERLOAD)}


@pytest.mark.parametrize("policy", policy_names())
def test_timed_out_requests_are_aborted_and_counted(policy):
    # prefix caching where the engine has a paged prefix cache (the others refuse the switch)
    no_cache = ("sarathi", "orca", "static", "hf-static", "llamacpp", "ollama")
    cfg = config_from_dict(_raw(policy, enable_prefix_caching=policy not in no_cache))
    (fast, obs), (slow, _) = run_checked(cfg, fast_forward=True), run_checked(cfg, fast_forward=False)
    counts = check_requests_conserved(fast, workload_ids(cfg, 1024), None)
    check_kv_at_end(fast, obs)  # aborted requests gave their blocks back
    check_fast_forward_exact(fast, slow)  # a run never jumps over a client's deadline
    df = fast.requests
    out = df[df["status"] == "timed_out"]
    assert counts.get("timed_out", 0) == len(out) > 0, counts  # the overload makes clients give up
    assert (out["finish_reason"] == "client timeout").all()
    waited = out["finish_time"] - out["arrival_time"]
    assert (waited >= TIMEOUT - 1e-9).all() and (waited <= TIMEOUT + 0.5).all()  # at the next boundary
    s = summarize(fast)
    assert s["num_timed_out"] == len(out) and s["failed"] == s["num_rejected"] + len(out)
    assert s["completed"] + s["failed"] == 60


def test_aborts_reach_running_and_waiting_requests():
    raw = _raw("vllm")
    raw["engine"]["max_num_seqs"] = 2  # a long queue: some clients give up before they are served
    df = simulate(config_from_dict(raw)).requests
    out = df[df["status"] == "timed_out"]
    started = out["scheduled_time"].notna()
    assert started.any() and (~started).any()  # some were decoding, some never left the queue


def test_async_scheduling_with_client_timeouts():
    cfg = config_from_dict(_raw("vllm", async_scheduling=True))
    res, obs = run_checked(cfg)
    counts = check_requests_conserved(res, workload_ids(cfg, 1024), None)
    check_kv_at_end(res, obs)
    assert counts["timed_out"] > 0


def test_closed_loop_clients_go_on_after_a_timeout():
    raw = _raw("vllm")
    raw["workload"] = {"kind": "closed", "num_clients": 16, "num_requests": 48, "think_time": 0.0,
                       "prompt": {"dist": "fixed", "value": 300}, "output": {"dist": "fixed", "value": 100},
                       "client_timeout_s": 3.0}  # fmt: skip
    df = simulate(config_from_dict(raw)).requests
    assert len(df) == 48 and set(df["status"]) <= {"finished", "timed_out"}
    assert (df["status"] == "timed_out").any() and (df["status"] == "finished").any()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "10", True])
def test_a_bad_timeout_is_one_clear_error(bad):
    raw = _raw("vllm")
    raw["workload"]["client_timeout_s"] = bad
    with pytest.raises(ConfigError, match=r"workload\.client_timeout_s"):
        simulate(config_from_dict(raw))
