"""workloads/runs: each importer's real values equal what its file says (fixtures built from the documented
schemas in tests/data/runs; the shared real runs when ../shared is there), and bad input is one clear error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.core.errors import TraceFormatError
from workloads.runs import load_run, sniff_run
from workloads.runs.prometheus import histogram_quantile
from workloads.tracefmt import load_trace, sniff_format

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "runs"
BENCH = DATA / "vllm_bench_result.json"
PROM = DATA / "prometheus"
SHARED = ROOT.parent / "shared" / "data" / "e2e"
H100_RAW = SHARED / "h100-llama-2-7b-vllm-0.15" / "raw"
RTX = SHARED / "rtx4090-llama-3.1-8b-vllm-0.19"
needs_h100 = pytest.mark.skipif(not H100_RAW.is_dir(), reason="../shared H100 runs absent")
needs_rtx = pytest.mark.skipif(not RTX.is_dir(), reason="../shared RTX 4090 run absent")


# ---- vllm bench serve result ------------------------------------------------------------------------------
def test_vllm_bench_values_equal_the_file():
    res = json.loads(BENCH.read_text())
    run = load_run(BENCH)
    assert sniff_run(BENCH) == "vllm-bench" and run.basis == "client"
    m = run.overall
    for word, stat in (("mean", "mean"), ("median", "p50"), ("p99", "p99")):
        for metric in ("ttft", "tpot", "itl", "e2el"):
            assert m[f"{metric}_{stat}_ms"] == res[f"{word}_{metric}_ms"], (metric, stat)
    ok = np.array([not e for e in res["errors"]])
    lat = np.asarray(res["latencies"])[ok]
    assert m["e2el_p90_ms"] == pytest.approx(1e3 * np.percentile(lat, 90), rel=1e-12)  # not in the file: computed
    assert m["request_throughput"] == res["request_throughput"] and m["completed"] == res["completed"]
    # the workload: successes only, at their recorded send times, with their actual lengths
    assert len(run.specs) == int(ok.sum()) == 39
    start = np.asarray(res["start_times"])
    assert [s.arrival_time for s in run.specs] == pytest.approx(sorted(start[ok] - start.min()))
    assert sorted(s.prompt_len for s in run.specs) == sorted(np.asarray(res["input_lens"])[ok].tolist())
    assert run.engine == {"max_num_seqs": 64, "max_model_len": 8192} and run.hardware == {"gpu": "RTX 4090"}
    assert run.model == "meta-llama/Llama-3.1-8B" and run.arrivals == "recorded"


def test_vllm_bench_without_start_times_redraws_the_process(tmp_path):
    res = json.loads(BENCH.read_text())
    for k in ("start_times", "latencies"):
        del res[k]
    res["request_rate"], res["burstiness"] = 2.0, 4.0
    p = tmp_path / "r.json"
    p.write_text(json.dumps(res))
    run = load_run(p)
    t = np.array([s.arrival_time for s in run.specs])
    assert "redrawn: gamma at 2 req/s" in run.arrivals and np.all(np.diff(t) >= 0)
    # E2E of old files: TTFT + the sum of the request's gaps
    i = next(i for i, e in enumerate(res["errors"]) if not e)
    e2e = res["ttfts"][i] + sum(res["itls"][i])
    assert run.requests.set_index("request_id").loc[str(i), "e2el"] == pytest.approx(e2e)


def test_vllm_bench_errors_name_what_is_missing(tmp_path):
    res = json.loads(BENCH.read_text())
    del res["itls"], res["ttfts"]
    p = tmp_path / "short.json"
    p.write_text(json.dumps(res))
    with pytest.raises(TraceFormatError, match=r"ttfts, itls missing\): run vllm bench serve with --save-result "
                                               r"--save-detailed"):
        load_run(p)
    res2 = json.loads(BENCH.read_text())
    res2["ttfts"] = res2["ttfts"][:3]
    p.write_text(json.dumps(res2))
    with pytest.raises(TraceFormatError, match="ttfts: expected a list of 40 entries"):
        load_run(p)
    p.write_text(BENCH.read_text() + "\n" + BENCH.read_text())
    with pytest.raises(TraceFormatError, match="holds 2 results"):
        load_run(p, "vllm-bench")


def test_trace_stats_recognises_a_bench_result():
    assert sniff_format(BENCH) == "vllm-bench-result"
    t = load_trace(BENCH)
    assert len(t.specs) == 39 and t.num_failed == 1
    out = subprocess.run([sys.executable, "-m", "sim.cli.main", "trace", "stats", str(BENCH), "--json"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["format"] == "vllm-bench-result"


# ---- Prometheus scrapes -----------------------------------------------------------------------------------
def _sample(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_prometheus_values_equal_the_scrapes():
    before = (PROM / "metrics_before.prom").read_text()
    after = (PROM / "metrics_after.prom").read_text()
    run = load_run(PROM)
    assert sniff_run(PROM) == "prometheus" and run.basis == "engine" and run.arrivals == "unknown"
    n = _sample(after, "vllm:request_success_total") - _sample(before, "vllm:request_success_total")
    assert run.overall["completed"] == n == len(run.specs) == 60
    for metric, name in (("ttft", "vllm:time_to_first_token_seconds"), ("e2el", "vllm:e2e_request_latency_seconds"),
                         ("itl", "vllm:inter_token_latency_seconds")):  # fmt: skip
        s = _sample(after, f"{name}_sum") - _sample(before, f"{name}_sum")
        c = _sample(after, f"{name}_count") - _sample(before, f"{name}_count")
        assert run.overall[f"{metric}_mean_ms"] == pytest.approx(1e3 * s / c, rel=1e-12)
    ptoks = _sample(after, "vllm:request_prompt_tokens_sum") - _sample(before, "vllm:request_prompt_tokens_sum")
    assert np.mean([s.prompt_len for s in run.specs]) == pytest.approx(ptoks / n, abs=0.5)  # the mean is kept
    assert run.engine == {"block_size": 16, "num_gpu_blocks_override": 2588, "gpu_memory_utilization": 0.9,
                          "enable_prefix_caching": True}  # fmt: skip


def test_histogram_quantile_is_prometheus_linear_rule():
    les = np.array([1.0, 2.0, 4.0, np.inf])
    cum = np.array([10.0, 30.0, 40.0, 40.0])
    assert histogram_quantile(0.5, les, cum) == pytest.approx(1.5)  # rank 20: halfway through (1, 2]
    assert histogram_quantile(0.25, les, cum) == pytest.approx(1.0)
    assert histogram_quantile(0.9, les, cum) == pytest.approx(2.0 + 2.0 * 6 / 10)
    assert histogram_quantile(0.99, les, np.array([10.0, 30.0, 30.0, 40.0])) == 4.0  # in +Inf: largest finite le


def test_prometheus_single_file_and_errors(tmp_path):
    one = tmp_path / "after.prom"
    one.write_text((PROM / "metrics_after.prom").read_text())
    assert load_run(one).overall["completed"] == 62  # a fresh server: everything since start
    bad = tmp_path / "x.prom"
    bad.write_text("# TYPE foo counter\nfoo_total 3\n")
    with pytest.raises(TraceFormatError, match="not a run file servesim knows"):
        load_run(bad)
    with pytest.raises(TraceFormatError, match="no vllm:\\* metrics"):
        load_run(bad, "prometheus")


# ---- per-request engine JSONL ------------------------------------------------------------------------------
def test_engine_jsonl_clock_alignment(tmp_path):
    # engine clock = client clock - 1000 s; request 0 reaches an idle engine 5 ms after its send
    rows = [{"input_toks": 100, "output_toks": 11, "arrival_time": 5000.0, "queued_ts": 4000.005,
             "scheduled_ts": 4000.006, "first_token_ts": 4000.105, "last_token_ts": 4001.105},
            {"input_toks": 50, "output_toks": 2, "arrival_time": 5000.5, "queued_ts": 4000.520,
             "scheduled_ts": 4000.6, "first_token_ts": 4000.705, "last_token_ts": 4000.805}]  # fmt: skip
    p = tmp_path / "requests.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = load_run(p)
    assert run.format == "engine-jsonl" and run.basis == "engine_aligned"
    d = run.requests
    assert d["ttft"].tolist() == pytest.approx([0.1, 0.2])  # first token (aligned by the 5 ms lag) - send
    assert d["e2el"].tolist() == pytest.approx([1.1, 0.3]) and d["tpot"].tolist() == pytest.approx([0.1, 0.1])
    assert [s.arrival_time for s in run.specs] == pytest.approx([0.0, 0.5])
    rows[1].pop("first_token_ts")
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceFormatError, match=r"requests.jsonl:2: missing or non-numeric first_token_ts"):
        load_run(p, "engine-jsonl")


@needs_rtx
def test_engine_jsonl_real_run_values():
    run = load_run(RTX)
    rows = [json.loads(x) for x in (RTX / "requests.jsonl").read_text().splitlines() if x.strip()]
    out = np.array([r["output_toks"] for r in rows], float)
    tpot = np.array([(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows])
    assert run.overall["tpot_mean_ms"] == pytest.approx(1e3 * tpot[out > 1].mean(), rel=1e-9)  # clock-free
    assert len(run.specs) == 300 and run.specs[0].token_ids is not None  # the workload file's real token ids
    assert run.engine["num_gpu_blocks_override"] == 2588 and run.hardware["gpu"] == "NVIDIA GeForce RTX 4090"
    assert list(run.timeseries.columns[:2]) == ["t", "prompt_throughput"]


# ---- inference-perf ----------------------------------------------------------------------------------------
@needs_h100
@pytest.mark.parametrize("name", sorted(p.name for p in H100_RAW.iterdir()) if H100_RAW.is_dir() else [])
def test_inference_perf_values_equal_the_files(name):
    d = H100_RAW / name
    run = load_run(d)
    assert sniff_run(d) == "inference-perf" and run.basis == "client"
    for k, st in enumerate(run.stages):
        f = json.loads((d / "results" / f"stage_{k}_lifecycle_metrics.json").read_text())
        lat = f["successes"]["latency"]
        m = run.measured[k]
        assert m["ttft_mean_ms"] == 1e3 * lat["time_to_first_token"]["mean"]
        assert m["ttft_p90_ms"] == 1e3 * lat["time_to_first_token"]["p90"]
        assert m["e2el_p99_ms"] == 1e3 * lat["request_latency"]["p99"]
        assert m["e2el_p50_ms"] == 1e3 * lat["request_latency"]["median"]
        assert m["request_throughput"] == f["successes"]["throughput"]["requests_per_sec"]
        assert m["completed"] == f["successes"]["count"] and m["failed"] == f["failures"]["count"]
        assert st.num_requests == round(st.rate * st.duration_s)  # constant load, evenly spaced
    assert run.engine == {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "max_model_len": 4096}
    assert run.hardware == {"tensor_parallel_size": 1} and run.client_timeout_s == 300.0


def test_inference_perf_per_request_records(tmp_path):
    """A results directory with per-request lifecycle records (newer ``info`` layout): recorded arrivals."""
    res = tmp_path / "results"
    res.mkdir()
    (res / "config.yaml").write_text("load:\n  type: constant\n  stages:\n  - rate: 2.0\n    duration: 2\n"
                                     "data:\n  type: random\nserver:\n  ignore_eos: false\n")
    block = {"mean": 0.05, "median": 0.05, "p90": 0.06, "p99": 0.07}
    stage = {"successes": {"count": 4, "latency": {"time_to_first_token": block, "request_latency": block},
                           "throughput": {"requests_per_sec": 2.0}}, "failures": {"count": 0}}
    (res / "stage_0_lifecycle_metrics.json").write_text(json.dumps(stage))
    recs = [{"stage_id": 0, "scheduled_time": 10 + i / 2, "start_time": 10 + i / 2 + 0.001, "end_time": 11 + i / 2,
             "request_data": "same prompt" if i % 2 else f"p{i}", "error": None,
             "info": {"request_metrics": {"text": {"input_tokens": 20 + i}},
                      "response_metrics": {"output_tokens": 5, "output_token_times": [10.2 + i / 2, 10.9 + i / 2]}}}
            for i in range(4)]  # fmt: skip
    (res / "per_request_lifecycle_metrics.json").write_text(json.dumps(recs))
    (tmp_path / "exp-config.yaml").write_text("model: meta-llama/Llama-2-7b-hf\nmax_num_seqs: 8\n")
    run = load_run(tmp_path)
    assert run.arrivals == "recorded" and [s.prompt_len for s in run.specs] == [20, 21, 22, 23]
    assert [s.arrival_time for s in run.specs] == pytest.approx([0, 0.5, 1.0, 1.5])
    assert run.specs[1].segments[0][0] == run.specs[3].segments[0][0] != run.specs[0].segments[0][0]  # same text
    assert run.measured[0]["ttft_mean_ms"] == 50.0  # the aggregate file wins; records fill what it lacks
    assert run.measured[0]["tpot_p50_ms"] == pytest.approx(1e3 * (0.999 - 0.199) / 4)
    assert run.engine == {"max_num_seqs": 8} and run.client_timeout_s == 300.0


def test_unknown_run_is_one_clear_error(tmp_path):
    with pytest.raises(TraceFormatError, match="run not found"):
        load_run(tmp_path / "nope")
    with pytest.raises(TraceFormatError, match="not a run directory servesim knows"):
        load_run(tmp_path)
