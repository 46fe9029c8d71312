"""Progress bars and console tables (issue 15, item 6): a bar only on a terminal and not with --quiet; a run
driven step by step for its bar gives exactly the run without it; tables never print scientific notation and
a yes/no column has no interval."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
import simpy

from sim.app.config import config_from_dict
from sim.app.progress import bar, run_env, wanted
from sim.app.simulate import simulate
from sim.app.tables import fixed, fixed_table
from sim.cli.main import main


@pytest.mark.parametrize("value, text", [
    (12345.6, "12346"), (123.456, "123.5"), (7.6156, "7.616"), (0.04213, "0.042"), (0.0, "0"),
    (1e7, "10000000"), (3, "3"), (True, "yes"), (False, "no"), (None, "-"), (float("nan"), "-"),
    (-2.5e5, "-250000"), ("least-kv", "least-kv"),
])  # fmt: skip
def test_fixed_number_format(value, text):
    assert fixed(value) == text


def test_fixed_table_formats_mixed_columns():
    t = pd.DataFrame({"a": [1.5e5, 0.25], "b": [True, None]}, index=["x", "y"])
    out = fixed_table(t, index=True)
    assert "150000" in out and "0.250" in out and "yes" in out and "e+" not in out


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_only_on_a_terminal_and_not_when_quiet():
    assert wanted(stream=_Tty()) and not wanted(quiet=True, stream=_Tty()) and not wanted(stream=io.StringIO())


def _ticker(env: simpy.Environment, n: int, seen: list[float]):
    for i in range(n):
        yield env.timeout(0.5 + (i % 3))
        seen.append(env.now)


def test_run_env_is_env_run_with_a_counter():
    out = io.StringIO()
    runs = []
    for progress in (None, bar(10_000, "run", enabled=True, stream=out, unit="req")):
        env, seen = simpy.Environment(), []
        env.process(_ticker(env, 10_000, seen))
        run_env(env, progress, lambda seen=seen: len(seen), every=1000)
        runs.append((env.now, seen))
    assert runs[0] == runs[1]  # same events, same clock
    assert "10000/10000" in out.getvalue() and "100%" in out.getvalue()


def test_a_run_with_progress_gives_the_same_results():
    cfg = config_from_dict({"engine": {"cost_model": "constant", "max_model_len": 2048, "max_num_seqs": 4},
                            "workload": {"rate": 40.0, "num_requests": 300, "prompt": {"dist": "uniform", "low": 16,
                                         "high": 256}, "output": {"dist": "uniform", "low": 4, "high": 64}}})  # fmt: skip
    a, b = simulate(cfg), simulate(cfg, progress=True)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert a.meta["end_time"] == b.meta["end_time"]


SWEEP_CFG = """[engine]
cost_model = "constant"
constant_step_s = 0.02
max_model_len = 2048
[workload]
rate = 100.0
num_requests = 40
prompt = {dist = "fixed", value = 32}
output = {dist = "fixed", value = 50}
"""


def test_sweep_table_is_fixed_and_yes_no_has_no_interval(tmp_path, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(SWEEP_CFG, encoding="utf-8")
    rc = main(["sweep", str(cfg), "--grid", "engine.max_num_seqs=1,64", "--replications", "2", "--jobs", "1",
               "--quiet", "--out", str(tmp_path / "r.parquet")])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""  # no bar: --quiet (and stderr is not a terminal)
    df = pd.read_parquet(tmp_path / "r.parquet")
    assert df["p99_ttft_ms"].max() > 1e4  # big enough that the old %.4g printed "e+04"
    assert "e+" not in out and "e-" not in out
    header, *rows = out.splitlines()[: 3]
    assert "saturated" in header
    for line in rows:
        cell = line.split()[-1]
        assert cell in ("yes", "no") or cell.startswith("yes ")  # a fraction of replications, no ±


def test_run_and_size_take_quiet(tmp_path, capsys):
    cfg = tmp_path / "r.toml"
    cfg.write_text(SWEEP_CFG, encoding="utf-8")
    assert main(["run", str(cfg), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 40
    from sim.cli.main import build_parser

    args = build_parser().parse_args(["size", str(cfg), "--quiet"])
    assert args.quiet is True
