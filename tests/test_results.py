"""Results layer: per-request metrics, vLLM-named summary, SLOs, time series and output files."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.app.outputs import write_outputs
from sim.app.results import (
    STEP_COLUMNS,
    TIMESERIES_COLUMNS,
    ResultsIntegrityError,
    SimResult,
    empty_requests_frame,
    empty_steps_frame,
    request_metrics,
    slo_from_args,
    slo_from_goodput_args,
    summarize,
    time_series,
    weighted_percentiles,
)
from sim.core.errors import ConfigError

SHARED = Path(__file__).resolve().parents[2] / "shared"
NAN = float("nan")
VLLM_KEYS = (
    "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput",
)  # fmt: skip


def req(rid, arrival, sched=NAN, first=NAN, finish=NAN, n_out=0, status="finished", *, prompt=100,
        output_len=None, reason=None, cached=0, preempt=0, replica=0):  # fmt: skip
    return {
        "request_id": rid, "replica": replica, "arrival_time": arrival, "queued_time": arrival,
        "scheduled_time": sched, "first_token_time": first, "finish_time": finish, "prompt_len": prompt,
        "output_len": output_len if output_len is not None else max(n_out, 1), "num_output_tokens": n_out,
        "num_cached_tokens": cached, "num_preemptions": preempt, "priority": 0, "status": status,
        "finish_reason": reason,
    }  # fmt: skip


def step(i, start, dur, *, prefill=0, decode=0, running=1, waiting=0, preempted=0, finished=0, kv=0.1,
         free=100, replica=0):  # fmt: skip
    return {
        "step": i, "replica": replica, "start": start, "duration": dur, "num_prefill_tokens": prefill,
        "num_decode_tokens": decode, "num_scheduled_tokens": prefill + decode, "num_running": running,
        "num_waiting": waiting, "num_preempted": preempted, "num_finished": finished, "kv_usage": kv,
        "num_free_blocks": free,
    }  # fmt: skip


REASON = "prompt longer than max_model_len (5000 > 4096)"


def base_rows():
    return [
        req("r0", 0.0, 0.5, 1.0, 2.0, 11, prompt=100, cached=16, preempt=1),
        req("r1", 1.0, 1.2, 1.5, 4.5, 31, prompt=200, cached=0),
        req("r2", 2.0, 2.0, 2.25, 2.25, 1, prompt=50, cached=32),
        req("r3", 3.0, status="rejected", prompt=5000, reason=REASON, cached=-1),
        req("r4", 3.5, 4.0, 4.8, NAN, 3, status="in_flight", prompt=10, output_len=20, cached=0),
        req("r5", 6.0, status="not_arrived", cached=-1),
    ]


def base_steps():
    return [
        step(0, 0.5, 1.0, prefill=100, running=1, kv=0.2),
        step(1, 1.5, 3.0, prefill=250, decode=40, running=3, waiting=1, kv=0.6, finished=2),
    ]


def make(rows=None, steps=None, itl_v=(0.1, 0.2), itl_w=(3, 1), horizon=5.0, meta=None, trace=None):
    rq = pd.DataFrame(rows if rows is not None else base_rows()) if rows != [] else empty_requests_frame()
    sp = pd.DataFrame(steps if steps is not None else base_steps()) if steps != [] else empty_steps_frame()
    return SimResult(rq, sp, np.array(itl_v, float), np.array(itl_w, np.int64), trace,
                     {"policy": "vllm"}, horizon, meta or {})  # fmt: skip


# ---- per-request metrics --------------------------------------------------------------------------------
def test_request_metrics_from_known_timestamps():
    df = request_metrics(pd.DataFrame(base_rows())).set_index("request_id")
    assert df.loc["r0", "ttft_s"] == 1.0 and df.loc["r0", "e2el_s"] == 2.0 and df.loc["r0", "queue_time_s"] == 0.5
    assert df.loc["r0", "tpot_s"] == pytest.approx(0.1, rel=1e-15)  # (2.0-1.0)/(11-1)
    assert df.loc["r1", "tpot_s"] == pytest.approx(0.1, rel=1e-15)  # (4.5-1.5)/(31-1)
    assert math.isnan(df.loc["r2", "tpot_s"])  # one output token: no TPOT (vllm bench)
    assert math.isnan(df.loc["r4", "e2el_s"]) and math.isnan(df.loc["r4", "tpot_s"])  # not finished
    assert df.loc["r4", "ttft_s"] == pytest.approx(1.3)
    assert math.isnan(df.loc["r3", "ttft_s"])


def test_summary_latencies_match_numpy_on_same_data():
    s = summarize(make())
    ttft = np.array([1.0 - 0.0, 1.5 - 1.0, 2.25 - 2.0])
    e2el = np.array([2.0, 3.5, 0.25])
    tpot = np.array([(2.0 - 1.0) / 10, (4.5 - 1.5) / 30])
    for name, v in (("ttft", ttft), ("e2el", e2el), ("tpot", tpot)):
        assert s[f"mean_{name}_ms"] == np.mean(v) * 1000
        assert s[f"median_{name}_ms"] == np.median(v) * 1000
        assert s[f"std_{name}_ms"] == np.std(v) * 1000
        for q in (50, 90, 95, 99):
            assert s[f"p{q}_{name}_ms"] == np.percentile(v, q) * 1000
    itl = np.repeat([0.1, 0.2], [3, 1])
    assert s["mean_itl_ms"] == pytest.approx(np.mean(itl) * 1000, rel=1e-14)
    assert s["std_itl_ms"] == pytest.approx(np.std(itl) * 1000, rel=1e-12)
    for q in (50, 90, 95, 99):
        assert s[f"p{q}_itl_ms"] == pytest.approx(np.percentile(itl, q) * 1000, rel=1e-14)
    queue = np.array([0.5, 0.2, 0.0, 0.5])  # every scheduled request, in flight included
    assert s["mean_queue_time_ms"] == pytest.approx(np.mean(queue) * 1000)
    assert s["p99_queue_time_ms"] == pytest.approx(np.percentile(queue, 99) * 1000)


def test_summary_counts_throughput_and_vllm_keys():
    s = summarize(make())
    for k in VLLM_KEYS:
        assert k in s
    assert s["duration"] == 5.0  # horizon 5 − first arrival 0, requests remain
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 350 and s["total_output_tokens"] == 43
    assert s["request_throughput"] == pytest.approx(3 / 5)
    assert s["output_throughput"] == pytest.approx(43 / 5)
    assert s["total_token_throughput"] == pytest.approx(393 / 5)
    assert s["request_goodput"] is None and s["goodput"] is None and s["slo_attainment"] is None
    counts = [s[f"num_{k}"] for k in ("finished", "rejected", "in_flight", "not_arrived")]
    assert counts == [3, 1, 1, 1] and sum(counts) == s["num_requests"] == 6
    assert s["rejection_reasons"] == {REASON: 1}
    assert s["num_preemptions"] == 1
    # key order follows vllm bench: ttft block, then tpot, itl, e2el
    keys = list(s)
    assert (
        keys.index("p99_ttft_ms")
        < keys.index("mean_tpot_ms")
        < keys.index("mean_itl_ms")
        < keys.index("mean_e2el_ms")
    )
    json.dumps(s, allow_nan=False)


def test_duration_without_horizon_is_first_arrival_to_last_finish():
    rows = [r for r in base_rows() if r["status"] in ("finished", "rejected")]
    s = summarize(make(rows=rows, horizon=None))
    assert s["duration"] == pytest.approx(4.5)  # last finish 4.5, last step ends at 4.5 too
    assert s["request_throughput"] == pytest.approx(3 / 4.5)


def test_time_weighted_kv_and_queue_means():
    s = summarize(make())
    assert s["mean_kv_cache_usage"] == pytest.approx((0.2 * 1 + 0.6 * 3) / 4)
    assert s["max_kv_cache_usage"] == 0.6
    assert s["mean_num_running"] == pytest.approx((1 * 1 + 3 * 3) / 4)
    assert s["mean_num_waiting"] == pytest.approx(3 / 4)
    assert s["max_num_waiting"] == 1


def test_peak_output_rate_and_concurrency():
    s = summarize(make())
    # 1-s buckets from t=0: first tokens at 1.0, 1.5, 2.25 -> buckets 1, 1, 2; 40 decode tokens at 4.5 -> 4
    assert s["max_output_tokens_per_s"] == 40.0
    # r0 [0,2], r1 [1,4.5], r2 [2,2.25] are all active in bucket 2
    assert s["max_concurrent_requests"] == 3


def test_prefix_hit_rate_from_meta_and_fallback():
    assert (
        summarize(make(meta={"prefix_cache": {"queries": 400, "hits": 100}}))["prefix_cache_hit_rate"] == 0.25
    )
    # fallback: cached tokens at first admission over admitted prompts (r0, r1, r2, r4)
    assert summarize(make())["prefix_cache_hit_rate"] == pytest.approx(48 / 360)


# ---- SLOs -----------------------------------------------------------------------------------------------
def test_goodput_per_request_slos():
    s = summarize(make(), slo={"ttft_ms": 600})
    assert s["request_goodput"] == pytest.approx(2 / 5) and s["goodput"] == s["request_goodput"]
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    # r0 has TTFT exactly 1000 ms: vllm counts metric <= slo as good
    assert summarize(make(), slo={"ttft_ms": 1000})["slo_attainment"] == 1.0
    # r2 has one output token, so its TPOT counts as 0 and passes any TPOT limit
    s = summarize(make(), slo={"ttft_ms": 1000, "tpot_ms": 50})
    assert s["slo_attainment"] == pytest.approx(1 / 3) and s["request_goodput"] == pytest.approx(1 / 5)
    assert summarize(make(), slo={"e2el_ms": 3000})["slo_attainment"] == pytest.approx(2 / 3)
    assert summarize(make(), slo={"itl_ms": 100.0001})["slo_attainment"] == 1.0
    assert summarize(make(), slo={"ttft_ms": 600})["slo"] == {"ttft_ms": 600}


def test_percentile_slos_are_in_ms():
    s = summarize(make(), slo={"p99_ttft_ms": 1000, "p50_ttft_ms": 400, "p50_itl_ms": 100, "p99.9_e2el_ms": 5000})
    checks = s["slo_checks"]
    assert checks["p99_ttft_ms"] == {"target": 1000, "value": pytest.approx(1000 * np.percentile([1, 0.5, 0.25], 99)),
                                     "met": True}  # fmt: skip
    assert checks["p50_ttft_ms"]["value"] == pytest.approx(500) and checks["p50_ttft_ms"]["met"] is False
    assert checks["p50_itl_ms"]["met"] is True
    assert checks["p99.9_e2el_ms"]["value"] == pytest.approx(1000 * np.percentile([2.0, 3.5, 0.25], 99.9))
    assert s["request_goodput"] is None  # no per-request SLO given


@pytest.mark.parametrize("bad", [{"ttft": 1.0}, {"latency_ms": 5}, {"ttft_ms": -1}, {"ttft_ms": "fast"},
                                 {"p101_ttft_ms": 1.0}, {"tpot_ms": float("nan")}, {"ttft_s": 1.0}])  # fmt: skip
def test_bad_slo_raises_config_error(bad):
    with pytest.raises(ConfigError, match=re.escape(list(bad)[0])):
        summarize(make(), slo=bad)


@pytest.mark.parametrize(("old", "new"), [({"ttft_p99": 1.0}, "p99_ttft_ms = 1000"),
                                          ({"tpot_p99": 0.05}, "p99_tpot_ms = 50"),
                                          ({"queue_time_p90": 2.5}, "p90_queue_time_ms = 2500")])  # fmt: skip
def test_old_seconds_percentile_keys_name_the_new_one(old, new):
    (key, value), = old.items()
    with pytest.raises(ConfigError, match=re.escape(f"{key} = {value} (seconds) is now {new}")):
        summarize(make(), slo=old)


def test_goodput_and_slo_args_parse_like_vllm():
    assert slo_from_goodput_args(["ttft:1000", "tpot:50"]) == {"ttft_ms": 1000.0, "tpot_ms": 50.0}
    assert slo_from_args(["p99_ttft:1000", "e2el:8000"]) == {"p99_ttft_ms": 1000.0, "e2el_ms": 8000.0}
    for bad, msg in ((["queue:5"], "unknown SLO name 'queue'"), (["ttft"], "expected NAME:MS"),
                     (["ttft:fast"], "not a number"), (["ttft:-1"], "positive"),
                     (["ttft_p99=1.0"], "ttft_p99=1.0 (seconds) is now --slo p99_ttft:1000 (milliseconds)"),
                     (["ttft_ms=500"], "--slo ttft:500")):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(msg)):
            slo_from_args(bad)
    with pytest.raises(ConfigError, match="unknown SLO name 'p99_ttft'"):
        slo_from_goodput_args(["p99_ttft:1000"])  # vllm's --goodput is per request only


# ---- integrity ------------------------------------------------------------------------------------------
def test_inconsistent_records_raise():
    rows = base_rows()
    rows[0]["status"] = "running"  # not one of the four states
    with pytest.raises(ResultsIntegrityError, match="running"):
        summarize(make(rows=rows))
    rows = base_rows()
    rows[1]["request_id"] = "r0"
    with pytest.raises(ResultsIntegrityError, match="twice"):
        summarize(make(rows=rows))
    with pytest.raises(ResultsIntegrityError, match="7 requests"):
        summarize(make(meta={"num_requests": 7}))
    rows = base_rows()
    rows[0]["finish_time"] = NAN
    with pytest.raises(ResultsIntegrityError, match="r0"):
        summarize(make(rows=rows))
    with pytest.raises(ResultsIntegrityError, match="lacks"):
        SimResult(pd.DataFrame(base_rows()).drop(columns="status"), pd.DataFrame(base_steps()),
                  np.zeros(0), np.zeros(0))  # fmt: skip
    with pytest.raises(ResultsIntegrityError, match="weights"):
        summarize(make(itl_v=(0.1,), itl_w=(-1,)))


def test_empty_results_do_not_crash(tmp_path):
    only_rejected = [req("a", 0.0, status="rejected", reason=REASON, cached=-1)]
    for res in (make(rows=[], steps=[], itl_v=(), itl_w=(), horizon=None),
                make(rows=only_rejected, steps=[], itl_v=(), itl_w=(), horizon=None)):  # fmt: skip
        s = summarize(res, slo={"ttft_ms": 100, "p99_ttft_ms": 1000})
        assert s["completed"] == 0 and s["request_throughput"] == 0 and s["output_throughput"] == 0
        for m in ("ttft", "tpot", "itl", "e2el"):
            assert s[f"mean_{m}_ms"] is None and s[f"p99_{m}_ms"] is None
        assert s["slo_attainment"] is None and s["slo_checks"]["p99_ttft_ms"]["met"] is False
        assert s["mean_kv_cache_usage"] is None
        assert list(time_series(res).columns) == list(TIMESERIES_COLUMNS)
        paths = write_outputs(res, tmp_path / str(len(res.requests)))
        assert json.loads(paths["summary"].read_text())["completed"] == 0


# ---- weighted percentiles -------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.integers(0, 6)), min_size=1, max_size=40
    ),
    qs=st.lists(st.floats(0, 100), min_size=1, max_size=5),
)
def test_weighted_percentile_equals_expanded(data, qs):
    v = np.array([d[0] for d in data])
    w = np.array([d[1] for d in data])
    if w.sum() == 0:
        return
    got = weighted_percentiles(v, w, qs)
    want = np.percentile(np.repeat(v, w), qs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_weighted_percentile_unit_weights_is_numpy(seed):
    rng = np.random.default_rng(seed)
    v = rng.exponential(0.05, size=rng.integers(1, 500))
    qs = [0, 1, 25, 50, 90, 95, 99, 99.9, 100]
    np.testing.assert_allclose(weighted_percentiles(v, np.ones(v.size, int), qs), np.percentile(v, qs),
                               rtol=1e-14, atol=0)  # fmt: skip
    w = rng.integers(1, 50, size=v.size)
    np.testing.assert_allclose(weighted_percentiles(v, w, qs), np.percentile(np.repeat(v, w), qs),
                               rtol=1e-13, atol=0)  # fmt: skip


# ---- time series ----------------------------------------------------------------------------------------
def test_time_series_bins_and_snapshots():
    ts = time_series(make())
    assert list(ts.columns) == list(TIMESERIES_COLUMNS)
    assert list(ts["t"]) == [1.0, 2.0, 3.0, 4.0, 5.0]
    # a prompt counts once, at its request's first token (vLLM V1): r0 100 at 1.0, r1 200 at 1.5,
    # r2 50 at 2.25, r4 10 at 4.8; the rejected and not-arrived requests never count
    assert list(ts["prompt_throughput"]) == [100, 200, 50, 0, 10]
    # first tokens at 1.0, 1.5, 2.25, 4.8 plus 40 decode tokens at 4.5
    assert list(ts["gen_throughput"]) == [1, 1, 1, 0, 41]
    # at t=5 the last step (ended 4.5) has finished 2 of its 3: the engine is idle with 1 left
    assert list(ts["running"]) == [1, 3, 3, 3, 1]
    assert list(ts["waiting"]) == [0, 1, 1, 1, 1]
    assert ts["kv_cache_pct"].tolist() == pytest.approx([20, 60, 60, 60, 60])


def test_time_series_idle_after_last_step_and_replicas():
    steps = [step(0, 0.0, 0.5, decode=4, running=2, finished=2, kv=0.5),
             step(0, 0.0, 0.5, decode=6, running=1, waiting=2, kv=0.3, replica=1),
             step(1, 0.5, 2.0, decode=6, running=1, finished=1, kv=0.3, replica=1)]  # fmt: skip
    rows = [req("a", 0.0, 0.0, NAN, 0.5, 2), req("b", 0.0, 0.0, NAN, 0.5, 2),
            req("c", 0.0, 0.0, NAN, 2.5, 12, replica=1)]  # fmt: skip
    res = make(rows=rows, steps=steps, horizon=None)
    ts = time_series(res)
    # at t=1: replica 0 idle with nothing running, replica 1 mid-step with 1 running
    assert list(ts["running"]) == [1, 1, 0]
    assert ts["kv_cache_pct"].tolist() == pytest.approx([15, 15, 0])
    per = time_series(res, by_replica=True)
    assert set(per["replica"]) == {0, 1} and len(per) == 6
    with pytest.raises(ConfigError):
        time_series(res, interval=0)


def test_time_series_read_a_chunk_at_a_time_equals_a_tick_by_tick_reference(monkeypatch):
    """The step stores are read in chunks, each touching only the ticks its starts cover (a million-request
    run has ~500k one-second ticks and ~80 chunks): chunks of 7 steps give the series one chunk gives, and
    both match each tick's latest step looked up over the whole step table (idle gaps included)."""
    import sim.app.timeseries as ts_mod
    from sim.app.config import load_config
    from sim.app.simulate import simulate

    root = Path(__file__).resolve().parents[1]
    res = simulate(load_config(root / "examples" / "quickstart.toml",
                               ["workload.num_requests=120", "workload.rate=0.4", "frontend.enabled=false"]))  # fmt: skip
    got = {}
    for chunk in (7, 1 << 30):
        monkeypatch.setattr(ts_mod, "_CHUNK", chunk)
        got[chunk] = [time_series(res, iv) for iv in (1.0, 0.37, 13.0)]
    for a, b in zip(got[7], got[1 << 30], strict=True):
        pd.testing.assert_frame_equal(a, b)
    steps = res.steps  # the whole table (the stores are emptied into it)
    start, end = steps["start"].to_numpy(), (steps["start"] + steps["duration"]).to_numpy()
    for iv, ts in zip((1.0, 0.37, 13.0), got[7], strict=True):
        t = ts["t"].to_numpy()
        j = np.searchsorted(start, t, side="right") - 1
        has, j = j >= 0, np.maximum(j, 0)  # no step yet: nothing running or waiting
        assert len(t) > 20
        run = steps["num_running"].to_numpy()[j]
        idle = end[j] <= t
        assert (idle & has).any() and (~idle).any()  # ticks in gaps and inside steps both checked
        run = np.where(idle, np.maximum(run - steps["num_finished"].to_numpy()[j], 0), run)
        assert ts["running"].tolist() == np.where(has, run, 0).tolist()
        assert ts["waiting"].tolist() == np.where(has, steps["num_waiting"].to_numpy()[j], 0).tolist()
        tick = np.clip(np.ceil(end / iv - 1e-9).astype(np.int64) - 1, 0, len(t) - 1)
        decode = np.bincount(tick, weights=steps["num_decode_tokens"].to_numpy(float), minlength=len(t))
        first = res.requests["first_token_time"].dropna().to_numpy()
        firsts = np.bincount(np.clip(np.ceil(first / iv - 1e-9).astype(np.int64) - 1, 0, len(t) - 1), minlength=len(t))
        np.testing.assert_allclose(ts["gen_throughput"].to_numpy(), (decode + firsts) / iv, rtol=1e-12)


