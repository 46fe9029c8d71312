"""The Python API (servesim/__init__.py): its docstring example runs, run() takes paths, dicts, configs
and table overrides, and --version answers."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from sim.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
W = {"num_requests": 6, "rate": 3.0, "prompt": {"dist": "fixed", "value": 64}, "output": {"dist": "fixed", "value": 8}}


def test_the_docstring_example_runs():
    assert doctest.testmod(servesim, raise_on_error=False).failed == 0


def test_run_from_a_path_a_dict_and_a_config_gives_the_same_run():
    path = ROOT / "examples" / "quickstart.toml"
    a = servesim.run(path, simulation={"num_requests": 12})
    b = servesim.run(servesim.load_config(path), simulation={"num_requests": 12})
    assert len(a.requests) == 12 and a.summary["completed"] == b.summary["completed"]
    pd_cols = {"ttft_s", "e2el_s", "status"}
    assert pd_cols <= set(a.requests.columns) and len(a.steps) == len(b.steps) > 0
    c = servesim.run({"workload": W}, engine={"max_num_seqs": 2})
    assert c.raw.meta["limits"]["max_num_seqs"] == 2 and c.summary["completed"] == 6


def test_a_bad_override_names_the_table():
    with pytest.raises(ConfigError, match=r"servesim\.run\(engine=\.\.\.\): expected a table"):
        servesim.run({"workload": W}, engine=4)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        servesim.run({"workload": W}, engine={"max_num_seqs": "many"})


def test_version():
    out = subprocess.run([sys.executable, "-m", "sim.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"servesim {servesim.__version__}"
    assert servesim.__version__ != "0+unknown"


BENCH = Path(__file__).resolve().parent / "data" / "runs" / "vllm_bench_result.json"


def test_compare_is_what_the_cli_prints_as_json(capsys):
    from sim.cli.main import main

    d = servesim.compare(BENCH, max_per_stage=20)
    assert main(["compare", str(BENCH), "--max-per-stage", "20", "--json"]) == 0
    assert d == json.loads(capsys.readouterr().out)
    assert d["overall"]["ttft_mean_ms"]["real"] == json.loads(BENCH.read_text())["mean_ttft_ms"]
    as_dict = servesim.compare(BENCH, overrides={"engine": {"max_num_seqs": 8}}, max_per_stage=20)
    as_set = servesim.compare(BENCH, overrides=["engine.max_num_seqs=8"], max_per_stage=20)
    assert as_dict == as_set and as_dict["settings"]["max_num_seqs"] == 8 != d["settings"]["max_num_seqs"]
    with pytest.raises(ConfigError, match=r"servesim\.compare\(overrides=\{'engine': \.\.\.\}\): expected a table"):
        servesim.compare(BENCH, overrides={"engine": 8})


def test_size_returns_the_result_or_the_cli_dict():
    cfg = {"engine": {"cost_model": "constant", "constant_step_s": 0.01},
           "workload": {"num_requests": 30, "rate": 4.0, "prompt": 64, "output": 8}}
    d = servesim.size(cfg, slo={"p99_ttft_ms": 200}, max_num_seqs=[4], replications=2, as_dict=True)
    assert d["slo"] == {"p99_ttft_ms": 200} and len(d["candidates"]) == 1
    with pytest.raises(ConfigError, match="ttft_p99"):
        servesim.size(cfg, slo={"ttft_p99": 1.0}, max_num_seqs=[4])
