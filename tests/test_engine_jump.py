"""Engine.jump: a wait with no other SimPy event due by its end sets the clock instead of scheduling a
timeout. Checked against the same runs with every wait taken as an event: same rows, same steps, same
clock; never past another process's event; the run loop still gets its turns (progress bar)."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import simpy

from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.progress import bar, run_env
from sim.app.simulate import simulate
from sim.core.request import RequestSpec
from sim.cost.costmodel import ConstantCostModel
from sim.engine import loop
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from tests.helpers import limits


def _no_jumps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "JUMPS", False)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The SimPy events processed (Environment.step calls): a jumped wait is none."""
    events = [0]
    real = simpy.Environment.step

    def step(self: simpy.Environment) -> None:
        events[0] += 1
        real(self)

    monkeypatch.setattr(simpy.Environment, "step", step)
    return events


def _cfg(async_scheduling: bool, rate: float, horizon: float | None) -> dict:
    return {"engine": {"policy": "vllm", "max_model_len": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 1024,
                       "async_scheduling": async_scheduling},
            "hardware": {"gpu": "RTX 4090"}, "model": {"name": "Mistral-7B"},
            "workload": {"rate": rate, "num_requests": 400,
                         "prompt": {"dist": "lognormal", "mean": 600, "std": 300, "min": 16, "max": 3000},
                         "output": {"dist": "lognormal", "mean": 120, "std": 80, "min": 4, "max": 600}},
            "simulation": {"seed": 3, "horizon": horizon}}  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("rate, horizon", [(2.0, None), (8.0, 30.0)])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_jumped_waits_give_the_same_run(monkeypatch, async_scheduling, rate, horizon, fast_forward):
    cfg = config_from_dict(_cfg(async_scheduling, rate, horizon))
    events = _counting(monkeypatch)
    a = simulate(cfg, fast_forward=fast_forward)
    jumped = events[0]
    _no_jumps(monkeypatch)
    b = simulate(cfg, fast_forward=fast_forward)
    assert jumped < (events[0] - jumped) / 4  # idle waits, steps and decode runs were jumped
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert a.meta["end_time"] == b.meta["end_time"]


def _watched(until: float | None) -> tuple[list[tuple], float]:
    """An engine and a monitor process that samples it every 0.37 s: the samples and the clock."""
    env = simpy.Environment()
    pol = make_policy("vllm", limits(num_gpu_blocks=64, max_num_seqs=4))
    specs = [RequestSpec(f"r{i}", 0.9 * i, 40 + 7 * i, 5 + 3 * (i % 7)) for i in range(30)]
    rec = Recorder()
    eng = Engine(env, pol, ConstantCostModel(step_s=0.05), OpenSource(specs), rec)
    samples: list[tuple] = []

    def monitor():
        while True:
            samples.append((env.now, len(pol.running), pol.num_waiting, len(rec.steps), eng.num_schedules))
            yield env.timeout(0.37)

    env.process(monitor())
    env.run(until=until if until is not None else 40.0)
    return samples, env.now


@pytest.mark.parametrize("until", [None, 12.3])
def test_no_jump_past_another_process(monkeypatch, until):
    """A second process's events keep their place: with every wait an event, the monitor sees the same
    states at the same times (a jump past its timeouts would show it later states)."""
    events = _counting(monkeypatch)
    a = _watched(until)
    jumped = events[0]
    _no_jumps(monkeypatch)
    assert _watched(until) == a
    assert jumped < (events[0] - jumped) * 0.9  # waits shorter than the monitor's next sample were jumped


def test_a_lone_engine_still_gives_the_run_loop_turns():
    """One wait in BREATH is an event, so a progress bar driven between events moves during the run."""
    env = simpy.Environment()
    pol = make_policy("vllm", limits(num_gpu_blocks=4096, max_num_seqs=8))
    specs = [RequestSpec(f"r{i}", 0.5 * i, 64, 20) for i in range(400)]
    eng = Engine(env, pol, ConstantCostModel(step_s=0.01), OpenSource(specs), Recorder(), fast_forward=False)
    seen: list[int] = []

    def count() -> int:
        seen.append(eng.num_submitted)
        return eng.num_submitted

    run_env(env, bar(400, "run", enabled=True, stream=io.StringIO()), count, every=4)
    assert eng._jumps > 10 * loop.BREATH
    moving = sorted(set(seen))
    assert len(moving) > 10 and moving[-1] == 400  # read at many points of the run, not only at its end


