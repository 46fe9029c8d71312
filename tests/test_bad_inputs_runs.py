"""Bad real-run files (vllm bench result JSON, per-request engine JSONL with meta.json / timeseries.csv,
inference-perf results) and the compare / fit --from-run flags around them: one line naming the file, the
record and the field, exit code 2, before any engine runs (hostile-input sweep 2: T1, T2, T5, T6, T7, S9,
S10, U1, U3). The harness is tests/test_bad_inputs.py's; every input is built under tmp_path from the
fixtures the importers' own tests use. Valid runs of each loader still load (last tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json"
RTX = ROOT.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"

# ---- builders ------------------------------------------------------------------------------------------


def _bench(tmp: Path, change=None, raw: bytes | None = None) -> str:
    """The vllm bench result fixture with ``change(res)`` applied (or ``raw`` bytes instead)."""
    p = tmp / "bench.json"
    if raw is not None:
        p.write_bytes(raw)
        return str(p)
    res = json.loads(BENCH.read_text())
    if change is not None:
        change(res)
    p.write_text(json.dumps(res))  # NaN / Infinity as Python's json writes them (vLLM's json.dump does too)
    return str(p)


def _set(key, value):
    def change(res):
        res[key] = value

    return change


def _set_at(key, i, value):
    def change(res):
        res[key][i] = value

    return change


# Two requests with vLLM's engine timestamps (engine clock = client clock - 1000 s), as tests/test_runs.py.
EJ_ROWS = [{"input_toks": 100, "output_toks": 11, "arrival_time": 5000.0, "queued_ts": 4000.005,
            "scheduled_ts": 4000.006, "first_token_ts": 4000.105, "last_token_ts": 4001.105},
           {"input_toks": 50, "output_toks": 2, "arrival_time": 5000.5, "queued_ts": 4000.520,
            "scheduled_ts": 4000.6, "first_token_ts": 4000.705, "last_token_ts": 4000.805}]  # fmt: skip
META = {"model": "meta-llama/Llama-3.1-8B", "engine_kwargs": {"tensor_parallel_size": 1, "max_model_len": 8192},
        "kv_cache": {"block_size": 16}, "hardware": {"device_name": "NVIDIA GeForce RTX 4090"}}  # fmt: skip
TS = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,100.0,2.0,1,0,1.5\n"


def _ej(tmp: Path, row0: dict | None = None, rows: list | None = None, meta: object = META,
        meta_raw: bytes | None = None, ts: str | bytes | None = None, lines: bytes | None = None) -> str:  # fmt: skip
    """A directory with requests.jsonl (EJ_ROWS, row 0 updated by ``row0``), meta.json and timeseries.csv."""
    d = tmp / "ejrun"
    d.mkdir(parents=True, exist_ok=True)
    rs = [dict(r) for r in (rows if rows is not None else EJ_ROWS)]
    if row0:
        rs[0].update(row0)
    if lines is not None:
        (d / "requests.jsonl").write_bytes(lines)
    else:
        (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    if meta_raw is not None:
        (d / "meta.json").write_bytes(meta_raw)
    elif meta is not None:
        (d / "meta.json").write_text(json.dumps(meta))
    if ts is not None:
        (d / "timeseries.csv").write_bytes(ts if isinstance(ts, bytes) else ts.encode())
    return str(d)


def _ip(tmp: Path, stage: str = "  - rate: 2.0\n    duration: 2\n", exp: str = "model: meta-llama/Llama-2-7b-hf\n",
        rec0: dict | None = None, records: bool = True) -> str:  # fmt: skip
    """An inference-perf results directory (tests/test_runs.py's fixture) with one change."""
    res = tmp / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "config.yaml").write_text(f"load:\n  type: constant\n  stages:\n{stage}data:\n  type: random\n"
                                     "server:\n  ignore_eos: false\n")  # fmt: skip
    block = {"mean": 0.05, "median": 0.05, "p90": 0.06, "p99": 0.07}
    stage_m = {"successes": {"count": 4, "latency": {"time_to_first_token": block, "request_latency": block},
                             "throughput": {"requests_per_sec": 2.0}, "prompt_len": {"mean": 20.0},
                             "output_len": {"mean": 5.0}}, "failures": {"count": 0}}  # fmt: skip
    (res / "stage_0_lifecycle_metrics.json").write_text(json.dumps(stage_m))
    recs = [{"stage_id": 0, "start_time": 10 + i / 2 + 0.001, "end_time": 11 + i / 2, "request_data": f"p{i}",
             "error": None, "info": {"input_tokens": 20 + i, "output_tokens": 5,
                                     "output_token_times": [10.2 + i / 2, 10.9 + i / 2]}}
            for i in range(4)]  # fmt: skip
    if rec0:
        recs[0].update(rec0)
    if records:
        (res / "per_request_lifecycle_metrics.json").write_text(json.dumps(recs))
    (tmp / "exp-config.yaml").write_text(exp)
    return str(tmp)


