"""bench/vllm_diff.py without vLLM: its generator, its step semantics and its comparison, plus a replay of
recorded vLLM 0.33 scheduler traces (tests/data/vllm_oracle_tiny.jsonl, written by the harness's
``--write-fixture``) as a regression test of the ``vllm`` policy against the real scheduler."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

from sim.core.request import Request

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "vllm_oracle_tiny.jsonl"


def _load_harness():
    spec = importlib.util.spec_from_file_location("vllm_diff", REPO / "bench" / "vllm_diff.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_diff"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


vd = _load_harness()
RECORDED = vd.read_fixture(FIXTURE)


@pytest.mark.parametrize("content", vd.CONTENT_MODES)
@pytest.mark.parametrize("name,workload,trace", RECORDED, ids=[r[0].split(":")[0] for r in RECORDED])
def test_recorded_oracle_trace_is_reproduced_step_by_step(name, workload, trace, content):
    fields = vd.FIELDS if content == "segments" else vd.FIELDS_UNIQUE
    c = vd.compare_traces(trace, vd.servesim_trace(workload, content), fields)
    if c.diff is not None:
        pytest.fail(f"{name} (content={content})\n{c.diff.describe()}")
    assert c.matched == c.steps == len(trace)


def test_fixture_exercises_what_it_claims():
    """The recorded traces are not vacuous: preemptions, prefix hits, idle steps, every config."""
    labels = {vd.config_label(w["params"]) for _, w, _ in RECORDED}
    assert len(labels) == 8  # cache on/off x chunked on/off x fcfs/priority
    cov = [vd.coverage(w, t) for _, w, t in RECORDED]
    assert sum(c["preemptions"] for c in cov) >= 5
    assert sum(c["hit_tokens"] for c in cov) > 0
    assert sum(c["partial_prefill_admissions"] for c in cov) > 0
    # the priority case: the lowest-priority request preempted itself, the other still ran that step
    (prio,) = [t for n, _, t in RECORDED if n == "priority self-preemption"]
    step = next(r for r in prio if r["preempted"])
    assert step["preempted"] == ["lo"] and step["scheduled"] == [["hi", 1]]


def test_compare_reports_the_first_difference_with_both_sides():
    _, _, trace = RECORDED[0]
    other = copy.deepcopy(trace)
    other[3]["scheduled"] = [["nope", 1]]
    other[5]["num_free_blocks"] += 1
    c = vd.compare_traces(trace, other)
    assert c.diff is not None and c.diff.step == 3 and c.diff.fields == ["scheduled"]
    assert c.diff.oracle["scheduled"] == trace[3]["scheduled"] and c.diff.servesim["scheduled"] == [["nope", 1]]
    assert c.matched == len(trace) - 2 and c.diff_fields == {"scheduled": 1, "num_free_blocks": 1}
    assert "step 3" in c.diff.describe() and "nope" in c.diff.describe()
    # preempted is a set (the oracle sorts it); a missing step is a difference
    other = copy.deepcopy(trace)
    other[1]["preempted"] = ["b", "a"]
    trace2 = copy.deepcopy(trace)
    trace2[1]["preempted"] = ["a", "b"]
    assert vd.compare_traces(trace2, other).diff is None
    short = vd.compare_traces(trace, trace[:-1])
    assert short.diff is not None and short.diff.step == len(trace) - 1 and short.diff.servesim is None


def test_compact_records_round_trip():
    for _, w, trace in RECORDED:
        usable = w["params"]["num_gpu_blocks"] - 1
        for rec in trace:
            assert vd.expand_record(vd.compact_record(rec), usable) == rec


def test_generated_workloads_are_deterministic_and_valid_for_both_sides():
    seen = set()
    for i in range(60):
        w = vd.gen_workload(7, i)
        assert w == vd.gen_workload(7, i)
        p, reqs = w["params"], w["requests"]
        bs, mml = p["block_size"], p["max_model_len"]
        assert bs in (8, 16, 32)  # block sizes vLLM's CacheConfig accepts
        assert all(r["prompt_len"] < mml for r in reqs)  # servesim rejects prompt >= max_model_len
        need = max(-(-min(r["prompt_len"] + r["output_len"], mml) // bs) for r in reqs)
        assert need <= p["num_gpu_blocks"] - 1  # every request fits the pool alone
        assert p["max_num_batched_tokens"] >= p["max_num_seqs"]
        assert p["long_prefill_token_threshold"] <= mml  # vLLM's SchedulerConfig refuses more
        if not p["enable_chunked_prefill"]:
            assert p["max_num_batched_tokens"] >= mml  # the oracle refuses less
        steps = [r["arrival_step"] for r in reqs]
        assert steps == sorted(steps)
        seen.add(vd.config_label(p))
    assert len(seen) == 8
    assert vd.gen_workload(7, 0) != vd.gen_workload(8, 0)


def test_request_content_mirrors_the_oracle_prefix_groups():
    """Same group: the first min(prefix_len) tokens are equal, the rest is each request's own."""
    w = {"params": {"prefix_len": 0}, "requests": [
        {"id": "a", "arrival_step": 0, "prompt_len": 64, "output_len": 4, "prefix_group": "g", "prefix_len": 48},
        {"id": "b", "arrival_step": 0, "prompt_len": 64, "output_len": 4, "prefix_group": "g", "prefix_len": 32},
        {"id": "c", "arrival_step": 1, "prompt_len": 32, "output_len": 4, "prefix_group": "g", "prefix_len": 48},
        {"id": "d", "arrival_step": 1, "prompt_len": 64, "output_len": 4},
    ]}
    specs = dict((s.request_id, (step, s)) for step, s in vd.request_specs(w))
    h = {rid: Request(s).block_hashes(16, 64) for rid, (_, s) in specs.items()}
    assert h["a"][:2] == h["b"][:2] and h["a"][2] != h["b"][2]  # 32 shared tokens = 2 blocks
    assert h["c"][:2] == h["a"][:2]  # c's whole prompt is the group prefix
    assert h["d"][0] not in (h["a"][0], h["b"][0])
    # arrival order within a step breaks priority ties as in the oracle (step + 1e-6 * position)
    assert specs["b"][1].arrival_time > specs["a"][1].arrival_time and specs["c"][0] == 1
    unique = dict((s.request_id, s) for _, s in vd.request_specs(w, "unique"))
    assert unique["d"].segments is None and unique["a"].segments == specs["a"][1].segments
    with pytest.raises(ValueError, match="content"):
        vd.request_specs(w, "tokens")