def test_an_environment_subclass_gets_every_wait_as_an_event():
    """A subclass of SimPy's Environment (a realtime one paces each event) is never jumped."""

    class Watched(simpy.Environment):
        pass

    pol = make_policy("vllm", limits(num_gpu_blocks=256, max_num_seqs=4))
    specs = [RequestSpec(f"r{i}", 0.5 * i, 64, 20) for i in range(20)]
    eng = Engine(Watched(), pol, ConstantCostModel(step_s=0.01), OpenSource(specs), Recorder())
    eng.env.run()
    assert not eng.jumps and eng._jumps == 0 and eng.num_schedules > 0


def test_a_negative_or_numpy_step_time_is_taken_as_before():
    """A cost model's numpy float32 step time runs (the compiled recorder takes floats); a negative one is
    refused at the first step, as SimPy's timeout refuses it, never jumped backwards."""
    import numpy as np

    class Cost(ConstantCostModel):
        def __init__(self, dt):
            super().__init__(step_s=0.01)
            self.dt = dt

        def step_time(self, batch):
            return self.dt

    specs = [RequestSpec(f"r{i}", 0.5 * i, 64, 20) for i in range(5)]
    for dt in (np.float32(0.02), -0.01):
        env = simpy.Environment()
        eng = Engine(env, make_policy("vllm", limits()), Cost(dt), OpenSource(specs), Recorder(), fast_forward=False)
        if dt > 0:
            env.run()
            assert eng.num_schedules > 20 and env.now > 2.0
        else:
            with pytest.raises(ValueError, match="Negative delay"):
                env.run()
            assert eng.num_schedules == 1


def test_the_end_time_is_not_before_the_last_finish_when_a_run_cannot_land_on_its_end():
    """A decode run from 0.684051... to 1.688265...7474: no delay d gives now + d == that end (every sum
    rounds to an even neighbour), so the clock stops an ulp short (delay_to); the run's steps and the
    finish keep the run's times, and the reported end_time is the last step's end, not before the finish.
    Found by a randomised soak of tests/test_invariants.py (orca, two requests)."""
    from sim.engine.fastforward import delay_to

    now, t = 0.6840510095032509, 1.6882659448587474
    assert now + delay_to(now, t) != t  # the limitation itself
    raw = {"engine": {"preset": "orca", "max_model_len": 512, "enable_prefix_caching": False,
                      "cost_model": "roofline", "num_gpu_blocks_override": 32, "max_num_seqs": 1},
           "workload": {"num_requests": 2, "rate": 3.0, "prompt": {"dist": "uniform", "low": 1, "high": 22},
                        "output": {"dist": "uniform", "low": 1, "high": 100},
                        "shared_prefix": {"num_groups": 1, "prefix_len": 32}},
           "simulation": {"seed": 328}}  # fmt: skip
    res = simulate(config_from_dict(raw))
    steps = res.steps
    last_end = float(steps["start"].iloc[-1] + steps["duration"].iloc[-1])
    assert float(res.requests["finish_time"].max()) == last_end == t
    assert res.meta["end_time"] == t


def test_a_run_lands_the_clock_on_its_end():
    """After a decode run whose end no now + d reaches, the clock is set to that end when nothing else is due
    (Engine.land), as stepping leaves it: a session turn never sent is stamped with the last time its source
    saw, the clock, and so is not before the run's end_time (found by the randomised invariant soak: vllm-v0,
    two sessions, horizon 1 s, the run ending at 0.242420912019887...05)."""
    raw = {"engine": {"preset": "vllm-v0", "max_model_len": 512, "enable_prefix_caching": True,
                      "cost_model": "roofline", "num_gpu_blocks_override": 32, "max_num_seqs": 2},
           "workload": {"kind": "sessions", "num_sessions": 2, "turns": {"dist": "uniform", "low": 1, "high": 3},
                        "message": {"dist": "uniform", "low": 1, "high": 147},
                        "output": {"dist": "uniform", "low": 1, "high": 22}, "think_time": 1.0, "num_clients": 2,
                        "system_prompt": {"num_prompts": 1, "len": 12}},
           "simulation": {"seed": 4063, "horizon": 1.0}}  # fmt: skip
    res = simulate(config_from_dict(raw))
    df = res.requests
    end = res.meta["end_time"]
    late = df[df["status"] == "not_arrived"]
    assert len(late) and (late["arrival_time"] >= min(1.0, end)).all(), (late["arrival_time"].tolist(), end)
