"""bench/speed.py is not a test (its target is wall time), but it must keep running and stay
deterministic: a small generated trace through its own code path, with and without fast-forwarding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import simpy

from policies.base import make_policy
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource

SPEED = Path(__file__).resolve().parents[1] / "bench" / "speed.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_speed", SPEED)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_speed_bench_runs_and_is_deterministic():
    speed = _load()
    specs = speed.synthetic_specs(n=400, duration=80.0, seed=3)
    setup = speed.bench_setup()
    _, sim_a, steps_a = speed.run_once(setup, specs)
    _, sim_b, steps_b = speed.run_once(setup, specs)
    assert steps_a == steps_b > 400 and sim_a == sim_b > 80.0


def test_speed_workload_fast_forward_is_exact():
    """The benchmark's configuration (open arrivals, runs that go on past finishes) gives the same
    steps and request times as stepping one by one."""
    speed = _load()
    specs = speed.synthetic_specs(n=300, duration=60.0, seed=5)
    setup = speed.bench_setup()
    out = []
    for ff in (False, True):
        env = simpy.Environment()
        rec = Recorder()
        eng = Engine(env, make_policy("vllm", setup.limits), setup.cost_model, OpenSource(specs), rec,
                     fast_forward=ff)
        env.run()
        out.append((eng, rec.steps_frame()))
    (slow, s), (fast, f) = out
    assert len(s) == len(f)
    for col in ("num_running", "num_finished", "num_free_blocks", "num_cached_blocks", "num_decode_tokens"):
        assert (s[col].to_numpy() == f[col].to_numpy()).all(), col
    np.testing.assert_allclose(s["start"], f["start"], rtol=1e-9)
    times = lambda e: np.array([(r.first_token_time, r.finish_time) for r in e.requests])  # noqa: E731
    np.testing.assert_allclose(times(slow), times(fast), rtol=1e-9)


def test_paths_bench_runs_every_path(tmp_path):
    """bench/paths.py (requests/s per common path) keeps running; tiny sizes, no timing asserted."""
    spec = importlib.util.spec_from_file_location("bench_paths", SPEED.parent / "paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfgs = mod.paths(40, tmp_path)
    mod.mooncake_like(40, Path(cfgs["hash_ids"]["workload"]["trace"]))
    for name, cfg in cfgs.items():
        n, wall = mod.run(name, cfg)
        assert n >= 1 and wall > 0, name


def test_vs_vidur_says_what_is_missing_and_exits_0(tmp_path, capsys, monkeypatch):
    """Without Vidur's runner (no ../shared) the side-by-side script says so in one line and exits 0."""
    spec = importlib.util.spec_from_file_location("bench_vs_vidur", SPEED.parent / "vs_vidur.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "PEER", tmp_path / "no-such" / "run.sh")
    assert mod.main(["--pairs", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not found" in out[0] and "nothing to compare" in out[0]


def test_speed_main_without_probes(capsys, monkeypatch):
    """``--no-probe`` (how vs_vidur.py times a process) runs the simulation and prints no probe."""
    mod = _load()
    small = mod.synthetic_specs(n=300, duration=60.0)
    monkeypatch.setattr(mod, "azure_specs", lambda _p: small)  # the trace, or without ../shared its stand-in
    monkeypatch.setattr(mod, "synthetic_specs", lambda: small)
    monkeypatch.setattr("sys.argv", ["speed.py", "--repeat", "1", "--no-probe"])
    mod.main()
    out = capsys.readouterr().out
    assert "runs: " in out and "machine probe" not in out and "wall " in out


def test_soak_runs_and_reports_a_disagreement(capsys, monkeypatch):
    """bench/soak.py (fast-forward on vs off over random configs) keeps running: a few tiny configs agree;
    a check that fails is reported with its index and config, and the exit status says so."""
    spec = importlib.util.spec_from_file_location("bench_soak", SPEED.parent / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--seed", "5", "--configs", "4", "--requests", "5,20"]) == 0
    assert "4 agreed, 0 failed" in capsys.readouterr().out

    def disagree(raw):
        raise AssertionError("steps differ")

    monkeypatch.setattr(mod, "check", disagree)
    assert mod.main(["--seed", "5", "--only", "2", "--requests", "5,20"]) == 1
    out = capsys.readouterr().out
    assert "FAIL config 2 (--seed 5 --only 2)" in out and '"workload"' in out and "0 agreed, 1 failed" in out
