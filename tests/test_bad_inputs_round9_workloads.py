"""The hostile corpus, ninth round (workloads and traces): settings that were taken without a word, or
refused with a message that did not say what is allowed. Each refusal is one line and exit 2 before any
engine runs, beside it the nearest valid input still runs; where a refusal would be too harsh (a cap, a
sizing search's client count) the run says what happened in a note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "sample_trace.jsonl"  # 200 rows with arrival times

HEAD = """[model]
name = "Mistral-7B"
[hardware]
gpu = "RTX 4090"
[engine]
cost_model = "constant"
constant_step_s = 0.01
max_model_len = 8192
"""
OPEN = HEAD + """[workload]
rate = 4.0
num_requests = 6
prompt = { dist = "fixed", value = 64 }
output = { dist = "fixed", value = 8 }
"""
CLOSED = HEAD + """[workload]
kind = "closed"
num_clients = 4
num_requests = 12
prompt = 64
output = 8
"""


def _trace_cfg(t: Path) -> str:
    shutil.copy(SAMPLE, t / "sample_trace.jsonl")
    (t / "tr.toml").write_text(HEAD + '[workload]\ntrace = "sample_trace.jsonl"\n')
    return str(t / "tr.toml")


def _cfg(t: Path, text: str) -> str:
    (t / "c.toml").write_text(text)
    return str(t / "c.toml")


def _run(argv: list[str], capsys) -> tuple[str, str]:
    """``servesim ARGV`` that must succeed: (stdout, stderr)."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err
    return out, err


def _json_run(argv: list[str], capsys) -> dict:
    out, _ = _run([*argv, "--json"], capsys)
    return json.loads(out)


def _prompt(t: Path, table: str, base: str = OPEN) -> list[str]:
    return ["run", _cfg(t, base), "--set", f"workload.prompt={table}"]


def _csv(t: Path, text: str) -> str:
    (t / "lens.csv").write_text(text)
    return f'{{dist="empirical",csv="{t / "lens.csv"}",column="len"}}'


