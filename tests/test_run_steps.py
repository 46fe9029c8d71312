"""timing.run_steps, the compiled run loop of SimPy's own Environment (progress.run_env takes it): the
same events in the same order as ``env.step``, the same clock, the same crash on a failed event nobody
defused, StopSimulation as SimPy handles it, EmptySchedule at the end; a replaced step is still called."""

from __future__ import annotations

import pytest
import simpy
from simpy.core import EmptySchedule, StopSimulation

from sim.app import progress
from sim.app.progress import run_env
from sim.app.timing import run_steps


def _model(env: simpy.Environment, log: list) -> None:
    """Processes that wait, wake each other, fail and defuse: what a run's events look like."""

    def worker(name: str, period: float, n: int):
        for i in range(n):
            yield env.timeout(period, value=i)
            log.append((env.now, name, i))

    def waker(ev: simpy.Event):
        yield env.timeout(2.5)
        ev.succeed("woken")

    def sleeper(ev: simpy.Event):
        got = yield ev | env.timeout(10)
        log.append((env.now, "sleeper", sorted(str(v) for v in got.values())))

    def failing():
        yield env.timeout(1.25)
        raise ValueError("handled")

    def catcher():
        try:
            yield env.process(failing())
        except ValueError as e:
            log.append((env.now, "caught", str(e)))

    ev = env.event()
    env.process(worker("a", 1.0, 5))
    env.process(worker("b", 0.75, 6))
    env.process(waker(ev))
    env.process(sleeper(ev))
    env.process(catcher())


def _stepped(env: simpy.Environment) -> None:
    try:
        while True:
            env.step()
    except EmptySchedule:
        pass


def test_same_events_same_order_same_clock():
    with pytest.raises(EmptySchedule):  # first: a loop that never raised it would leave run_env spinning
        run_steps(simpy.Environment(), 1)
    runs = []
    for how in (_stepped, lambda env: run_env(env)):
        env, log = simpy.Environment(), []
        _model(env, log)
        how(env)
        runs.append((log, env.now))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 5 + 6 + 2


def test_run_env_takes_it_on_simpys_environment_only(monkeypatch):
    calls = []
    real = progress.run_steps
    monkeypatch.setattr(progress, "run_steps", lambda env, n: (calls.append(n), real(env, n)))
    env = simpy.Environment()
    _model(env, [])
    run_env(env)
    assert calls

    calls.clear()

    class Watched(simpy.Environment):
        pass

    env = Watched()
    _model(env, [])
    run_env(env)
    assert not calls  # a subclass may watch or pace its steps: they are its own
    env = simpy.Environment()
    seen = []
    real_step = env.step
    env.step = lambda: (seen.append(env.now), real_step())  # type: ignore[method-assign]
    _model(env, [])
    run_env(env)
    assert not calls and seen


def test_a_failure_nobody_defused_crashes_as_simpy_does():
    def boom(env: simpy.Environment):
        yield env.timeout(1)
        raise KeyError("lost")

    errors = []
    for how in (_stepped, lambda env: run_steps(env, 100)):
        env = simpy.Environment()
        env.process(boom(env))
        with pytest.raises(KeyError) as e:
            how(env)
        errors.append((type(e.value.__cause__), e.value.args, env.now))
    assert errors[0] == errors[1] == (KeyError, ("lost",), 1)


def test_empty_schedule_and_stop_simulation():
    env = simpy.Environment()
    with pytest.raises(EmptySchedule):
        run_steps(env, 1)
    env.timeout(1)
    run_steps(env, 1)
    assert env.now == 1 and type(env.now) is int  # the clock as the event's time was scheduled (an int here)
    env.timeout(2)
    with pytest.raises(EmptySchedule):  # more steps asked than events left: stops at the end, as step does
        run_steps(env, 3)
    assert env.now == 3
    with pytest.raises(EmptySchedule) as e:  # raised as step raises it: no "during handling" in its traceback
        try:
            raise KeyError("outer")
        except KeyError:
            run_steps(env, 1)
    assert e.value.__suppress_context__
    # A callback that stops the run: the callbacks after it stay with the event, rescheduled first.
    env = simpy.Environment()
    ev = env.timeout(2)
    order = []

    def stop(_ev):
        order.append("stop")
        raise StopSimulation("halt")

    ev.callbacks += [stop, lambda _ev: order.append("after")]
    with pytest.raises(StopSimulation):
        run_steps(env, 5)
    assert order == ["stop"] and env.now == 2
    run_steps(env, 1)
    assert order == ["stop", "after"] and env.now == 2
    # The stopped event goes back ahead of the events due at the same instant (priority -1, as SimPy).
    stepped = _stopped_order(lambda env, n: [env.step() for _ in range(n)])
    assert stepped == _stopped_order(run_steps) == ["stop", "after", "other"]


def _stopped_order(how) -> list[str]:
    """The order of an event's callbacks around a stop, beside another event due at the same instant."""
    env = simpy.Environment()
    order: list[str] = []

    def stop(_ev):
        order.append("stop")
        raise StopSimulation("halt")

    ev = env.timeout(2)
    ev.callbacks += [stop, lambda _ev: order.append("after")]
    env.timeout(2).callbacks.append(lambda _ev: order.append("other"))
    with pytest.raises(StopSimulation):
        how(env, 5)
    how(env, 2)
    return order


def test_only_simpys_own_step_is_replaced():
    assert progress._simpys_step(simpy.Environment.step)

    real = simpy.Environment.step

    def step(self: simpy.Environment) -> None:  # a replacement, e.g. one set before progress was imported
        real(self)

    assert not progress._simpys_step(step)
    assert not progress._simpys_step(None)