def test_time_series_columns_match_real_vllm_log():
    real = SHARED / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19" / "timeseries.csv"
    if not real.exists():
        pytest.skip("shared data not available")
    assert list(pd.read_csv(real, nrows=2).columns) == list(time_series(make()).columns)


# ---- files ----------------------------------------------------------------------------------------------
def test_write_outputs_writes_everything(tmp_path):
    res = make()
    paths = write_outputs(res, tmp_path / "run" / "nested", slo={"ttft_ms": 600}, title="my test run")
    for name in ("requests.parquet", "steps.parquet", "steps.jsonl", "summary.json", "timeseries.csv",
                 "report.html"):  # fmt: skip
        assert (tmp_path / "run" / "nested" / name).is_file()
    summary = json.loads(paths["summary"].read_text())
    for k in VLLM_KEYS + ("mean_ttft_ms", "p99_itl_ms", "median_e2el_ms", "std_tpot_ms", "config"):
        assert k in summary
    assert summary["request_goodput"] == pytest.approx(2 / 5)
    assert summary["config"] == {"policy": "vllm"}
    rq = pd.read_parquet(paths["requests"])
    assert {"ttft_s", "tpot_s", "e2el_s", "queue_time_s", "arrival_time"} <= set(rq.columns) and len(rq) == 6
    assert not {"ttft", "tpot", "e2el", "queue_time"} & set(rq.columns)  # every duration says its unit
    assert list(pd.read_parquet(paths["steps"]).columns) == [c if c != "duration" else "duration_s"
                                                             for c in STEP_COLUMNS]  # fmt: skip
    lines = [json.loads(x) for x in paths["step_trace"].read_text().splitlines()]
    assert len(lines) == 2 and lines[1]["scheduled"] == 290 and lines[1]["kv_usage"] == 0.6
    assert {"time", "preempted", "finished", "num_running", "num_waiting", "num_free_blocks"} <= set(lines[0])
    assert list(pd.read_csv(paths["timeseries"]).columns) == list(TIMESERIES_COLUMNS)
    assert "my test run" in paths["report"].read_text()


def test_write_outputs_uses_step_trace_when_given(tmp_path):
    trace = [{"time": 0.0, "x": np.int64(3)}, {"time": 1.0, "x": float("nan")}]
    paths = write_outputs(make(trace=trace), tmp_path)
    assert [json.loads(x) for x in paths["step_trace"].read_text().splitlines()] == [
        {"time": 0.0, "x": 3}, {"time": 1.0, "x": None}]  # fmt: skip
