"""Bad input through the Python API, fourth fuzz round (2026-12-05): ``servesim.size``'s keywords are
checked as the CLI checks its flags (each error names the keyword, before any simulation); SLO values are
numbers, not booleans or strings; an integer past any float is refused, not an OverflowError; messages
are one line whatever value they quote; a junk ``TQDM_*`` variable or ``SERVESIM_PURE`` is one line.
Beside the refusals, what must still work: numpy numbers, arrays and Series of candidates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.core.errors import ConfigError, ServesimError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json"
TINY = {"engine": {"cost_model": "constant", "constant_step_s": 0.01},
        "workload": {"num_requests": 12, "rate": 4.0, "prompt": {"dist": "fixed", "value": 64},
                     "output": {"dist": "fixed", "value": 8}}}  # fmt: skip
SLO = {"p99_ttft_ms": 200}

BAD_SIZE = [  # keyword -> value, and what the message must name
    ({"jobs": "x"}, ["jobs", "'x'"]),
    ({"jobs": 1.5}, ["jobs", "1.5"]),
    ({"jobs": 0}, ["jobs"]),
    ({"level": "x"}, ["level", "(0, 1)"]),
    ({"level": float("nan")}, ["level"]),
    ({"rel_tol": "x"}, ["rel_tol"]),
    ({"rel_tol": -1}, ["rel_tol"]),
    ({"min_attainment": 2}, ["min_attainment", "(0, 1]"]),
    ({"min_attainment": -1}, ["min_attainment"]),
    ({"min_attainment": "x"}, ["min_attainment"]),
    ({"knee_gain": "x"}, ["knee_gain"]),
    ({"replications": "2"}, ["replications", "'2'"]),
    ({"replications": True}, ["replications"]),
    ({"goal": None}, ["goal", "None"]),
    ({"progress": "no"}, ["progress", "'no'"]),
    ({"calibration": "x"}, ["calibration", "str"]),
    ({"vary": ["engine.max_num_seqs"]}, ["vary", "list"]),
    ({"vary": {"engine.max_num_batched_tokens": 4096}}, ["vary", "max_num_batched_tokens", "int"]),
    ({"vary": {"engine.max_num_batched_tokens": []}}, ["vary", "empty"]),
    ({"vary": {"engine.max_num_batched_tokens": [2048, 2048]}}, ["vary", "2048 given twice"]),
    ({"max_num_seqs": []}, ["max_num_seqs", "empty"]),
    ({"max_num_seqs": [4, 4]}, ["max_num_seqs", "4 given twice"]),
    ({"bogus": 1}, ["bogus", "unknown keyword"]),
    ({"as_dict": "no"}, ["as_dict", "'no'"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(("kw", "fragments"), BAD_SIZE, ids=[next(iter(k)) + f"-{i}" for i, (k, _) in enumerate(BAD_SIZE)])
def test_size_keywords_checked_before_any_run(kw, fragments):
    import servesim

    kw = {"max_num_seqs": [4], **kw}
    with pytest.raises(ConfigError) as exc:
        servesim.size(TINY, slo=SLO, replications=kw.pop("replications", 1), **kw)
    msg = str(exc.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(("slo", "fragments"), [
    ({"p99_ttft_ms": True}, ["p99_ttft_ms", "True"]),  # a bool was a 1 ms SLO
    ({"p99_ttft_ms": "200"}, ["p99_ttft_ms", "'200'"]),  # servesim.run refused it; size took it
    ({5: 5}, ["key 5"]),  # was a TypeError from the key's pattern match
    ({"ttft_ms": 10**400}, ["ttft_ms", "401 digits"]),  # was an OverflowError
])
def test_size_slo_values_are_numbers(slo, fragments):
    import servesim

    with pytest.raises(ConfigError) as exc:
        servesim.size(TINY, slo=slo, max_num_seqs=[4], replications=1)
    for frag in fragments:
        assert frag in str(exc.value)


@pytest.mark.usefixtures("no_simulation")
def test_run_slo_integer_past_any_float():
    import servesim

    with pytest.raises(ConfigError, match=r"\[slo\] ttft_ms: .*an integer of 401 digits"):
        servesim.run(TINY, slo={"ttft_ms": 10**400})


def test_set_slo_integer_past_any_float(capsys):
    run_bad_case(["run", str(ROOT / "examples" / "quickstart.toml"), "--set", "slo.ttft_ms=1" + "0" * 400],
                 ["slo", "ttft_ms", "digits"], capsys)


def test_size_takes_numpy_and_pandas_candidates():
    """What must keep working: numpy numbers, an array or a Series of candidates, a numpy SLO value."""
    import servesim

    res = servesim.size(TINY, slo={"p99_ttft_ms": np.float64(200)}, max_num_seqs=pd.Series([2, 4]),
                        vary={"engine.max_num_batched_tokens": np.array([1024, 2048])},
                        replications=np.int64(1), jobs=np.int64(1), level=np.float64(0.9))
    assert [c.params for c in res.candidates] == [
        {"engine.max_num_seqs": s, "engine.max_num_batched_tokens": t} for s in (2, 4) for t in (1024, 2048)]
    assert all(type(v) is int for c in res.candidates for v in c.params.values())
    out = servesim.size(TINY, slo=SLO, max_num_seqs=[4], replications=1, as_dict=np.bool_(True),
                        progress=np.bool_(False))
    assert isinstance(out, dict)


def test_compare_numpy_max_per_stage_and_none_override():
    import servesim

    out = servesim.compare(RUN, max_per_stage=np.int64(5))
    assert out["overall"]
    with pytest.raises(ConfigError, match=r"'max_num_seqs': None\}\}\): None has no --set spelling"):
        servesim.compare(RUN, overrides={"engine": {"max_num_seqs": None}})


def test_error_messages_are_one_line_whatever_they_quote():
    """A pandas Series, a 2-D array or a DataFrame in a message (their reprs span lines) reads as one line,
    through the API as through the CLI."""
    import servesim

    for bad in (pd.Series([5]), np.array([[1, 2], [3, 4]]), pd.DataFrame({"a": [1, 2]})):
        with pytest.raises(ServesimError) as exc:
            servesim.run(TINY, engine={"max_num_seqs": bad})
        assert "\n" not in str(exc.value) and "max_num_seqs" in str(exc.value)
    assert str(ConfigError("a\nb\rc")) == "a\\nb\\rc"


def test_junk_tqdm_variable_is_one_line_before_any_run(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[engine]\ncost_model = "constant"\nconstant_step_s = 0.01\n[workload]\nnum_requests = 8\n'
                   'rate = 4.0\nprompt = { dist = "fixed", value = 64 }\noutput = { dist = "fixed", value = 8 }\n')
    env = {**os.environ, "TQDM_MININTERVAL": "abc"}
    argv = [sys.executable, "-m", "sim.cli.main", "size", str(cfg), "--slo", "p99_ttft:200", "--max-num-seqs", "4",
            "--replications", "1", "--progress"]
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "TQDM_MININTERVAL='abc'" in lines[0]
    env["TQDM_MININTERVAL"] = "0.5"  # a value tqdm reads: the bar is drawn, the search runs
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
