"""Hostile trace inputs, round B of the fuzz report (A1, A2, A3 trace options, A5, B1, B2, B4, B5, B6, B9,
C3-C7, D1-D3 for the loaders): a refusal is exit code 2 and one line naming the field or option, the value
and what is allowed (CLI), or one ServesimError line (API), before any engine runs; beside each, the
nearest valid input still loads. tests/test_bad_inputs.py holds the harness."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from sim.cli.main import main
from sim.core.errors import ConfigError, ServesimError, TraceFormatError
from sim.core.request import RequestSpec
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_traces import (
    AZURE,
    BENCH,
    BURST,
    MOON,
    ROW,
    SHAREGPT,
    _jsonl,
    _run,
    _stats,
    _write,
)
from workloads.synthetic import build_workload
from workloads.tracefmt import load_bench_result, load_trace, sniff_format, trace_stats, vllm_random
from workloads.tracefmt.jsonl import load_jsonl, save_jsonl

BENCH_RESULT = Path(__file__).resolve().parent / "data" / "runs" / "vllm_bench_result.json"
HUGE = "1" + "0" * 400  # a TOML integer past a float's range
TC = "num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n"


def _result(tmp: Path, change=None, name: str = "res.json") -> str:
    """The vllm bench result fixture with ``change(res)`` applied."""
    res = json.loads(BENCH_RESULT.read_text())
    if change is not None:
        change(res)
    return _write(tmp, name, json.dumps(res))


def _no_start(res: dict) -> None:  # arrivals are redrawn (seed_arrivals / seed)
    del res["start_times"]


def _at(key: str, i: int, value):
    def change(res):
        res[key][i] = value

    return change


def _tiny_burst(res: dict) -> None:
    del res["start_times"]
    res["burstiness"] = 1e-300


def _wl(tmp: Path, trace: str, **extra) -> object:
    """The workload a ``[workload]`` table replaying ``trace`` builds (no engine), max_model_len 8192."""
    return build_workload({"trace": trace, **extra}, seed=0, max_model_len=8192)


CASES = [
    # ---- A1: a lone surrogate in a request id (valid JSON, but no UTF-8 output holds it) ----
    ("jsonl-request_id-lone-surrogate", lambda t: _run(t, _jsonl(t, '{"arrival_time":0.0,"prompt_len":50,'
                                                                  '"output_len":5,"request_id":"\\ud800"}')),
     ["t.jsonl:1", "field 'request_id'", "\\ud800", "lone surrogate"]),
    # ---- A2: seed_arrivals of a bench result whose arrivals are redrawn ----
    ("bench-result-seed_arrivals-negative", lambda t: _run(t, _result(t, _no_start), "seed_arrivals = -1"),
     ["trace option seed_arrivals", "-1", ">= 0"]),
    ("bench-result-seed_arrivals-string", lambda t: _run(t, _result(t, _no_start), 'seed_arrivals = "x"'),
     ["trace option seed_arrivals", "'x'", "integer"]),
    ("bench-result-seed_arrivals-float", lambda t: _run(t, _result(t, _no_start), "seed_arrivals = 1.5"),
     ["trace option seed_arrivals", "1.5", "integer"]),
    ("bench-result-seed_arrivals-bool", lambda t: _run(t, _result(t, _no_start), "seed_arrivals = true"),
     ["trace option seed_arrivals", "True", "integer"]),
    # ---- A3: trace options as integers past a float's range ----
    ("trace-start-400-digits", lambda t: _run(t, _jsonl(t, ROW), f"start = {HUGE}"),
     ["trace option start", "401 digits", "finite number"]),
    ("trace-end-400-digits", lambda t: _run(t, _jsonl(t, ROW), f"end = {HUGE}"), ["trace option end", "401 digits"]),
    ("trace-time_scale-400-digits", lambda t: _run(t, _jsonl(t, ROW), f"time_scale = {HUGE}"),
     ["trace option time_scale", "401 digits"]),
    ("trace-rate_scale-400-digits", lambda t: _run(t, _jsonl(t, ROW), f"rate_scale = {HUGE}"),
     ["workload.rate_scale", "401 digits", "allowed rate_scale <= 1e+06"]),  # a user's bound, checked as the config loads
    ("token-counts-rate-400-digits", lambda t: _run(t, _write(t, "tc.csv", TC), f"rate = {HUGE}"),
     ["trace option rate", "401 digits", "> 0"]),
    ("token-counts-burstiness-400-digits", lambda t: _run(t, _write(t, "tc.csv", TC),
                                                          f'rate = 1.0\narrival = "gamma"\nburstiness = {HUGE}'),
     ["trace option burstiness", "401 digits"]),
    ("sharegpt-tokens_per_word-400-digits", lambda t: _run(t, _write(t, "s.json", json.dumps(SHAREGPT)),
                                                           f"rate = 1.0\ntokens_per_word = {HUGE}"),
     ["trace option tokens_per_word", "401 digits", "> 0"]),
    # ---- B2: the workload's own max_model_len, when not a number, is refused (not overwritten) under clip ----
    ("trace-own-max_model_len-string-under-clip", lambda t: _run(t, _jsonl(t, ROW),
                                                                 'too_long = "clip"\nmax_model_len = "x"'),
     ["trace option max_model_len", "'x'", "integer >= 2"]),
    # ---- B4: arrival options of a vllm-bench JSONL with recorded times are checked all the same ----
    ("bench-jsonl-arrival-bogus", lambda t: _run(t, _jsonl(t, BENCH), 'arrival = "bogus"'),
     ["trace option arrival", "'bogus'", "poisson, gamma, constant"]),
    ("bench-jsonl-burstiness-negative", lambda t: _run(t, _jsonl(t, BENCH), "burstiness = -5"),
     ["trace option burstiness", "-5", ">= 1e-06"]),
    ("bench-jsonl-tokens_per_word-negative", lambda t: _run(t, _jsonl(t, BENCH), "tokens_per_word = -3"),
     ["trace option tokens_per_word", "-3", "> 0"]),
    ("bench-jsonl-tokens_per_word-string", lambda t: _run(t, _jsonl(t, BENCH), 'tokens_per_word = "x"'),
     ["trace option tokens_per_word", "'x'"]),
    ("bench-jsonl-stats-arrival-bogus", lambda t: _stats(_jsonl(t, BENCH), "--arrival", "bogus"),
     ["trace option arrival", "'bogus'"]),
    # ---- B6: a bench result's per-request seconds: a bool or a string is no number ----
    ("bench-result-start_times-bool", lambda t: _stats(_result(t, _at("start_times", 0, True))),
     ["res.json", "start_times[0]", "True", "expected a number (seconds)"]),
    ("bench-result-ttfts-bool", lambda t: _stats(_result(t, _at("ttfts", 0, True))), ["res.json", "ttfts[0]", "True"]),
    ("bench-result-latencies-string", lambda t: _stats(_result(t, _at("latencies", 0, "0.5"))),
     ["res.json", "latencies[0]", "'0.5'", "expected a number"]),
    ("bench-result-ttfts-word", lambda t: _stats(_result(t, _at("ttfts", 0, "abc"))), ["res.json", "ttfts[0]", "'abc'"]),
    # ---- B9: an empty BurstGPT model name ----
    ("burstgpt-model-empty", lambda t: _stats(_write(t, "b.csv", BURST + "5,ChatGPT,100,20,120,Conv\n"
                                                     "6,,100,20,120,Conv\n"), "--model", ""),
     ["trace option model", "''", "non-empty"]),
    # ---- C4: an arrival spread_ties moved past the clock names spread_ties ----
    ("mooncake-spread_ties-past-the-clock", lambda t: _stats(_jsonl(
        t, {**MOON, "timestamp": 999999999000}, {**MOON, "timestamp": 999999999000}, {**MOON, "timestamp": 0}),
        "--spread-ties"), ["t.jsonl:2", "field 'timestamp'", "moved by spread_ties", "1e+09 s"]),
    # ---- C5: a quoted cell spanning lines moves the rows below it ----
    ("azure-quoted-multiline-cell-line-number", lambda t: _stats(_write(
        t, "a.csv", AZURE + '"2023-11-16 18:15:46","374\n",44\n2023-11-16 18:15:47,100,4\n2023-11-16 18:15:48,abc,4\n')),
     ["a.csv:5", "ContextTokens", "'abc'"]),
    # ---- C6: JSON lines that are no bench results, read as one ----
    ("jsonl-read-as-bench-result", lambda t: _stats(_jsonl(t, ROW, ROW), "--format", "vllm-bench-result"),
     ["t.jsonl:1", "not a vllm bench serve result", "arrival_time"]),
    # ---- C7: arrival messages name the file or the option ----
    ("bench-result-burstiness-tiny", lambda t: _stats(_result(t, _tiny_burst)),
     ["res.json", "burstiness = 1e-300", ">= 1e-06"]),
    ("trace-rate-string", lambda t: _run(t, _write(t, "tc.csv", TC), 'rate = "fast"'),
     ["trace option rate", "'fast'", "> 0"]),
    # ---- D3: integral floats, and the rest still refused ----
    ("jsonl-segment-length-fraction", lambda t: _stats(_jsonl(t, {**ROW, "prompt_len": 50, "segments": [["s", 50.5]]})),
     ["t.jsonl:1", "field 'segments'", "50.5"]),
    ("trace-limit-fraction", lambda t: _run(t, _jsonl(t, ROW, ROW), "limit = 5.5"),
     ["trace option limit", "5.5", "integer >= 1"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_trace_input_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- A5 / D2: the public loaders, called from Python --------------------------------------------------

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_trace.jsonl"
SPECS = [RequestSpec("a", 0.0, 10, 2), RequestSpec("b", 0.5, 20, 3)]

API_CASES = [
    ("load_trace-path-None", lambda t: load_trace(None), ConfigError, ["path", "None", "str or an os.PathLike"]),
    ("load_trace-path-int", lambda t: load_trace(123), ConfigError, ["path", "123"]),
    ("load_trace-path-bytes", lambda t: load_trace(str(SAMPLE).encode()), ConfigError, ["path", "b'"]),
    ("load_trace-path-NUL", lambda t: load_trace("a\x00b.jsonl"), ConfigError, ["path", "NUL"]),
    ("sniff_format-path-None", lambda t: sniff_format(None), ConfigError, ["path", "None"]),
    ("load_jsonl-path-None", lambda t: load_jsonl(None), ConfigError, ["path", "None"]),
    ("load_trace-format-None", lambda t: load_trace(SAMPLE, format=None), ConfigError,
     ["format", "None", "auto, azure"]),
    ("load_trace-format-int", lambda t: load_trace(SAMPLE, format=5), ConfigError, ["format", "5"]),
    ("load_jsonl-max_model_len-string", lambda t: load_jsonl(SAMPLE, max_model_len="100"), ConfigError,
     ["max_model_len", "'100'", "integer >= 2"]),
    ("load_jsonl-max_model_len-fraction", lambda t: load_jsonl(SAMPLE, max_model_len=100.5), ConfigError,
     ["max_model_len", "100.5"]),
    ("trace_stats-None", lambda t: trace_stats(None), ConfigError, ["trace", "NoneType", "load_trace"]),
    ("trace_stats-list", lambda t: trace_stats([]), ConfigError, ["trace", "list"]),
    ("save_jsonl-directory", lambda t: save_jsonl(SPECS, t), ConfigError, ["save_jsonl", "is a directory"]),
    ("save_jsonl-missing-directory", lambda t: save_jsonl(SPECS, t / "no" / "x.jsonl"), ConfigError,
     ["save_jsonl", "no such directory"]),
    ("save_jsonl-not-specs", lambda t: save_jsonl([1, 2], t / "x.jsonl"), ConfigError,
     ["save_jsonl", "specs[0]", "RequestSpec", "int"]),
    ("vllm_random-range_ratio-string", lambda t: vllm_random(5, range_ratio="a", rate=1.0), ConfigError,
     ["range_ratio", "'a'", "[0, 1)"]),
    ("vllm_random-range_ratio-None", lambda t: vllm_random(5, range_ratio=None, rate=1.0), ConfigError,
     ["range_ratio", "None"]),
    ("vllm_random-range_ratio-list", lambda t: vllm_random(5, range_ratio=[0.1], rate=1.0), ConfigError,
     ["range_ratio", "[0.1]"]),
    ("vllm_random-num_prompts-1e15", lambda t: vllm_random(10**15, rate=1.0), ConfigError,
     ["num_prompts", str(10**15), "<= 1000000"]),
    ("load_trace-start-10e400", lambda t: load_trace(SAMPLE, start=10**400), ConfigError,
     ["trace option start", "401 digits"]),
    ("load_trace-limit-numpy-bool", lambda t: load_trace(SAMPLE, limit=np.bool_(True)), ConfigError,
     ["trace option limit", "True"]),
    ("load_trace-start-2d-array", lambda t: load_trace(SAMPLE, start=np.zeros((2, 2))), ConfigError,
     ["trace option start", "array"]),
]


@pytest.mark.parametrize("name,call,exc,fragments", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_loader_call_raises_one_line(name, call, exc, fragments, tmp_path):
    with pytest.raises(exc) as info:
        call(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert not (tmp_path / "x.jsonl").exists()  # save_jsonl refused before opening its file


def test_loaders_take_what_the_refusals_are_next_to(tmp_path):
    """The nearest valid calls: paths as str or Path, a format name in any case, numpy scalars as the
    numbers they are (D2), integral floats for integers (D3), a writable path for save_jsonl."""
    assert len(load_trace(str(SAMPLE))) == len(load_trace(SAMPLE, format=" JSONL ")) == 200
    assert len(load_trace(SAMPLE, limit=np.int64(5))) == 5
    assert len(load_trace(SAMPLE, limit=5.0)) == 5
    assert len(load_trace(SAMPLE, seed=np.int64(3), sample=np.int64(4))) == 4
    assert load_trace(SAMPLE, start=np.float32(1.0)).specs[0].arrival_time >= 0
    assert load_trace(SAMPLE, start=np.int64(1)).notes[0].startswith("window [1, inf)")
    assert max(s.prompt_len + s.output_len for s in load_trace(SAMPLE, max_model_len=np.int64(1000))) <= 1000
    assert max(s.prompt_len + s.output_len for s in load_jsonl(SAMPLE, max_model_len=1000.0)) <= 1000
    assert len(vllm_random(num_prompts=np.int64(5), input_len=np.int64(100), range_ratio=np.float64(0.5),
                           rate=1.0)) == 5  # fmt: skip
    assert trace_stats(load_jsonl(SAMPLE))["count"] == 200  # load_jsonl's trace (no format field) has stats too
    out = tmp_path / "x.jsonl"
    assert save_jsonl(SPECS, out) == 2 and [s.request_id for s in load_jsonl(out)] == ["a", "b"]


# ---- the valid inputs next to the CLI refusals -------------------------------------------------------


def test_request_ids_text_and_automatic(tmp_path, capsys):
    """A1: non-ASCII ids and a lone surrogate in a session id still load; a ShareGPT id that is no text is
    replaced by its position with a note. C3: an automatic id skips the ids the file names."""
    path = _jsonl(tmp_path, {**ROW, "request_id": "é✓"}, '{"arrival_time":0.1,"prompt_len":5,"output_len":1,'
                  '"session_id":"\\udc00"}')
    assert [s.request_id for s in load_trace(path)] == ["é✓", "r1"]
    conv = [{**SHAREGPT[0], "id": "\ud800"}, {**SHAREGPT[0], "id": "ok"}]
    tr = load_trace(_write(tmp_path, "s.json", json.dumps(conv)), rate=1.0)
    assert sorted(s.request_id for s in tr) == ["0", "ok"]
    assert any("lone surrogate" in n for n in tr.notes)
    clash = _jsonl(tmp_path, {**ROW, "request_id": "r1"}, {**ROW, "arrival_time": 0.1}, {**ROW, "arrival_time": 0.2},
                   name="clash.jsonl")
    assert [s.request_id for s in load_trace(clash)] == ["r1", "r1_1", "r2"]
    assert main(_stats(clash)) == 0


def test_bench_result_seeds(tmp_path):
    """A2 / B5: redrawn arrivals use seed_arrivals when given, else the seed option (the CLI's --seed)."""
    path = _result(tmp_path, _no_start)

    def times(**kw):
        return [s.arrival_time for s in load_bench_result(path, **kw)]

    assert times() == times(seed=0) == times(seed_arrivals=0)
    assert times(seed=5) == times(seed_arrivals=np.int64(5)) != times()
    assert "(seed 5)" in load_trace(path, seed=5).notes[0]
    assert times(seed=5, seed_arrivals=0) == times()
    assert len(load_trace(_result(tmp_path, name="whole.json"))) == 39  # the fixture: 1 failed request dropped


def test_bench_result_null_seconds_of_a_failed_request_load(tmp_path):
    """B6: null stays allowed where vLLM has no number (a failed request)."""
    res = json.loads(BENCH_RESULT.read_text())
    bad = next(i for i, e in enumerate(res["errors"]) if e)
    res["ttfts"][bad] = res["latencies"][bad] = None
    assert len(load_trace(_write(tmp_path, "r.json", json.dumps(res)))) == 39


def test_too_long_error_prompt_plus_output_and_the_workloads_own_max_model_len(tmp_path):
    """B1: a request whose prompt + output passes max_model_len runs as the engine runs it (its output stopped
    there), counted in a note, never unsaid; one that just fits has no note; "clip" cuts it to fit.
    B2: under "clip" the workload's own max_model_len is kept when it is the tighter one, else the engine's."""
    fits = _jsonl(tmp_path, {**ROW, "prompt_len": 8000, "output_len": 192}, name="fits.jsonl")
    wl = _wl(tmp_path, fits)
    assert wl.specs[0].output_len == 192 and not any("pass max_model_len" in n for n in wl.notes)
    over = _jsonl(tmp_path, {**ROW, "prompt_len": 8000, "output_len": 1000, "request_id": "big"}, ROW,
                  name="over.jsonl")
    for too_long in ("error", "reject"):
        wl = _wl(tmp_path, over, too_long=too_long)
        assert [s.output_len for s in wl.specs if s.request_id == "big"] == [1000]  # the engine stops it
        assert [n for n in wl.notes if "pass max_model_len" in n] == [
            "1 requests (first big: prompt 8000 + output 1000) pass max_model_len 8192: the engine stops their "
            "output there, as vLLM's engine does (its server would refuse such a max_tokens with HTTP 400; "
            "too_long = \"clip\" cuts them to fit)"]
    wl = _wl(tmp_path, over, too_long="clip")
    assert wl.specs[0].output_len == 192 and wl.num_clipped == 1
    assert _wl(tmp_path, over, too_long="reject").specs[0].output_len == 1000  # the engine stops it
    big = _jsonl(tmp_path, *[{**ROW, "prompt_len": 500, "output_len": 50}] * 3, name="big.jsonl")
    for own, cut in ((100, 100), (100.0, 100), (np.int64(100), 100), (10**6, 8192)):
        wl = _wl(tmp_path, big, too_long="clip", max_model_len=own)
        assert max(s.prompt_len + s.output_len for s in wl.specs) <= cut
    # the workload's own cut is named in a note; num_clipped counts the engine's (the run's summary names it)
    own = _wl(tmp_path, big, too_long="clip", max_model_len=100)
    assert own.num_clipped == 0 and "3 requests were cut by the trace option max_model_len = 100 to fit" in own.notes[-1]
    with pytest.raises(ConfigError, match="trace option max_model_len"):
        _wl(tmp_path, big, too_long="clip", max_model_len=True)


def test_trace_workload_carries_the_loaders_notes(tmp_path):
    """B3 (the workloads side): the loader's notes and skipped-row reasons travel with the workload."""
    path = _jsonl(tmp_path, {**ROW, "arrival_time": 1.0}, {**ROW, "arrival_time": -1}, ROW)
    wl = _wl(tmp_path, path, skip_bad_rows=True)
    assert wl.num_skipped == 1 and len(wl.errors) == 1 and "t.jsonl:2" in wl.errors[0]
    assert any("sorted by arrival" in n for n in wl.notes)


def test_bench_jsonl_arrival_options_valid_and_unused_are_said(tmp_path):
    """B4: valid arrival options on recorded times load, with a note that they are not used."""
    tr = load_trace(_jsonl(tmp_path, BENCH, {**BENCH, "arrival_time_ns": 10**9}), arrival="gamma", burstiness=2.0,
                    tokens_per_word=2.0)
    assert [s.arrival_time for s in tr] == [0.0, 1.0]
    assert any("not used" in n and "arrival_time_ns" in n for n in tr.notes)
    assert any("tokens_per_word = 2 not used" in n for n in tr.notes)
    drawn = load_trace(_jsonl(tmp_path, BENCH, BENCH, name="d.jsonl"), rate=2.0, arrival="gamma", burstiness=2.0)
    assert len(drawn) == 2 and any("replaced by drawn" in n for n in drawn.notes)


def test_burstgpt_model_and_spread_ties_and_quoted_cells_valid(tmp_path, capsys):
    """B9 / C4 / C5: a model that matches ignoring case, ties spread within the clock, a quoted multi-line
    cell with a valid number: all load."""
    burst = _write(tmp_path, "b.csv", BURST + "5,ChatGPT,100,20,120,Conv\n6,GPT-4,100,20,120,Conv\n")
    assert len(load_trace(burst, model="chatgpt")) == 1
    moon = _jsonl(tmp_path, {**MOON, "timestamp": 0}, {**MOON, "timestamp": 0}, {**MOON, "timestamp": 10})
    assert [s.arrival_time for s in load_trace(moon, spread_ties=True)] == [0.0, 0.005, 0.01]
    az = _write(tmp_path, "a.csv", AZURE + '"2023-11-16 18:15:46","374\n",44\n2023-11-16 18:15:47,100,4\n')
    assert [s.prompt_len for s in load_trace(az)] == [374, 100]


def test_append_result_file_still_named(tmp_path):
    """C6: a file of several results (--append-result) keeps its own message."""
    one = json.dumps(json.loads(BENCH_RESULT.read_text()))
    path = _write(tmp_path, "two.json", one + "\n" + one + "\n")
    with pytest.raises(TraceFormatError, match="holds 2 results"):
        load_trace(path, format="vllm-bench-result")


@pytest.mark.parametrize("gz", [False, True])
def test_bom_in_servesim_jsonl(tmp_path, gz):
    """D1: a UTF-8 BOM, plain or gzipped, as every other format's reader takes it."""
    text = "\ufeff" + json.dumps(ROW) + "\n" + json.dumps({**ROW, "arrival_time": 1.0}) + "\n"
    path = tmp_path / ("b.jsonl.gz" if gz else "b.jsonl")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    assert len(load_trace(path)) == len(load_jsonl(path)) == 2
    assert len(_wl(tmp_path, str(path)).specs) == 2


def test_integral_floats_in_segments_hash_ids_and_limit(tmp_path):
    """D3: 50.0 is an integer in segment lengths, Mooncake hash_ids and [workload] limit."""
    seg = load_trace(_jsonl(tmp_path, {**ROW, "prompt_len": 50, "segments": [["sys", 50.0]]}))
    assert seg.specs[0].segments == (("sys", 50),)
    moon = load_trace(_jsonl(tmp_path, {**MOON, "hash_ids": [1.0, 2.0]}, name="m.jsonl"), format="mooncake")
    assert moon.specs[0].hash_ids == (1, 2) and all(type(h) is int for h in moon.specs[0].hash_ids)
    assert len(_wl(tmp_path, _jsonl(tmp_path, *[ROW] * 8, name="l.jsonl"), limit=5.0).specs) == 5


def test_every_refusal_is_a_servesim_error():
    """The API cases raise the project's error type (the CLI's one line, exit 2), never a TypeError."""
    assert all(issubclass(c[2], ServesimError) for c in API_CASES)