CASES = [
    # 1: a trace's seed draws nothing without sample (as `trace stats --seed` says)
    ("trace-seed-without-sample", lambda t: ["run", _trace_cfg(t), "--set", "workload.seed=5"],
     ["workload.seed = 5", "nothing is drawn at random here", "allowed: seed with sample"]),
    # 2: rate_scale k is time_scale 1/k, bounded alike
    ("trace-stats-rate_scale-1e300", lambda t: ["trace", "stats", str(SAMPLE), "--rate-scale", "1e300"],
     ["trace option rate_scale", "1e+300", "allowed rate_scale <= 1e+06"]),
    ("trace-stats-rate_scale-1e7", lambda t: ["trace", "stats", str(SAMPLE), "--rate-scale", "1e7"],
     ["trace option rate_scale", "1e+07", "allowed rate_scale <= 1e+06"]),
    # 5: a normal whose every draw lies outside [min, max] (as lognormal's check)
    ("normal-below-min", lambda t: _prompt(t, '{dist="normal",mean=100,std=10,min=500}'),
     ["workload.prompt", "mean=100 std=10", "clipped to min (500)", "allowed", "mean + 6*std >= 499.5"]),
    ("normal-above-max", lambda t: _prompt(t, '{dist="normal",mean=100,std=10,max=30}'),
     ["workload.prompt", "mean=100 std=10", "clipped to max (30)", "allowed", "mean - 6*std <= 30.5"]),
    ("lognormal-above-max", lambda t: _prompt(t, '{dist="lognormal",mean=1000,std=100,max=50}'),
     ["workload.prompt", "mean=1000 std=100", "clipped to max (50)", "allowed"]),
    # 6: empirical lengths are token counts (as fixed's value)
    ("empirical-values-fraction", lambda t: _prompt(t, '{dist="empirical",values=[1.5,2.5]}'),
     ["workload.prompt.values[0]", "1.5", "expected an integer"]),
    ("empirical-csv-fraction", lambda t: _prompt(t, _csv(t, "len\n100\n1.5\n")),
     ["workload.prompt", "lens.csv row 3", "'len'", "1.5", "allowed integer token counts"]),
    # 7: uniform takes low/high; min/max only clip
    ("uniform-min-max", lambda t: _prompt(t, '{dist="uniform",min=10,max=100}'),
     ["workload.prompt.low", "required", "low..high", "min = 10, max = 100", "clip", "allowed"]),
    ("uniform-low-max", lambda t: _prompt(t, '{dist="uniform",low=10,max=100}'),
     ["workload.prompt.high", "required", "low..high", "max = 100", "allowed"]),
    # 8: a misspelt think_dist is named as such, with or without think_time
    ("closed-think_dist-bogus-alone", lambda t: ["run", _cfg(t, CLOSED), "--set", "workload.think_dist=bogus"],
     ["workload.think_dist", "'bogus'", "expected 'fixed' or 'exponential'"]),
    ("sessions-think_dist-bogus-alone", lambda t: ["run", _cfg(t, HEAD + """[workload]
kind = "sessions"
num_sessions = 3
num_clients = 2
turns = 2
message = 20
output = 5
think_dist = "bogus"
""")], ["workload (sessions).think_dist", "'bogus'", "expected 'fixed' or 'exponential'"]),
    # 9: the prefix numbers' block size is a positive number of tokens (a Mooncake hash block is 512)
    ("trace-stats-block-size-0", lambda t: ["trace", "stats", str(SAMPLE), "--block-size", "0"],
     ["--block-size", "got 0", "allowed 1 to 65536 tokens"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_round9_workloads_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- the nearest valid inputs still run -------------------------------------------------------------


def test_trace_seed_with_sample_runs(tmp_path, capsys):
    s = _json_run(["run", _trace_cfg(tmp_path), "--set", "workload.seed=5", "--set", "workload.sample=50"], capsys)
    assert s["num_requests"] == 50 and "sampled 50 of 200 requests (seed 5)" in s["trace_notes"]


def test_trace_stats_rate_scale_at_the_bound_and_a_run_at_a_high_rate_scale(tmp_path, capsys):
    _run(["trace", "stats", str(SAMPLE), "--rate-scale", "1e6"], capsys)
    _run(["trace", "stats", str(SAMPLE), "--time-scale", "1e-6"], capsys)
    # a user's rate_scale is bounded as time_scale is (round 10), but a run keeps it open for the sizing
    # search, which replays a trace at 1e12, its offline point
    from sim.app.config import load_config
    from sim.app.simulate import simulate
    from sim.app.sizing import LoadKnob

    offline = LoadKnob("rate_scale", 1.0, "req/s").offline(load_config(_trace_cfg(tmp_path)))
    assert offline.workload["rate_scale"] == 1e12
    assert len(simulate(offline).requests) == 200


@pytest.mark.parametrize("option,note", [
    ("workload.max_model_len=100", "200 requests were cut by the trace option max_model_len = 100 to fit"),
    ("workload.max_prompt_len=10", "200 prompts were cut by the trace option max_prompt_len = 10"),
    ("workload.max_output_len=1", "200 outputs were cut by the trace option max_output_len = 1"),
])
def test_clip_note_names_the_trace_option_that_cut(option, note, tmp_path, capsys):
    """3: the run's digest used to say "cut to fit max_model_len 8192" (the engine's) for any cut."""
    out, _ = _run(["run", _trace_cfg(tmp_path), "--set", option], capsys)
    assert f"note: trace: {note}" in out, out
    assert "cut to fit max_model_len 8192" not in out


def test_clip_note_names_the_engines_max_model_len_when_it_cut(tmp_path, capsys):
    cfg = _trace_cfg(tmp_path)
    out, _ = _run(["run", cfg, "--set", "workload.too_long=clip", "--set", "engine.max_model_len=300"], capsys)
    assert "note: 200 requests were cut to fit max_model_len 300" in out and "trace option" not in out
    # the trace's own max_model_len, tighter than the engine's, is the one named
    out, _ = _run(["run", cfg, "--set", "workload.too_long=clip", "--set", "engine.max_model_len=300", "--set",
                   "workload.max_model_len=200"], capsys)  # fmt: skip
    assert "cut by the trace option max_model_len = 200 to fit" in out and "fit max_model_len 300" not in out


def test_num_requests_past_the_traces_rows_is_said(tmp_path, capsys):
    """4: a cap past the trace's rows ran 200 requests without a word."""
    cfg = _trace_cfg(tmp_path)
    out, _ = _run(["run", cfg, "--set", "workload.num_requests=100000"], capsys)
    assert "note: trace: num_requests = 100000, but the trace has only 200 rows: 200 requests run" in out
    s = _json_run(["run", cfg, "--set", "workload.num_requests=100"], capsys)
    assert s["num_requests"] == 100 and not any("num_requests" in n for n in s.get("trace_notes", ()))
    s = _json_run(["run", cfg, "--set", "workload.num_requests=300", "--set", "workload.sample=50"], capsys)
    assert "num_requests = 300, but the trace has only 50 requests left of its 200 rows: 50 requests run" in s[
        "trace_notes"]


@pytest.mark.parametrize("table", [
    '{dist="normal",mean=100,std=10,min=50,max=150}',
    '{dist="normal",mean=100,std=10,min=130}',  # 3 sigma up: some draws reach it
    '{dist="lognormal",mean=1000,std=400,max=500}',
    '{dist="empirical",values=[1.0,2,300]}',  # integral floats are counts
    '{dist="uniform",low=10,high=100,min=20,max=90}',
])
def test_nearest_valid_length_tables_run(table, tmp_path, capsys):
    s = _json_run(_prompt(tmp_path, table), capsys)
    assert s["num_finished"] == 6


def test_empirical_csv_of_integral_counts_runs(tmp_path, capsys):
    s = _json_run(_prompt(tmp_path, _csv(tmp_path, "len\n100\n2.0\n0\n")), capsys)
    assert s["num_finished"] == 6


def test_schema_lists_the_dists_that_are_accepted(tmp_path, capsys):
    """7: the schema named zipf and csv as dists, which are refused."""
    from sim.app.schema import WORKLOAD_SCHEMA
    from workloads.gen.lengths import DISTS

    text = WORKLOAD_SCHEMA["properties"]["prompt"]["description"]
    assert "dist = fixed|uniform|normal|lognormal|empirical," in text and "zipf" not in text
    assert set(text.split("dist = ")[1].split(",")[0].split("|")) == set(DISTS)


def test_closed_loop_clients_past_the_requests_are_said(tmp_path, capsys):
    """8: 100000 clients for 12 requests ran without a word; a sizing search may pass num_requests, so a note."""
    cfg = _cfg(tmp_path, CLOSED)
    out, _ = _run(["run", cfg, "--set", "workload.num_clients=100000"], capsys)
    assert "num_clients = 100000 for num_requests = 12: only 12 clients send a request" in out
    s = _json_run(["run", cfg, "--set", "workload.num_clients=12"], capsys)
    assert s["num_finished"] == 12 and "trace_notes" not in s


def test_think_dist_with_an_explicit_think_time_runs(tmp_path, capsys):
    """8: think_dist with think_time (a 0 too: an explicit 0 with its shape is a choice, the low end of a
    sweep) runs; without think_time it is refused (tests/test_bad_inputs_configs4.py)."""
    cfg = _cfg(tmp_path, CLOSED)
    for dist in ("fixed", "exponential"):
        for think in ("0", "0.5"):
            s = _json_run(["run", cfg, "--set", f"workload.think_dist={dist}", "--set", f"workload.think_time={think}"],
                          capsys)  # fmt: skip
            assert s["num_finished"] == 12


@pytest.mark.parametrize("size", ["1", "8", "32", "128", "7", "512"])
def test_trace_stats_block_sizes_the_engine_takes(size, capsys):
    out, _ = _run(["trace", "stats", str(SAMPLE), "--block-size", size], capsys)
    assert f"(block {size})" in out
