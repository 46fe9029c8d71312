"""The hostile corpus, the CLI's third round (2026-12-05): calibrate's flags checked before it times
anything, sweep's Ray address, output paths, single-value options given twice with different values
(argparse kept the last), flags that contradict each other or do nothing without --out. Each ends in exit
code 2 and one line before any engine runs (the harness of part one); what must still work is at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_inputs import QUICK, SIZING, no_simulation, run_bad_case  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

CAL = ["calibrate", "--smoke", "--device", "cpu"]
SWEEP = ["sweep", QUICK, "--grid", "engine.max_num_seqs=8,16"]


def _file(t: Path) -> str:
    p = t / "afile"
    p.write_text("x")
    return str(p)


CASES = [
    # calibrate: a traceback after the suite ran, or a value clamped / ignored
    ("calibrate-tp-0", lambda t: [*CAL, "--out", str(t / "o"), "--tp", "0"], ["--tp", "got 0"]),
    ("calibrate-tp-3", lambda t: [*CAL, "--out", str(t / "o"), "--tp", "3"], ["--tp 3", "does not divide"]),
    ("calibrate-out-file", lambda t: [*CAL, "--out", _file(t)], ["--out", "afile"]),
    ("calibrate-out-under-file", lambda t: [*CAL, "--out", _file(t) + "/sub"], ["--out", "afile"]),
    ("calibrate-iters-0", lambda t: [*CAL, "--out", str(t / "o"), "--iters", "0"], ["--iters", "got 0"]),
    ("calibrate-max-tokens-smoke", lambda t: [*CAL, "--out", str(t / "o"), "--max-tokens", "64"],
     ["--max-tokens 64", "--smoke"]),
    ("calibrate-gpu-unknown", lambda t: [*CAL, "--out", str(t / "o"), "--gpu", "NopeGPU"], ["NopeGPU"]),
    # sweep --backend ray
    ("sweep-ray-address-bad", lambda t: [*SWEEP, "--out", str(t / "s.csv"), "--backend", "ray", "--address",
                                         "bad:::addr"], ["--address", "bad:::addr", "HOST:PORT"]),
    ("sweep-ray-address-empty", lambda t: [*SWEEP, "--out", str(t / "s.csv"), "--backend", "ray", "--address", ""],
     ["--address ''"]),
    ("sweep-ray-jobs", lambda t: [*SWEEP, "--out", str(t / "s.csv"), "--backend", "ray", "--jobs", "2"],
     ["--jobs 2", "ray"]),
    # output paths
    ("run-out-empty", lambda t: ["run", QUICK, "--out", ""], ["--out", "empty path"]),
    ("size-out-empty", lambda t: ["size", SIZING, "--out", ""], ["--out", "empty path"]),
    ("sweep-out-under-file", lambda t: [*SWEEP, "--out", _file(t) + "/x.csv"], ["--out", "is a file"]),
    # a single-value option given twice with different values
    ("run-out-twice", lambda t: ["run", QUICK, "--out", str(t / "a"), "--out", str(t / "b")],
     ["--out", "given twice"]),
    ("plan-gpu-twice", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090", "--gpu", "H100"],
     ["--gpu", "given twice"]),
    ("schema-section-twice", lambda t: ["schema", "--section", "model", "--section", "engine"],
     ["--section", "given twice"]),
    # contradictions and flags that do nothing
    ("size-progress-quiet", lambda t: ["size", SIZING, "--progress", "--quiet"], ["--progress and --quiet"]),
    ("run-step-trace-and-steps-jsonl", lambda t: ["run", QUICK, "--out", str(t / "o"), "--step-trace",
                                                  "--steps-jsonl"], ["--step-trace and --steps-jsonl"]),
    ("run-plotlyjs-no-out", lambda t: ["run", QUICK, "--plotlyjs", "cdn"], ["--plotlyjs", "--out"]),
    ("size-plotlyjs-no-out", lambda t: ["size", SIZING, "--plotlyjs", "cdn"], ["--plotlyjs", "--out"]),
    ("fit-quiet-no-from-run", lambda t: ["fit", "--recipe", "rtx-4090", "--quiet"], ["--quiet", "--from-run"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_cli3_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


def test_repeats_that_are_not_contradictions():
    """--goodput given twice adds both targets (argparse kept the last: ttft:1 was dropped); the same value
    twice is no contradiction."""
    from sim.cli.main import build_parser

    p = build_parser()
    assert p.parse_args(["run", QUICK, "--goodput", "ttft:1", "--goodput", "tpot:50"]).goodput == ["ttft:1", "tpot:50"]
    assert p.parse_args(["plan", "--gpu", "H100", "--gpu", "H100"]).gpu == "H100"
    assert p.parse_args(["run", QUICK]).plotlyjs is None  # the default: directory, where --out writes


def test_ray_addresses_of_the_forms_ray_takes():
    from sim.app.sweep import check_ray_address

    for a in ("auto", "local", "127.0.0.1:6379", "ray://head-0.example:10001", "[::1]:6379", "[::ffff:10.0.0.1]:6379"):
        check_ray_address(a)


def test_pure_env_junk_warns(monkeypatch):
    import sim.native as native

    monkeypatch.setenv(native.PURE_ENV, "maybe")
    monkeypatch.setattr(native, "active", lambda: True)  # nothing to load again: only the check runs
    with pytest.warns(RuntimeWarning, match="SERVESIM_PURE='maybe' is not understood"):
        native.install()


@pytest.mark.parametrize(("raw", "pure"), [(" 1", True), ("true", True), ("YES", True), ("on ", True),
                                           ("0", False), ("false", False), ("", False), (" no", False)])
def test_pure_env_spellings(monkeypatch, recwarn, raw, pure):
    """Spaced and spelled-out switches are understood, without a warning."""
    import sim.native as native

    monkeypatch.setenv(native.PURE_ENV, raw)
    assert native.pure_setting() is pure
    assert not [w for w in recwarn if "not understood" in str(w.message)]


def test_pure_env_junk_warning_is_one_line(tmp_path):
    """The warning names the value in one stderr line (warnings.warn added the calling source line)."""
    env = {**os.environ, "SERVESIM_PURE": "maybe"}
    p = subprocess.run([sys.executable, "-c", "import sim"], capture_output=True, text=True, env=env, cwd=REPO)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]  # (a stale build adds its own one-line warning)
    assert p.returncode == 0 and all(ln.startswith("servesim:0: RuntimeWarning: ") for ln in lines), p.stderr
    assert len([ln for ln in lines if "SERVESIM_PURE='maybe' is not understood" in ln]) == 1, p.stderr


def test_calibrate_tp_replicating_kv_heads_passes_the_checks(tmp_path):
    """TP 8 on a model with 4 KV heads replicates them (vLLM does; `run` takes it): not refused."""
    import argparse

    from sim.cli.calibrate import _check_calibrate

    _check_calibrate(argparse.Namespace(out=str(tmp_path / "o"), iters=3, max_tokens=16384, tp=8, smoke=True,
                                        model="Qwen3-30B-A3B", gpu=None))
