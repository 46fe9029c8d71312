"""The command line: outputs written, summary keys, and one clear line + exit 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.cli.main import main
from tests.helpers import small_toml

ROOT = Path(__file__).resolve().parents[1]
SMALL = small_toml(40, 120)


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    p = tmp_path / "small.toml"
    p.write_text(SMALL)
    return p


def test_run_writes_every_output(cfg: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--step-trace"]) == 0
    for name in ("requests.parquet", "steps.parquet", "steps.jsonl", "summary.json", "report.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for key in ("completed", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
                "p99_ttft_ms", "p90_tpot_ms", "p95_itl_ms", "p50_e2el_ms", "num_preemptions",
                "prefix_cache_hit_rate", "mean_kv_cache_usage", "max_kv_cache_usage", "request_goodput"):
        assert key in summary, key
    assert summary["completed"] == 40
    reqs = pd.read_parquet(out / "requests.parquet")
    assert len(reqs) == 40 and (reqs["status"] == "finished").all()
    line = json.loads((out / "steps.jsonl").read_text().splitlines()[0])
    for key in ("time", "scheduled", "preempted", "finished", "num_running", "num_waiting",
                "num_free_blocks", "kv_usage"):
        assert key in line
    assert isinstance(line["scheduled"][0], list) and len(line["scheduled"][0]) == 2
    # Every scheduled token in the trace is accounted for in the steps table.
    steps = pd.read_parquet(out / "steps.parquet")
    total = sum(n for rec in map(json.loads, (out / "steps.jsonl").read_text().splitlines())
                for _, n in rec["scheduled"])
    assert total == steps["num_scheduled_tokens"].sum()


def test_steps_jsonl_only_when_asked_and_then_with_counts(cfg: Path, tmp_path: Path):
    """steps.parquet holds every step's counts; steps.jsonl repeats them as text only with --steps-jsonl
    (a million requests would write ~4.5 GB of it), or lists each step's rows with --step-trace."""
    out = tmp_path / "plain"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    assert (out / "steps.parquet").is_file() and not (out / "steps.jsonl").exists()
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--steps-jsonl"]) == 0
    lines = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    steps = pd.read_parquet(out / "steps.parquet")
    assert len(lines) == len(steps) and sum(rec["scheduled"] for rec in lines) == steps["num_scheduled_tokens"].sum()


def test_set_override_and_json(cfg: Path, capsys):
    assert main(["run", str(cfg), "--set", "engine.max_num_seqs=2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["engine"]["max_num_seqs"] == 2
    assert summary["max_concurrent_requests"] <= 2 + summary["num_requests"]


def test_run_goodput_takes_vllm_bench_syntax_in_ms(cfg: Path, capsys):
    assert main(["run", str(cfg), "--goodput", "ttft:1000", "tpot:50", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 50.0} and s["request_goodput"] is not None
    assert main(["run", str(cfg), "--goodput", "ttft:0.001", "--json"]) == 0  # 1 µs: no request is good
    assert json.loads(capsys.readouterr().out)["request_goodput"] == 0
    assert main(["run", str(cfg), "--goodput", "ttft=1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--goodput ttft:1000" in err[0], err


def test_run_plotlyjs_modes(cfg: Path, tmp_path: Path):
    assert main(["run", str(cfg), "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "plotly.min.js").stat().st_size > 1_000_000
    assert (tmp_path / "d" / "report.html").stat().st_size < 1_000_000  # the data, not the library
    assert main(["run", str(cfg), "--out", str(tmp_path / "c"), "--plotlyjs", "cdn"]) == 0
    assert not (tmp_path / "c" / "plotly.min.js").exists()
    assert "cdn.plot.ly" in (tmp_path / "c" / "report.html").read_text()


@pytest.mark.parametrize("override,needle", [
    ("engine.max_num_seqs=-1", "max_num_seqs"),
    ("engine.bogus=1", "unknown key 'bogus'"),
    ("engine.max_num_seqs=\"many\"", "max_num_seqs"),
    ("workload.rate=-2", "rate"),
    ("engine.policy=\"nope\"", "unknown policy 'nope'"),
    ("model.name=\"Llama-9-9000B\"", "Llama-9-9000B"),
    ("engine.gpu_memory_utilization=1.5", "gpu_memory_utilization"),
])
def test_bad_input_is_one_clear_line(cfg: Path, capsys, override: str, needle: str):
    assert main(["run", str(cfg), "--set", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("servesim: error:") and needle in err[0], err


def test_model_that_does_not_fit(cfg: Path, capsys):
    assert main(["run", str(cfg), "--set", "model.name=\"Llama-2-70B\""]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "GiB" in err


def test_request_longer_than_max_model_len_is_rejected_with_reason(tmp_path: Path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_time": 0.0, "prompt_len": 100, "output_len": 5}\n'
                     '{"arrival_time": 0.1, "prompt_len": 9000, "output_len": 5}\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\nname = "Mistral-7B"\n[hardware]\ngpu = "RTX 4090"\n'
                   f'[engine]\nmax_model_len = 4096\n[workload]\ntrace = "{trace}"\n')
    # By default a request that cannot fit is a configuration error naming it...
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "request r1" in err and "max_model_len 4096" in err
    # ... or, on request, it is rejected with a reason as vLLM's API would, and the rest still runs.
    assert main(["run", str(cfg), "--json", "--set", 'workload.too_long="reject"']) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["num_finished"] == 1 and s["num_rejected"] == 1
    assert any("max_model_len" in r for r in s["rejection_reasons"])


def test_malformed_trace_row(tmp_path: Path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_time": 0.0, "prompt_len": 100, "output_len": 5}\n{"arrival_time": oops}\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\nname = "Mistral-7B"\n[hardware]\ngpu = "RTX 4090"\n'
                   f'[engine]\nmax_model_len = 4096\n[workload]\ntrace = "{trace}"\n')
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:2" in err


def test_plan_json_reproduces_seeds(capsys):
    assert main(["plan", "--seeds-example", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    text = json.dumps(data)
    assert "131072" in text


def test_console_script_entry_point(cfg: Path):
    """`python -m sim.cli.main` behaves like the installed `servesim` script (exit code 2 on bad input)."""
    proc = subprocess.run([sys.executable, "-m", "sim.cli.main", "run", str(cfg), "--set", "workload.rate=-1"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "servesim: error:" in proc.stderr and "Traceback" not in proc.stderr


def test_examples_run(capsys):
    for name in ("quickstart.toml", "seed_24gb.toml", "trace_replay.toml"):
        assert main(["run", str(ROOT / "examples" / name), "--set", "simulation.num_requests=24",
                     "--json"]) == 0
        s = json.loads(capsys.readouterr().out)
        assert s["num_finished"] == 24


def test_demo_quick(tmp_path: Path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "128.00 KiB" in out and "= 11" in out
    assert (tmp_path / "report.html").is_file()
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.js")] == ["plotly.min.js"]
    assert not list(tmp_path.rglob("steps.jsonl"))  # the same counts as steps.parquet
    df = pd.read_csv(tmp_path / "concurrency_sweep.csv", index_col=0)
    assert list(df.index) == [4, 8, 16, 32]
