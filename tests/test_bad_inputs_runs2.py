"""Bad real-run files, second sweep (a fuzz of the importers behind ``servesim compare`` / ``fit --from-run``):
Prometheus scrapes (counts past the request bound, empty or inconsistent histograms, repeated series,
cache_config_info labels), vllm bench results (hardware metadata, aggregates against the per-request
arrays, lengths past max_model_len), the replay's --set workload.* keys, inference-perf aggregates and
records, engine-JSONL meta.json / workload file / timeseries.csv, and the run-file path in front of a
config error about the run's own settings. Each: exit code 2, one line naming the file, the field and the
value, before any engine runs. The shipped fixtures still load and compare as before (last tests)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_runs import EJ, EJ_ROWS, IP, META, TS, _bench, _ej, _info, _ip, _set, cmp

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "tests" / "data" / "runs" / "prometheus"
BENCH = ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json"
LBL = '{engine="0",model_name="meta-llama/Llama-3.1-8B"'
SUCCESS = 'vllm:request_success_total{engine="0",finished_reason="length",model_name="meta-llama/Llama-3.1-8B"} '
PR = ["--gpu", "RTX 4090", "--set", "engine.max_model_len=8192", "--set", "workload.rate=5"]


# ---- builders ------------------------------------------------------------------------------------------


def _prom(tmp: Path, change) -> str:
    """The before / after scrape fixture with ``change(after_text) -> after_text`` applied."""
    d = tmp / "prom"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROM / "metrics_before.prom", d / "metrics_before.prom")
    (d / "metrics_after.prom").write_text(change((PROM / "metrics_after.prom").read_text()))
    return str(d)


def _sub(old: str, new: str):
    def change(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return change


def _drop(line_start: str):
    return lambda text: "".join(ln for ln in text.splitlines(True) if not ln.startswith(line_start))


def _dup(line_start: str):
    def change(text: str) -> str:
        line = next(ln for ln in text.splitlines(True) if ln.startswith(line_start))
        return text.replace(line, line + line, 1)

    return change


def _prompt_hist_from_before(text: str) -> str:
    """The after-scrape's prompt-token histogram replaced by the before-scrape's: nothing observed between."""
    before = [ln for ln in (PROM / "metrics_before.prom").read_text().splitlines(True)
              if ln.startswith("vllm:request_prompt_tokens")]  # fmt: skip
    kept = [ln for ln in text.splitlines(True) if not ln.startswith("vllm:request_prompt_tokens")]
    return "".join(kept + before)


def _meta_set(**kw) -> dict:
    def change(res):
        res.update(kw)

    return change


def _ip_stage(tmp: Path, change, **kw) -> str:
    """An inference-perf directory (tests/test_bad_inputs_runs.py's) with ``change(stage_0 metrics)``."""
    d = _ip(tmp, **kw)
    p = tmp / "results" / "stage_0_lifecycle_metrics.json"
    m = json.loads(p.read_text())
    change(m)
    p.write_text(json.dumps(m))
    return d


def _ttft(word, v):
    return lambda m: m["successes"]["latency"]["time_to_first_token"].__setitem__(word, v)


def _ej_workload(tmp: Path, rows: list[dict]) -> str:
    d = Path(_ej(tmp))
    (d / "workload-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(d)


WL_ROWS = [{"input_toks": 100, "output_toks": 11, "arrival_time_ns": 0},
           {"input_toks": 50, "output_toks": 2, "arrival_time_ns": 500_000_000}]  # fmt: skip

# (id, argv builder (tmp -> argv), fragments the one line must contain); one per failure the fuzz found
CASES = [
    # 1. Prometheus scrapes
    ("prom-success-inf", lambda t: cmp(_prom(t, _sub(SUCCESS + "62.0", SUCCESS + "+Inf")), *PR),
     ["metrics_after.prom", "vllm:request_success_total", "inf", ">= 0"]),
    ("prom-success-huge", lambda t: cmp(_prom(t, _sub(SUCCESS + "62.0", SUCCESS + "1e12")), *PR),
     ["metrics_after.prom", "vllm:request_success_total", "1e+12", "1000000"]),
    ("prom-prompt-empty", lambda t: cmp(_prom(t, _prompt_hist_from_before), *PR),
     ["metrics_after.prom", "vllm:request_prompt_tokens", "no observations"]),
    ("prom-bucket-decreases", lambda t: cmp(_prom(t, _sub(f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.08"}} 56.0',
                                                          f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.08"}} 10.0')),
                                            *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds", "le=0.08", "never decrease"]),
    ("prom-bucket-nan", lambda t: cmp(_prom(t, _sub(f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.06"}} 44.0',
                                                    f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.06"}} NaN')), *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds_bucket", "le=", "nan"]),
    ("prom-sum-nan", lambda t: cmp(_prom(t, _sub(f"vllm:time_to_first_token_seconds_sum{LBL}}} 3.6414988129088277",
                                                 f"vllm:time_to_first_token_seconds_sum{LBL}}} NaN")), *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds_sum", "nan"]),
    ("prom-sum-negative", lambda t: cmp(_prom(t, _sub(f"vllm:time_to_first_token_seconds_sum{LBL}}} 3.6414988129088277",
                                                      f"vllm:time_to_first_token_seconds_sum{LBL}}} -3.6")), *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds_sum", "-3.6"]),
    ("prom-count-missing", lambda t: cmp(_prom(t, _drop("vllm:time_to_first_token_seconds_count")), *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds_count"]),
    ("prom-sum-missing", lambda t: cmp(_prom(t, _drop("vllm:e2e_request_latency_seconds_sum")), *PR),
     ["metrics_after.prom", "vllm:e2e_request_latency_seconds_sum"]),
    ("prom-bucket-negative", lambda t: cmp(_prom(t, _sub(f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.001"}} 0.0',
                                                         f'vllm:time_to_first_token_seconds_bucket{LBL},le="0.001"}} -1.0')),
                                           *PR),
     ["metrics_after.prom", "vllm:time_to_first_token_seconds_bucket", "-1.0"]),
    ("prom-repeated-series", lambda t: cmp(_prom(t, _dup(SUCCESS)), *PR),
     ["metrics_after.prom", "vllm:request_success_total", "appears twice"]),
    ("prom-block-size-str", lambda t: cmp(_prom(t, _sub('block_size="16"', 'block_size="abc"')), *PR),
     ["metrics_after.prom", "vllm:cache_config_info", "block_size='abc'", "integer"]),
    ("prom-prefix-caching-yes", lambda t: cmp(_prom(t, _sub('enable_prefix_caching="True"', 'enable_prefix_caching="yes"')),
                                              *PR),
     ["metrics_after.prom", "enable_prefix_caching='yes'", "True, False"]),
    ("prom-prompt-sum-huge", lambda t: cmp(_prom(t, lambda x: "".join(
        "vllm:request_prompt_tokens_sum" + ln.split("}", 1)[0][len("vllm:request_prompt_tokens_sum"):] + "} 1e30\n"
        if ln.startswith("vllm:request_prompt_tokens_sum") else ln for ln in x.splitlines(True))), *PR),
     ["metrics_after.prom", "vllm:request_prompt_tokens_sum", "outside the filled buckets"]),
    # 2. vllm bench result: hardware metadata, aggregates, lengths against max_model_len
    ("vb-tp-word", lambda t: cmp(_bench(t, _set("tp", "two"))), ["bench.json", "'tp'", "'two'", "integer"]),
    ("vb-tp-frac", lambda t: cmp(_bench(t, _set("tp", "2.5"))), ["bench.json", "'tp'", "2.5"]),
    ("vb-tp-bool", lambda t: cmp(_bench(t, _set("tp", "true"))), ["bench.json", "'tp'", "True"]),
    ("vb-tp-disagree", lambda t: cmp(_bench(t, _meta_set(tp="2", tensor_parallel_size="1"))),
     ["bench.json", "'tp'", "'tensor_parallel_size'", "one value"]),
    ("vb-completed-huge", lambda t: cmp(_bench(t, _set("completed", 100000))), ["bench.json", "'completed'", "100000", "39"]),
    ("vb-completed-nan", lambda t: cmp(_bench(t, _set("completed", math.nan))), ["bench.json", "'completed'", "nan"]),
    ("vb-completed-neg", lambda t: cmp(_bench(t, _set("completed", -3))), ["'completed'", "-3", "integer >= 0"]),
    ("vb-completed-bool", lambda t: cmp(_bench(t, _set("completed", True))), ["'completed'", "True"]),
    ("vb-completed-str", lambda t: cmp(_bench(t, _set("completed", "39"))), ["'completed'", "'39'"]),
    ("vb-mean-ttft-neg", lambda t: cmp(_bench(t, _set("mean_ttft_ms", -50))), ["bench.json", "'mean_ttft_ms'", "-50"]),
    ("vb-throughput-nan", lambda t: cmp(_bench(t, _set("request_throughput", math.nan))),
     ["bench.json", "'request_throughput'", "nan"]),
    ("vb-throughput-neg", lambda t: cmp(_bench(t, _set("request_throughput", -2))), ["'request_throughput'", "-2"]),
    ("vb-p99-below-median", lambda t: cmp(_bench(t, _set("p99_ttft_ms", 1.0))),
     ["bench.json", "'p99_ttft_ms'", "median_ttft_ms", "median <= p90 <= p99"]),
    ("vb-errors-ints", lambda t: cmp(_bench(t, lambda r: r.__setitem__("errors", [int(bool(e)) for e in r["errors"]]))),
     ["bench.json", "errors[0]", "got 0", "string"]),
    # 3. the replay's --set workload.* keys
    ("wl-burstiness-str", lambda t: cmp(str(BENCH), "--set", "workload.rate=5", "--set", "workload.burstiness=x"),
     ["workload.burstiness='x'", "burstiness must be a number"]),
    ("wl-mc-half", lambda t: cmp(str(BENCH), "--set", "workload.max_concurrency=0.5"),
     ["workload.max_concurrency=0.5", "integer >= 1"]),
    ("wl-mc-frac", lambda t: cmp(str(BENCH), "--set", "workload.max_concurrency=2.5"),
     ["workload.max_concurrency=2.5", "integer >= 1"]),
    ("wl-rate-tiny", lambda t: cmp(str(BENCH), "--set", "workload.rate=1e-300"),
     ["workload.rate=1e-300", "allowed workload.rate >="]),
    ("wl-rate-str", lambda t: cmp(str(BENCH), "--set", "workload.rate=fast"), ["workload.rate='fast'", "number > 0"]),
    # 4. inference-perf aggregates and records
    ("ip-ttft-mean-nan", lambda t: cmp(_ip_stage(t, _ttft("mean", math.nan)), *IP),
     ["stage_0_lifecycle_metrics.json", "time_to_first_token.mean", "nan"]),
    ("ip-ttft-mean-neg", lambda t: cmp(_ip_stage(t, _ttft("mean", -1.0)), *IP), ["time_to_first_token.mean", "-1.0"]),
    ("ip-ttft-mean-str", lambda t: cmp(_ip_stage(t, _ttft("mean", "fast")), *IP), ["time_to_first_token.mean", "'fast'"]),
    ("ip-p99-below-p50", lambda t: cmp(_ip_stage(t, _ttft("p99", 0.01)), *IP),
     ["time_to_first_token.p99", "0.01", "median <= p90 <= p99"]),
    ("ip-rps-neg", lambda t: cmp(_ip_stage(t, lambda m: m["successes"]["throughput"].__setitem__("requests_per_sec", -3)),
                                 *IP), ["stage_0_lifecycle_metrics.json", "requests_per_sec", "-3"]),
    ("ip-rps-nan", lambda t: cmp(_ip_stage(t, lambda m: m["successes"]["throughput"].__setitem__(
        "requests_per_sec", math.nan)), *IP), ["requests_per_sec", "nan"]),
    ("ip-count-frac", lambda t: cmp(_ip_stage(t, lambda m: m["successes"].__setitem__("count", 2.5)), *IP),
     ["successes.count", "2.5", "integer"]),
    ("ip-stage-id-false", lambda t: cmp(_ip(t, rec0={"stage_id": False}), *IP), ["record 0", "'stage_id'", "False"]),
    ("ip-token-time-nan", lambda t: cmp(_ip(t, rec0=_info(output_token_times=[10.2, math.nan])), *IP),
     ["record 0", "output_token_times[1]", "nan"]),
    ("ip-token-times-order", lambda t: cmp(_ip(t, rec0=_info(output_token_times=[10.9, 10.2])), *IP),
     ["record 0", "output_token_times[1]", "10.2", "order"]),
    ("ip-rebuild-huge", lambda t: cmp(_ip(t, "  - rate: 10000\n    duration: 10000\n", records=False), *IP),
     ["config.yaml", "load.stages[0]", "1e+08", "1000000"]),
    # 5. engine JSONL: meta.json dtype, the workload file, timeseries.csv ranges
    ("ej-dtype-fp3", lambda t: cmp(_ej(t, meta={**META, "engine_kwargs": {"dtype": "fp3"}}), *EJ),
     ["meta.json", "engine_kwargs.dtype", "'fp3'", "bfloat16"]),
    ("ej-dtype-int", lambda t: cmp(_ej(t, meta={**META, "engine_kwargs": {"dtype": 5}}), *EJ),
     ["meta.json", "engine_kwargs.dtype", "got 5", "bfloat16"]),
    ("ej-workload-inputs-differ", lambda t: cmp(_ej_workload(t, [WL_ROWS[0], {**WL_ROWS[1], "input_toks": 7}]), *EJ),
     ["workload-a.jsonl", "row 2", "input_toks 7", "requests.jsonl"]),
    ("ej-workload-no-arrivals", lambda t: cmp(_ej_workload(t, [{k: v for k, v in r.items() if k != "arrival_time_ns"}
                                                               for r in WL_ROWS]), *EJ),
     ["workload-a.jsonl", "arrival"]),
    ("ej-ts-running-neg", lambda t: cmp(_ej(t, ts=TS.replace(",1,0,", ",-5,0,")), *EJ),
     ["timeseries.csv", "'running'", "-5", ">= 0"]),
    ("ej-ts-running-inf", lambda t: cmp(_ej(t, ts=TS.replace(",1,0,", ",inf,0,")), *EJ), ["timeseries.csv", "'running'", "inf"]),
    ("ej-ts-kv-250", lambda t: cmp(_ej(t, ts=TS.replace(",1.5\n", ",250\n")), *EJ),
     ["timeseries.csv", "'kv_cache_pct'", "250", "<= 100"]),
    # 6. a config error about the run's own settings names the file it came from
    ("vb-max-num-seqs-str", lambda t: cmp(_bench(t, _set("max_num_seqs", "abc"))),
     ["bench.json", "[engine] max_num_seqs", "'abc'"]),
    ("ip-exp-max-num-seqs-neg", lambda t: cmp(_ip(t, exp="model: meta-llama/Llama-2-7b-hf\nmax_num_seqs: -5\n"), *IP),
     ["exp-config.yaml", "[engine] max_num_seqs", "-5"]),
    ("ej-meta-gmu-str", lambda t: cmp(_ej(t, meta={**META, "kv_cache": {"block_size": 16, "gpu_memory_utilization": "x"}}),
                                      *EJ), ["meta.json", "gpu_memory_utilization", "'x'"]),
    ("prom-num-gpu-blocks-neg", lambda t: cmp(_prom(t, _sub('num_gpu_blocks="2588"', 'num_gpu_blocks="-5"')), *PR),
     ["metrics_after.prom", "num_gpu_blocks='-5'", "integer >= 1"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_run_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- what still loads -------------------------------------------------------------------------------------


def test_run_setting_overridden_by_set_is_not_blamed_on_the_file(tmp_path):
    """--set engine.max_num_seqs=8 replaces the file's bad value: the replay is prepared."""
    from sim.app.replay import prepare
    from workloads.runs import load_run

    run = load_run(_bench(tmp_path, _set("max_num_seqs", "abc")))
    rep = prepare(run, overrides=["engine.max_num_seqs=8"])
    assert rep.settings["max_num_seqs"] == 8


def test_bench_aggregates_that_differ_from_the_arrays_are_kept_with_a_note(tmp_path):
    """vLLM's aggregates count an empty reply (no error, 0 output tokens) that servesim's recomputation from
    the arrays leaves out: the file's values stay the real ones, and the note says by how much they differ."""
    from workloads.runs import load_run

    run = load_run(_bench(tmp_path, _set("mean_ttft_ms", 500.0)))
    assert run.overall["ttft_mean_ms"] == pytest.approx(500.0, rel=1e-9)
    assert any("mean_ttft_ms 500" in n and "(used)" in n for n in run.notes)
    assert not any("mean_ttft_ms" in n for n in load_run(BENCH).notes)  # the shipped file agrees with itself
    (tmp_path / "tp").mkdir()
    tp = load_run(_bench(tmp_path / "tp", _meta_set(tp="2", tensor_parallel_size="2")))
    assert tp.hardware == {"gpu": "RTX 4090", "tensor_parallel_size": 2}


def test_valid_variants_still_load(tmp_path):
    from workloads.runs import load_run

    ej = load_run(_ej_workload(tmp_path / "ej", WL_ROWS))
    assert [s.output_len for s in ej.specs] == [r["output_toks"] for r in EJ_ROWS]
    ts = load_run(_ej(tmp_path / "ts", ts=TS + "2.0,,3.0,0,0,100\n"))
    assert ts.timeseries["kv_cache_pct"].tolist() == [1.5, 100.0]
    ip = load_run(_ip(tmp_path / "ip", rec0={"stage_id": None}))
    assert ip.stage_of.tolist() == [0, 0, 0, 0]
    failed = load_run(_ip(tmp_path / "ipf", rec0={"error": {"message": "x"}, **_info(output_tokens=0,
                                                                                     output_token_times=[])}))
    assert not failed.requests["ok"][0]
    empty = load_run(_ip(tmp_path / "ipe", rec0=_info(output_tokens=0)))  # an empty reply: replayed, and said
    assert empty.requests["ok"][0] and any("1 successful requests with output_tokens 0" in n for n in empty.notes)
    assert load_run(_ej(tmp_path / "dt", meta={**META, "engine_kwargs": {"dtype": "BFloat16"}})).dtype == "bf16"


def test_shipped_fixtures_load_and_compare_unchanged():
    """tests/data/runs as before this sweep's checks: the same measured values, notes, settings and (a short
    replay) the same simulated latencies."""
    from sim.app.compare import compare
    from workloads.runs import load_run

    res = json.loads(BENCH.read_text())
    bench = load_run(BENCH)
    for word, stat in (("mean", "mean"), ("median", "p50"), ("p99", "p99")):
        for metric in ("ttft", "tpot", "itl", "e2el"):
            assert bench.overall[f"{metric}_{stat}_ms"] == res[f"{word}_{metric}_ms"]
    assert bench.overall["completed"] == 39 and bench.overall["request_throughput"] == res["request_throughput"]
    assert bench.notes == ["arrivals recorded (start_times)",
                           "no prompt content in the file: prompts replayed as unique (no prefix hits)",
                           "1 failed requests not replayed (their output length is not recorded)"]  # fmt: skip
    assert bench.engine == {"max_num_seqs": 64, "max_model_len": 8192} and bench.hardware == {"gpu": "RTX 4090"}
    c = compare(bench, "RTX 4090", None, [], 8)
    assert c.overall["ttft_mean_ms"]["sim"] == pytest.approx(87.96986111242899, rel=1e-9)
    assert c.overall["e2el_mean_ms"]["sim"] == pytest.approx(1815.3363179950652, rel=1e-9)

    prom = load_run(PROM)
    assert prom.overall["completed"] == 60 and prom.overall["ttft_mean_ms"] == pytest.approx(58.69164688181379)
    assert prom.overall["ttft_p99_ms"] == pytest.approx(227.49999999999994)
    assert prom.engine == {"block_size": 16, "num_gpu_blocks_override": 2588, "gpu_memory_utilization": 0.9,
                           "enable_prefix_caching": True}  # fmt: skip
    assert [(s.prompt_len, s.output_len) for s in prom.specs[:3]] == [(168, 44), (611, 81), (781, 84)]
    c = compare(prom, "RTX 4090", None, ["engine.max_model_len=8192", "workload.rate=5"], 8)
    assert c.overall["ttft_mean_ms"]["sim"] == pytest.approx(119.70249810784051, rel=1e-9)
    assert c.overall["e2el_mean_ms"]["sim"] == pytest.approx(1344.5041742695291, rel=1e-9)
    assert not any("cut to fit" in n for n in prom.notes)


def test_prometheus_drawn_lengths_past_max_model_len_are_cut_with_a_note():
    from sim.app.replay import prepare
    from workloads.runs import load_run

    run = load_run(PROM)
    rep = prepare(run, "RTX 4090", overrides=["engine.max_model_len=600", "workload.rate=5"])
    assert all(s.prompt_len + s.output_len <= 600 for s in rep.specs)
    assert sum("cut to fit max_model_len 600" in n for n in run.notes) == 1


def test_served_requests_past_the_replays_max_model_len_are_cut_with_a_note(tmp_path):
    """The run served them, so its max_model_len was larger than the replay's: replayed cut to fit (not
    rejected without a word, as before), and the note says how to give the run's own."""
    from sim.app.replay import prepare
    from workloads.runs import load_run

    run = load_run(_bench(tmp_path, lambda r: r["output_lens"].__setitem__(0, 100000)))
    rep = prepare(run, overrides=["engine.max_model_len=4096"])
    assert all(s.prompt_len + s.output_len <= 4096 for s in rep.specs)
    assert len(rep.specs) == len(run.specs)
    assert sum("served requests longer than the replay's max_model_len 4096" in n for n in run.notes) == 1


def test_engine_outputs_that_differ_from_the_workload_are_replayed_as_generated(tmp_path):
    """A stop string or EOS ends a request before the length the workload asked for: the engine's own
    output_toks are replayed, and the note counts them."""
    from workloads.runs import load_run

    run = load_run(_ej_workload(tmp_path, [WL_ROWS[0], {**WL_ROWS[1], "output_toks": 7}]))
    assert [s.output_len for s in run.specs] == [11, 2]
    assert any(n.startswith("1 requests generated another output length") for n in run.notes)


def test_a_cut_request_keeps_its_content_consistent():
    """Cutting a served request to the replay's max_model_len cuts its token ids and segments with it (a
    spec whose content no longer adds up to prompt_len was refused: the replay stopped)."""
    from sim.core.request import RequestSpec
    from workloads.tracefmt.jsonl import clip_spec

    ids = RequestSpec("a", 0.0, 300, 50, token_ids=tuple(range(300)))
    segs = RequestSpec("b", 0.0, 300, 50, segments=((("sys", 1), 200), (("q", 2), 100)))
    for spec in (ids, segs):
        cut = clip_spec(spec, 256)
        assert cut is not None and cut.prompt_len == 255 and cut.output_len == 1
    assert clip_spec(ids, 4096) is None