def _info(**kw):
    base = {"input_tokens": 20, "output_tokens": 5, "output_token_times": [10.2, 10.9]}
    return {"info": {**base, **kw}}


GPU = ["--gpu", "RTX 4090"]
EJ = ["--set", "engine.max_model_len=8192"]
IP = ["--gpu", "RTX 4090", "--set", "model.name=Llama-2-7B", "--set", "engine.max_model_len=4096"]


def cmp(*argv):
    return ["compare", *argv]


# (id, argv builder (tmp -> argv), fragments the one line must contain); one per root cause
CASES = [
    # T7: itls entries that are not numbers; max_concurrency that is not a positive integer
    ("vb-itl-str", lambda t: cmp(_bench(t, _set_at("itls", 0, ["a"]))), ["bench.json", "itls[0][0]", "'a'", "number"]),
    ("vb-itl-none", lambda t: cmp(_bench(t, _set_at("itls", 0, [None]))), ["itls[0][0]", "None"]),
    ("vb-itls-entry-str", lambda t: cmp(_bench(t, _set_at("itls", 0, "abc"))),
     ["itls[0]", "'abc'", "expected a list of numbers"]),
    ("vb-mc-nan", lambda t: cmp(_bench(t, _set("max_concurrency", math.nan))), ["max_concurrency", "nan", "integer"]),
    ("vb-mc-frac", lambda t: cmp(_bench(t, _set("max_concurrency", 2.5))), ["max_concurrency", "2.5"]),
    # S9: the bench result contradicting itself
    ("vb-itl-nan", lambda t: cmp(_bench(t, lambda r: r["itls"][0].__setitem__(0, math.nan))),
     ["itls[0][0]", "nan", "successful"]),
    ("vb-itl-neg", lambda t: cmp(_bench(t, lambda r: r["itls"][0].__setitem__(0, -5.0))), ["itls[0][0]", "-5.0"]),
    ("vb-ttft-after-e2el", lambda t: cmp(_bench(t, lambda r: r.__setitem__("ttfts", [x * 1000 for x in r["ttfts"]]))),
     ["ttfts[0]", "latencies[0]", "ttft <= latency"]),
    ("vb-start-huge", lambda t: cmp(_bench(t, lambda r: r.__setitem__(
        "start_times", [1e300 + i for i in range(len(r["start_times"]))]))), ["start_times[0]", "1e+300"]),
    ("vb-duration-zero", lambda t: cmp(_bench(t, _set("duration", 0))), ["'duration'", "got 0"]),
    ("vb-duration-str", lambda t: cmp(_bench(t, _set("duration", "13"))), ["'duration'", "'13'"]),
    # T2: token counts past int64
    ("vb-input-huge", lambda t: cmp(_bench(t, _set_at("input_lens", 0, 10**20))),
     ["input_lens[0]", "100000000000000000000"]),
    # T5 / T1: not UTF-8, nested past the recursion limit
    ("vb-latin1", lambda t: cmp(_bench(t, raw=BENCH.read_bytes().replace(b'"vllm"', b'"vll\xe9"', 1))),
     ["bench.json", "not UTF-8"]),
    ("vb-deep", lambda t: cmp(_bench(t, raw=b'{"duration": 1, "completed": 1, "x": ' + b"[" * 100000
                                     + b"]" * 100000 + b"}")), ["bench.json", "nested too deeply"]),
    # U3: the file's own redrawn arrivals out of the clock's range
    ("vb-rate-tiny", lambda t: cmp(_bench(t, lambda r: (r.pop("start_times"), r.__setitem__("request_rate", 1e-300)))),
     ["bench.json", "request_rate", "1e-300"]),
    # T6 / T5: meta.json and timeseries.csv beside requests.jsonl
    ("ej-meta-not-json", lambda t: cmp(_ej(t, meta_raw=b"{not json"), *GPU, *EJ), ["meta.json", "not valid JSON"]),
    ("ej-meta-list", lambda t: cmp(_ej(t, meta=[1, 2]), *GPU, *EJ), ["meta.json", "[1, 2]"]),
    ("ej-meta-latin1", lambda t: cmp(_ej(t, meta_raw=b'{"model": "caf\xe9"}'), *GPU, *EJ), ["meta.json", "not UTF-8"]),
    ("ej-meta-tp-str", lambda t: cmp(_ej(t, meta={**META, "engine_kwargs": {"tensor_parallel_size": "two"}}), *EJ),
     ["meta.json", "engine_kwargs.tensor_parallel_size", "'two'"]),
    ("ej-meta-table-str", lambda t: cmp(_ej(t, meta={**META, "kv_cache": "big"}), *EJ), ["meta.json", "kv_cache", "'big'"]),
    ("ej-ts-empty", lambda t: cmp(_ej(t, ts=""), *EJ), ["timeseries.csv", "empty"]),
    ("ej-ts-latin1", lambda t: cmp(_ej(t, ts=b"t,running\n1,\xe9\n"), *EJ), ["timeseries.csv", "not UTF-8"]),
    ("ej-ts-not-number", lambda t: cmp(_ej(t, ts="t,running\n1,many\n"), *EJ), ["timeseries.csv", "'running'", "'many'"]),
    ("ej-meta-dir", lambda t: (Path(_ej(t, meta=None)) / "meta.json").mkdir() or cmp(str(t / "ejrun"), *EJ, "--set",
                                                                                   "model.name=Llama-3.1-8B"),
     ["meta.json", "is a directory"]),
    # T6 / S9: per-request engine records
    ("ej-all-zero", lambda t: cmp(_ej(t, rows=[{**EJ_ROWS[0], **dict.fromkeys(
        ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"), 0)}]), *GPU, *EJ),
     ["requests.jsonl", "spans 0 s"]),
    ("ej-nan-queued", lambda t: cmp(_ej(t, {"queued_ts": math.nan}), *EJ), ["requests.jsonl:1", "'queued_ts'", "nan"]),
    ("ej-first-before-queued", lambda t: cmp(_ej(t, {"first_token_ts": 3999.0}), *EJ),
     ["requests.jsonl:1", "'first_token_ts'", "3999.0", "scheduled_ts"]),
    ("ej-bool-toks", lambda t: cmp(_ej(t, {"input_toks": True}), *EJ), ["requests.jsonl:1", "'input_toks'", "True"]),
    ("ej-frac-toks", lambda t: cmp(_ej(t, {"input_toks": 12.5}), *EJ), ["'input_toks'", "12.5"]),
    ("ej-out-zero", lambda t: cmp(_ej(t, {"output_toks": 0}), *EJ), ["'output_toks'", "got 0"]),
    ("ej-huge-toks", lambda t: cmp(_ej(t, {"input_toks": 10**20}), *EJ), ["'input_toks'", "100000000000000000000"]),
    ("ej-arrival-huge", lambda t: cmp(_ej(t, {"arrival_time": 1e300}), *EJ), ["requests.jsonl:1", "'arrival_time'"]),
    ("ej-row-list", lambda t: cmp(_ej(t, lines=(json.dumps(EJ_ROWS[0]) + "\n[1, 2]\n").encode()), *EJ),
     ["requests.jsonl:2", "JSON object"]),
    ("ej-latin1-line2", lambda t: cmp(_ej(t, lines=(json.dumps(EJ_ROWS[0]) + "\n").encode() + b'{"x": "\xe9"}\n'), *EJ),
     ["requests.jsonl:2", "not UTF-8"]),
    # T6 / S9: inference-perf config.yaml, exp-config.yaml and per-request records
    ("ip-rate-str", lambda t: cmp(_ip(t, "  - rate: fast\n    duration: 2\n"), *IP),
     ["config.yaml", "load.stages[0]", "'rate'", "'fast'"]),
    ("ip-rate-nan", lambda t: cmp(_ip(t, "  - rate: .nan\n    duration: 2\n"), *IP), ["'rate'", "nan"]),
    ("ip-rate-neg", lambda t: cmp(_ip(t, "  - rate: -2.0\n    duration: 2\n", records=False), *IP), ["'rate'", "-2.0"]),
    ("ip-dur-str", lambda t: cmp(_ip(t, "  - rate: 2.0\n    duration: long\n"), *IP), ["'duration'", "'long'"]),
    ("ip-exp-tp-str", lambda t: cmp(_ip(t, exp="model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: two\n"), *IP),
     ["exp-config.yaml", "tensor_parallelism", "'two'"]),
    ("ip-start-str", lambda t: cmp(_ip(t, rec0={"start_time": "x"}), *IP), ["record 0", "'start_time'", "'x'"]),
    ("ip-tokens-str", lambda t: cmp(_ip(t, rec0=_info(input_tokens="x")), *IP), ["record 0", "'input_tokens'", "'x'"]),
    ("ip-times-str", lambda t: cmp(_ip(t, rec0=_info(output_token_times=["x"])), *IP),
     ["record 0", "output_token_times[0]", "'x'"]),
    ("ip-end-before-start", lambda t: cmp(_ip(t, rec0={"end_time": -90.0}), *IP),
     ["record 0", "'end_time'", "-90.0", "start_time"]),
    ("ip-first-token-before-start", lambda t: cmp(_ip(t, rec0=_info(output_token_times=[1.0, 10.9])), *IP),
     ["record 0", "output_token_times[0]", "1.0"]),
    ("ip-stage-id-out-of-range", lambda t: cmp(_ip(t, rec0={"stage_id": 3}), *IP), ["record 0", "'stage_id'", "3"]),
    # S10: fit --from-run with a microbenchmark-fit flag it would ignore
    ("fit-from-run-base", lambda t: ["fit", "--from-run", str(BENCH), "--base", "/nonexist.json", "--freeze",
                                     "eta_compute", "--out", str(t / "p.json")],
     ["--from-run", "--base '/nonexist.json'", "--freeze 'eta_compute'", "--profile"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_run_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- U1: --set model.name=NAME names the model of a run that does not -----------------------------------


def test_compare_takes_model_name_from_set(tmp_path, monkeypatch):
    """A run without meta.json names no model: --set model.name=... is what the message asks for, so it is
    used (it was refused with the same message)."""
    from sim.app.replay import prepare
    from sim.core.errors import ConfigError
    from workloads.runs import load_run

    run = load_run(_ej(tmp_path, meta=None))
    assert run.model is None
    with pytest.raises(ConfigError, match="does not name its model"):
        prepare(run, "RTX 4090", overrides=["engine.max_model_len=8192"])
    rep = prepare(run, "RTX 4090", overrides=["model.name=Llama-3.1-8B", "engine.max_model_len=8192"])
    assert rep.cfg.model.name == "Llama-3.1-8B" and rep.settings["gpu"] == "RTX 4090"


# ---- valid runs of each loader still load ----------------------------------------------------------------


def test_valid_bench_result_loads_with_failures_and_one_token_outputs(tmp_path):
    """A failed request (0 output tokens, empty itls, zero TTFT / latency, an error text) and a 1-token
    output (empty itls) are what vllm bench writes: accepted; null max_concurrency too."""
    from workloads.runs import load_run

    def change(res):
        res["output_lens"][1], res["itls"][1] = 1, []
        res["latencies"][1] = res["ttfts"][1]  # one chunk: latency = TTFT
        res["max_concurrency"] = 8

    run = load_run(_bench(tmp_path, change))
    assert run.max_concurrency == 8 and run.stages[0].duration_s == json.loads(BENCH.read_text())["duration"]
    assert len(run.specs) == 39 and "1 failed requests not replayed" in " ".join(run.notes)
    assert load_run(BENCH).max_concurrency is None


def test_valid_engine_jsonl_with_meta_and_timeseries_loads(tmp_path):
    from workloads.runs import load_run

    run = load_run(_ej(tmp_path, ts=TS + "2.0,,3.0,2,1,2.5\n"))
    assert run.model == "meta-llama/Llama-3.1-8B" and run.hardware == {"gpu": "NVIDIA GeForce RTX 4090",
                                                                       "tensor_parallel_size": 1}
    assert run.requests["ttft"].tolist() == pytest.approx([0.1, 0.2])
    assert run.timeseries["running"].tolist() == [1, 2] and math.isnan(run.timeseries["prompt_throughput"][1])
    one = load_run(_ej(tmp_path / "one", rows=[{**EJ_ROWS[1], "output_toks": 1, "last_token_ts": 4000.705}]))
    assert one.requests["tpot"].isna().all()  # a 1-token output: first = last token, no TPOT


@pytest.mark.skipif(not RTX.is_dir(), reason="../shared RTX 4090 run absent")
def test_real_engine_jsonl_run_passes_the_checks():
    from workloads.runs import load_run

    run = load_run(RTX)
    assert len(run.specs) == 300 and run.engine["num_gpu_blocks_override"] == 2588


def test_valid_inference_perf_loads_with_and_without_records(tmp_path):
    from workloads.runs import load_run

    run = load_run(_ip(tmp_path / "a", rec0={"error": {"message": "timeout"}, "end_time": 310.0}))
    assert [s.rate for s in run.stages] == [2.0] and len(run.specs) == 4
    assert not run.requests["ok"][0] and math.isnan(run.requests["ttft"][0])
    rebuilt = load_run(_ip(tmp_path / "b", records=False))
    assert len(rebuilt.specs) == 4 and rebuilt.stages[0].duration_s == 2.0


def test_fit_from_run_still_takes_its_own_flags(tmp_path, capsys):
    """--base prior (the default) and no --freeze are not 'given': the refusal is for flags actually passed."""
    from sim.cli.main import main

    assert main(["fit", "--from-run", str(BENCH), "--out", str(tmp_path / "p.json"), "--max-nfev", "1",
                 "--max-per-stage", "2", "--base", "prior"]) == 0  # fmt: skip
    assert (tmp_path / "p.json").is_file()
