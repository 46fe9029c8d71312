"""Sizing: bracketing + bisection, the robust SLO decision, candidates, the answer's forms, the CLI."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from sim.app.config import config_from_dict
from sim.app.sizing import LoadKnob, Search, candidate_grid, default_max_num_seqs, detect_knob, judge, size
from sim.core.errors import ConfigError
from tests.test_sweep import run_cli

# Constant 20 ms steps, 20-token outputs, 64-token prompts: a request holds a slot ~21 steps ≈ 0.42 s,
# so s slots serve at most ≈ s / 0.42 req/s.
RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "24GB"},
    "engine": {"max_model_len": 4096, "overhead_gib": 1.5, "cost_model": "constant", "constant_step_s": 0.02},
    "workload": {"rate": 1.0, "num_requests": 150, "prompt": {"dist": "fixed", "value": 64},
                 "output": {"dist": "fixed", "value": 20}},
}  # fmt: skip
SLO = {"p99_ttft_ms": 500}


def base(**workload):
    raw = {k: dict(v) for k, v in RAW.items()}
    raw["workload"].update(workload)
    return config_from_dict(raw)


def drive(search: Search, capacity: float, offline: float | None = None) -> list[float]:
    """Run a search against an oracle that passes iff load <= capacity; the loads it asked for."""
    asked = []
    while (x := search.next_load()) is not None and search.phase != "done":
        asked.append(x)
        search.record(x, x <= capacity, offline if math.isinf(x) else None)
    return asked


@pytest.mark.parametrize("capacity", [0.3, 2.9, 7.5, 11.0])
def test_bisection_brackets_from_the_offline_throughput_and_converges(capacity):
    s = Search(LoadKnob("rate", 1.0, "req/s"), rel_tol=0.05, goal="slo")
    asked = drive(s, capacity, offline=10.0)
    assert math.isinf(asked[0]) and asked[1] == 10.0  # offline run, then its throughput
    assert s.lo <= capacity < s.hi and (s.hi - s.lo) <= 0.05 * s.hi
    assert len(asked) <= 12  # not a grid: log steps


def test_no_load_meets_the_slo_gives_capacity_zero_after_a_few_halvings():
    s = Search(LoadKnob("rate", 1.0, "req/s"), rel_tol=0.05, goal="slo")
    asked = drive(s, capacity=-1.0, offline=10.0)
    assert s.lo is None and s.phase == "done" and len(asked) <= 13


def test_integer_knob_bisects_concurrency():
    s = Search(LoadKnob("num_clients", None, "clients"), rel_tol=0.05, goal="slo", phase="search")
    drive(s, capacity=37)
    assert (s.lo, s.hi) == (37, 38)


def rows(values, saturated=None, attainment=None):
    df = pd.DataFrame({"slo_p99_ttft_ms": [None if v is None else 1000 * v for v in values]})
    df["saturated"] = saturated or [False] * len(values)
    if attainment is not None:
        df["slo_attainment"] = attainment
    return df


def test_the_upper_confidence_bound_decides_not_the_mean():
    one_s = {"p99_ttft_ms": 1000}
    v = judge(rows([0.90, 0.95, 0.92]), SLO | one_s)
    assert v.passed and v.checks["p99_ttft_ms"]["ci_high"] < 1000
    noisy = judge(rows([0.5, 0.9, 1.3]), one_s)  # mean 0.9 s < 1 s, upper bound above
    assert noisy.checks["p99_ttft_ms"]["mean"] < 1000 and not noisy.passed
    assert judge(rows([0.9]), one_s).passed  # one replication: the point estimate
    assert not judge(rows([0.5, None]), one_s).passed  # a run with no finished request
    assert not judge(rows([0.1, 0.1, 0.1], saturated=[True, True, False]), one_s).passed
    per_req = judge(rows([0.1] * 3, attainment=[0.999, 0.998, 0.997]), {"ttft_ms": 500})
    assert per_req.passed and "attainment" in per_req.checks
    # mean attainment 0.997, but two seeds cannot vouch for 0.99: the lower bound decides
    assert not judge(rows([0.1, 0.1], attainment=[0.999, 0.995]), {"ttft_ms": 500}).passed


def test_size_finds_more_capacity_with_more_slots_and_stays_below_saturation():
    res = size(base(), SLO, max_num_seqs=[2, 8], replications=3, jobs=1)
    tab = res.table().set_index("engine.max_num_seqs")
    assert res.candidates[res.recommended].params == {"engine.max_num_seqs": 8}
    assert tab.loc[8, "capacity"] > 2 * tab.loc[2, "capacity"]
    for c in res.candidates:
        top = c.offline.metrics["request_throughput"][0]
        assert 0 < c.capacity <= 1.05 * top
        assert c.capacity <= 2 / 0.42 * 1.05 if c.params["engine.max_num_seqs"] == 2 else True
        lo, hi = c.bracket
        passed = {e.x: e.verdict.passed for e in c.evaluations if not e.offline}
        assert passed[lo] and (hi is None or not passed[hi])
        assert c.at_capacity.verdict.checks["p99_ttft_ms"]["bound"] <= 500
    assert res.num_simulations == sum(len(c.evaluations) for c in res.candidates) * 3
    d = json.loads(json.dumps(res.to_dict()))
    rec = d["recommendation"]
    assert rec["settings"] == {"engine.max_num_seqs": 8}
    tp = rec["throughput_req_s"]
    assert tp["ci_low"] <= tp["mean"] <= tp["ci_high"]
    assert rec["slo_checks"]["p99_ttft_ms"]["margin"] >= 0
    caps = rec["capacity_by_replication"]
    assert len(caps) == 3 and all(x > 0 for x in caps)
    assert rec["capacity_ci"]["ci_low"] <= rec["capacity_ci"]["mean"] <= rec["capacity_ci"]["ci_high"]
    curve = res.curve()
    assert {"load", "offered_rate", "p99_ttft_ms", "median_ttft_ms", "request_throughput"} <= set(curve)
    fig = res.figure()
    assert len(fig.data) >= 1 + 3 * 2
    assert "recommended: engine.max_num_seqs=8" in res.format()


def test_throughput_goal_runs_only_the_offline_point():
    res = size(base(), {}, max_num_seqs=[2, 8], goal="throughput", replications=1, jobs=1)
    assert all(len(c.evaluations) == 1 and c.evaluations[0].offline for c in res.candidates)
    assert res.candidates[res.recommended].params["engine.max_num_seqs"] == 8


def test_closed_loop_is_sized_in_clients():
    cfg = base()
    raw = cfg.to_dict()
    raw["workload"] = {"kind": "closed", "num_clients": 1, "num_requests": 80, "prompt": 64, "output": 20}
    res = size(config_from_dict(raw), SLO, max_num_seqs=[4], replications=1, jobs=1)
    assert res.knob.key == "num_clients"
    cap = res.candidates[0].capacity
    assert cap >= 4 and cap == int(cap)


def test_trace_is_sized_in_req_per_s_with_windows_as_replications(tmp_path):
    from sim.core.request import RequestSpec
    from workloads.tracefmt.jsonl import save_jsonl

    specs = [RequestSpec(f"r{i}", i * 0.5, 64, 20) for i in range(41)]  # 2 req/s over 20 s
    save_jsonl(specs, tmp_path / "t.jsonl")
    raw = base().to_dict()
    raw["workload"] = {"trace": str(tmp_path / "t.jsonl"), "time_scale": 3.0}
    cfg = config_from_dict(raw)
    knob = detect_knob(cfg, replications=3)
    assert knob.key == "rate_scale" and knob.per_unit == 1.0
    assert [w["start"] for w in knob.windows] == [0.0, 6.5, 13.0] and knob.windows[0]["num_requests"] == 13
    assert knob.window_rates == pytest.approx((2.0, 2.0, 2.0))
    run = knob.apply(cfg, 5.0, replication=1).workload
    assert "time_scale" not in run and run["rate_scale"] == pytest.approx(2.5) and run["end"] == 13.0
    res = size(cfg, SLO, max_num_seqs=[4], replications=3, jobs=1)
    assert "window" in res.notes[0]
    c = res.candidates[0]
    cap = c.at_capacity
    assert res.to_dict()["recommendation"]["capacity_req_s"] == pytest.approx(c.capacity) and c.capacity > 0
    assert 0 < cap.metrics["request_throughput"][0] <= 1.05 * c.capacity  # 13-request windows drain long
    with pytest.raises(ConfigError, match="cannot make 3 windows of 20"):
        detect_knob(config_from_dict({**raw, "workload": {**raw["workload"], "num_requests": 20}}), 3)


def test_candidates_and_their_validation():
    cands = candidate_grid(base(), [8, 16], {"engine.max_num_batched_tokens": [512, 2048]})
    assert len(cands) == 4 and cands[1] == {"engine.max_num_seqs": 8, "engine.max_num_batched_tokens": 2048}
    seqs = default_max_num_seqs(base())
    assert seqs == sorted(seqs) and all(s & (s - 1) == 0 for s in seqs) and len(seqs) <= 6
    with pytest.raises(ConfigError, match="--vary workload.rate"):
        candidate_grid(base(), [8], {"workload.rate": [1]})
    with pytest.raises(ConfigError, match="unknown SLO key"):
        size(base(), {"p1000_ttft_ms": 1000}, max_num_seqs=[2])
    with pytest.raises(ConfigError, match="no SLO"):
        size(base(), {}, max_num_seqs=[2])


def test_cli_size_json_and_bad_slo(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nname = "seed-7b"\ndtype = "fp16"\n[hardware]\ngpu = "24GB"\n'
        '[engine]\nmax_model_len = 4096\noverhead_gib = 1.5\ncost_model = "constant"\n'
        "[workload]\nrate = 1.0\nnum_requests = 80\nprompt = 64\noutput = 20\n"
    )
    rc = run_cli(["size", str(cfg), "--slo", "p99_ttft:500", "--max-num-seqs", "2,4", "--replications", "2",
                  "--jobs", "1", "--json", "--out", str(tmp_path / "o")])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    assert d["recommendation"]["capacity_req_s"] > 0 and d["interval"].startswith("Student t")
    assert (tmp_path / "o" / "size.html").stat().st_size > 10_000 and (tmp_path / "o" / "curve.csv").exists()
    assert d["slo"] == {"p99_ttft_ms": 500}
    for bad, msg in (("p99_ttft", "expected NAME:MS"), ("p99_ttft:fast", "not a number"),
                     ("p99_ttft:-1", "positive"), ("latency:1", "unknown SLO name"),
                     ("ttft_p99=0.5", "ttft_p99=0.5 (seconds) is now --slo p99_ttft:500 (milliseconds)")):  # fmt: skip
        rc = run_cli(["size", str(cfg), "--slo", bad, "--max-num-seqs", "2"])
        assert rc == 2 and msg in capsys.readouterr().err


def test_a_slo_that_never_binds_stops_at_a_few_times_the_offline_throughput():
    # three requests: too few to show a queue trend, so only the SLO could stop the doubling
    res = size(base(num_requests=3), {"p99_ttft_ms": 100_000}, max_num_seqs=[4], replications=1, jobs=1)
    c = res.candidates[0]
    top = c.offline.metrics["request_throughput"][0]
    assert c.bracket[1] is None and top * 4 <= c.capacity <= top * 8
    assert "lower bound" in res.notes[-1] and not res.to_dict()["recommendation"]["near_saturation"]
