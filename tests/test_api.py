"""The Python API (servesim/__init__.py): its docstring example runs, run() takes paths, dicts, configs
and table overrides, and --version answers."""

from __future__ import annotations

import doctest
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
