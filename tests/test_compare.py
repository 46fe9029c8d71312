"""servesim compare / fit --from-run / run --intervals: small replays of the fixtures (tests/data/runs), the
shared real runs when ../shared is there (capped), the interval's arithmetic and its coverage by simulation."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.app.compare import compare
from sim.app.intervals import calibration_residuals, prediction_interval, upper_prediction_bound
from sim.app.replay import ConcurrencyLimitedSource, prepare, simulate_replay
from sim.core.errors import ConfigError
from sim.core.request import RequestSpec
from sim.cost.profiles import CalibrationProfile
from workloads.runs import load_run

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "runs"
BENCH = DATA / "vllm_bench_result.json"
PROM = DATA / "prometheus"
H100_RAW = ROOT.parent / "shared" / "data" / "e2e" / "h100-llama-2-7b-vllm-0.15" / "raw"
RTX = ROOT.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim.cli.main", *argv], cwd=ROOT, capture_output=True, text=True)


def test_compare_json_has_the_files_values_and_signed_errors(tmp_path):
    out = cli("compare", str(BENCH), "--json", "--out", str(tmp_path / "rep"))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    res = json.loads(BENCH.read_text())
    ov = d["overall"]
    assert ov["ttft_mean_ms"]["real"] == res["mean_ttft_ms"] and ov["e2el_p99_ms"]["real"] == res["p99_e2el_ms"]
    assert ov["itl_mean_ms"]["real"] == res["mean_itl_ms"]
    for m in ov.values():
        if m["error_pct"] is not None:
            assert m["error_pct"] == pytest.approx(100 * (m["sim"] / m["real"] - 1))
    assert len(d["stages"]) == 1 and d["settings"]["gpu"] == "RTX 4090" and d["settings"]["max_num_seqs"] == 64
    assert d["settings"]["frontend"] is not None  # client-side run: the [frontend] priors are on
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "plotly" in html and "real" in html and (tmp_path / "rep" / "comparison.json").is_file()


def test_compare_prometheus_needs_the_load():
    out = cli("compare", str(PROM), "--gpu", "RTX 4090", "--set", "engine.max_model_len=8192")
    assert out.returncode == 2 and "workload.rate" in out.stderr and out.stderr.count("\n") == 1
    out = cli("compare", str(PROM), "--gpu", "RTX 4090", "--set", "engine.max_model_len=8192", "--set",
              "workload.rate=2", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    ov = json.loads(out.stdout)["overall"]
    assert ov["completed"] == {"real": 60.0, "sim": 60.0, "error_pct": 0.0}
    assert "queue_time_mean_ms" not in ov or ov["queue_time_mean_ms"]["real"] == pytest.approx(0.0)


@pytest.mark.parametrize("argv, msg", [
    (["compare", "nope.json"], "run not found"),
    (["compare", str(BENCH), "--set", "workload.prompt=3"], "workload.{rate"),
    (["compare", str(BENCH), "--gpu", "Z80"], "not in the catalogue"),
    (["compare", str(BENCH), "--max-per-stage", "0"], "max_per_stage must be >= 1"),
    (["fit", "--from-run", str(BENCH)], "give --out PROFILE.json"),
    (["fit", "x.csv", "--holdout", "0.2", "0.3"], "without --from-run it takes one fraction"),
])  # fmt: skip
def test_bad_input_is_one_line(argv, msg):
    out = cli(*argv)
    assert out.returncode == 2 and msg in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_concurrency_limit_holds_requests_back():
    specs = [RequestSpec(request_id=str(i), arrival_time=0.0, prompt_len=10, output_len=2) for i in range(3)]
    src = ConcurrencyLimitedSource(specs, 2)
    assert [s.request_id for s in src.pop_due(0.0)] == ["0", "1"] and src.peek_time() is None
    src.on_done(specs[0], 1.5)
    assert src.peek_time() == 1.5 and src.pop_due(1.0) == []
    (s2,) = src.pop_due(1.5)
    assert s2.request_id == "2" and s2.arrival_time == 1.5  # sent when the slot came free


def test_replay_with_max_concurrency_never_exceeds_it():
    run = load_run(BENCH)
    rep = prepare(run, overrides=["workload.max_concurrency=2", "frontend.enabled=false"])
    df, _ = simulate_replay(rep)
    t = sorted([(a, 1) for a in df["arrival_time"]] + [(f, -1) for f in df["finish_time"]], key=lambda x: (x[0], x[1]))
    assert max(np.cumsum([d for _, d in t])) <= 2 and df["ok"].all()


def test_fit_from_run_writes_a_profile_compare_uses(tmp_path):
    prof = tmp_path / "my.json"
    out = cli("fit", "--from-run", str(BENCH), "--out", str(prof), "--max-nfev", "2")
    assert out.returncode == 0, out.stderr
    assert "fit error per run" in out.stdout and "gemm_scale" in out.stdout
    p = CalibrationProfile.load(prof)
    meta = p.metadata
    assert p.source == "fitted" and meta["fitted_from_runs"][0]["source"] == str(BENCH)
    assert set(meta["frontend"]) >= {"request_overhead_s", "output_s_per_request"}
    cal = meta["calibration"]["residuals_log"]
    assert all(len(cal[m]) == 1 for m in ("ttft_mean_ms", "ttft_p99_ms", "e2el_p50_ms", "itl_mean_ms"))
    # one residual of P99 TTFT is too few alone: the TTFT family's four (mean, P50, P90, P99) are pooled
    assert sorted(calibration_residuals(p, "p99_ttft_ms")) == sorted(cal[m][0] for m in cal if m.startswith("ttft"))
    c = compare(load_run(BENCH), profile=str(prof))
    assert c.replay.settings["profile_path"] == str(prof)
    fe = c.replay.cfg.frontend
    assert fe.request_overhead_s == pytest.approx(meta["frontend"]["request_overhead_s"])  # the fitted front end


def test_calibration_residuals_exact_or_pooled():
    from sim.app.intervals import metric_key

    assert metric_key("p99_ttft_ms") == metric_key("ttft_p99") == "ttft_p99_ms"
    assert metric_key("median_tpot_ms") == "tpot_p50_ms" and metric_key("request_throughput") is None
    p = CalibrationProfile(metadata={"calibration": {"residuals_log": {"ttft_p99_ms": [-0.3, -0.2, -0.25],
                                                                       "ttft_mean_ms": [0.01], "e2el_mean_ms": [0.02]}}})
    assert list(calibration_residuals(p, "ttft_p99")) == [-0.3, -0.2, -0.25]  # three of its own: used alone
    assert sorted(calibration_residuals(p, "mean_ttft_ms")) == [-0.3, -0.25, -0.2, 0.01]  # else the family's
    assert len(calibration_residuals(p, "output_throughput")) == 0


def test_interval_arithmetic():
    # no residuals: Student t over the replications' logs, centred on their geometric mean
    vals = [100.0, 110.0, 90.0]
    pi = prediction_interval(vals, (), 0.9)
    y = np.log(vals)
    from scipy import stats

    half = stats.t.ppf(0.95, 2) * y.std(ddof=1) * math.sqrt(1 + 1 / 3)
    assert pi["low"] == pytest.approx(math.exp(y.mean() - half)) and not pi["calibrated"]
    # residuals shift the centre by their mean bias (sim 20 % high -> real predicted lower)
    pi2 = prediction_interval([120.0], [math.log(1.2)] * 2 + [math.log(1.25), math.log(1.15)], 0.9)
    assert pi2["center"] == pytest.approx(120.0 / math.exp(np.mean([math.log(1.2)] * 2 + [math.log(1.25),
                                                                                          math.log(1.15)])))
    assert pi2["low"] < pi2["center"] < pi2["high"] and pi2["n_calibration"] == 4
    assert upper_prediction_bound([120.0], [math.log(1.2)] * 2 + [math.log(1.25), math.log(1.15)]) < pi2["high"]
    with pytest.raises(ConfigError):
        prediction_interval(vals, (), 1.5)


def test_interval_covers_at_its_level_when_its_model_holds():
    """Monte Carlo: real = exp(true), sim replications = true + bias + N(0, s_rep), calibration residuals are
    past errors of the same kind. The 90 % interval must contain the real value about 90 % of the time."""
    rng = np.random.default_rng(3)
    hits, trials = 0, 2000
    for _ in range(trials):
        true = rng.normal(3.0, 1.0)
        bias, s_cal, s_rep = 0.08, 0.05, 0.03
        resid = bias + rng.normal(0, s_cal, 6) + rng.normal(0, s_rep, 6)
        run_err = bias + rng.normal(0, s_cal)
        sims = np.exp(true + run_err + rng.normal(0, s_rep, 4))
        pi = prediction_interval(sims, resid, 0.9)
        hits += pi["low"] <= math.exp(true) <= pi["high"]
    assert 0.86 <= hits / trials <= 0.95


def test_run_intervals_cli(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text((ROOT / "examples" / "quickstart.toml").read_text())
    out = cli("run", str(cfg), "--intervals", "--replications", "2", "--set", "workload.num_requests=30", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    rows = {r["metric"]: r for r in d["intervals"]}
    assert d["replications"] == 2 and not d["calibrated"]  # the shipped profile was not fitted on runs
    r = rows["p99_ttft_ms"]
    assert r["low"] <= r["center"] <= r["high"] and r["n_replications"] == 2


@pytest.mark.skipif(not RTX.is_dir(), reason="../shared RTX 4090 run absent")
def test_compare_the_real_rtx_run():
    c = compare(load_run(RTX))
    ov = c.overall
    assert ov["ttft_mean_ms"]["real"] == pytest.approx(65486.3, abs=0.1)  # what requests.jsonl says
    assert abs(ov["e2el_mean_ms"]["error_pct"]) < 10 and set(c.timeseries) == {"running", "waiting", "kv_cache_pct"}
    assert c.timeseries["waiting"]["corr"] > 0.9


@pytest.mark.skipif(not H100_RAW.is_dir(), reason="../shared H100 runs absent")
def test_compare_a_capped_h100_run():
    run = load_run(H100_RAW / "20260217-155451-llama-2-7b-tp1-codegen")
    c = compare(run, gpu="H100", max_per_stage=60)
    assert [st["n_sim"] for st in c.stages] == [60, 60] and c.replay.settings["warmup_requests"] > 0
    st0 = c.stages[0]["metrics"]
    assert st0["ttft_mean_ms"]["real"] == pytest.approx(25.0366, abs=1e-3)
    assert "completed" not in st0  # a capped stage's counts are not compared
    assert abs(st0["e2el_mean_ms"]["error_pct"]) < 10 and abs(st0["itl_mean_ms"]["error_pct"]) < 10


def test_compare_and_fit_progress_bars_change_nothing(capsys):
    """The bars (forced on: stderr is not a terminal here) are drawn and the numbers are the same."""
    from sim.app.runfit import fit_runs

    run = load_run(BENCH)
    plain = compare(run, max_per_stage=20).to_dict()
    barred = compare(run, max_per_stage=20, progress=True).to_dict()
    assert barred == plain
    a = fit_runs([run], None, max_per_stage=10, max_nfev=1)
    b = fit_runs([run], None, max_per_stage=10, max_nfev=1, progress=True)
    assert a.params == b.params
    assert "fit" in capsys.readouterr().err  # the evaluations bar went to stderr