def test_step_semantics_idle_steps_and_the_extra_empty_step():
    w = {"params": {"block_size": 16, "num_gpu_blocks": 20, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                    "enable_prefix_caching": True, "enable_chunked_prefill": True, "max_model_len": 64,
                    "policy": "fcfs"},
         "requests": [{"id": "x", "arrival_step": 2, "prompt_len": 20, "output_len": 2}]}
    t = vd.servesim_trace(w)
    assert [r["step"] for r in t] == [0, 1, 2, 3, 4]
    assert t[0]["prefix_cache"] is None and t[1]["scheduled"] == []  # nothing in the system yet
    assert t[2]["arrived"] == ["x"] and t[2]["scheduled"] == [["x", 20]]  # arrivals join their own step
    assert t[2]["admitted"] == {"x": {"kind": "new", "cached": 0}}
    assert t[3]["scheduled"] == [["x", 1]] and t[3]["finished"] == ["x"]
    # vLLM schedules once more after the last finish (has_requests counts finished ones), empty
    assert t[4]["scheduled"] == [] and t[4]["prefix_cache"] == dict.fromkeys(vd.PREFIX_STATS, 0)
    assert t[4]["num_free_blocks"] == t[4]["usable_blocks"] == 19 and t[4]["kv_usage"] == 0.0
