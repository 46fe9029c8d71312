"""Cluster replicas' decode runs going on past finishes (sim/app/gateway.py, ``lazy``): the gateway counts
each finish from the run's view at its time, and the run is cut when a request waits in its queue. Same
timestamps and steps as stepping one by one; only routers that read no engine metrics allow it."""

from __future__ import annotations

import pytest
import simpy

from sim.app.cluster import Cluster, simulate_cluster
from sim.app.cluster_config import cluster_from_dict
from tests.test_cluster import _same_run, raw


def _cluster(cluster: dict, **engine) -> dict:
    return raw(cluster=cluster, engine={"policy": "vllm", "max_model_len": 8192, **engine},
               workload={"rate": 30.0, "num_requests": 200})  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": 3, "router": "least-outstanding"},
        # a tight cap holds requests at the gateway: the runs in flight are cut, later ones end at finishes
        {"replicas": 3, "router": "least-outstanding", "gateway": {"max_outstanding": 5}},
    ],
)
def test_runs_past_finishes_are_exact(cluster: dict, async_scheduling: bool) -> None:
    r = _cluster(cluster, async_scheduling=async_scheduling)
    c = Cluster(cluster_from_dict(r))
    on = c.run()
    assert c.gateway.lazy and not c.gateway.polls
    # the case this is about: finishes inside runs (fewer with the cap: a held request cuts the runs)
    assert c.gateway.num_mid_run_finishes > (0 if "gateway" in cluster else 20)
    if "gateway" in cluster:
        assert c.gateway.max_queue_len > 0
    _same_run(on, simulate_cluster(r, fast_forward=False))


@pytest.mark.parametrize("router", ["least-kv", "tests.test_cluster_lazy_finishes:QuietFirst"])
def test_a_router_that_reads_or_may_read_metrics_keeps_runs_to_finishes(router: str) -> None:
    c = Cluster(cluster_from_dict(_cluster({"replicas": 2, "router": router})))
    c.run()
    assert c.gateway.polls and not c.gateway.lazy and c.gateway.num_mid_run_finishes == 0


class QuietFirst:
    """A plug-in router that does not say what it reads: the lowest polled num_running."""

    name = "quiet-first"

    def __init__(self, options: dict, ctx: object) -> None:
        pass

    def route(self, spec, candidates, now):
        return min(candidates, key=lambda c: (c.num_running, c.index))

    def on_routed(self, spec, replica, now) -> None:
        pass

    def on_done(self, spec, replica, now) -> None:
        pass


def _inbox_in_run(starts: list[float], ends: list[float], push_at: float) -> tuple[float, int, int]:
    """A replica's engine sleeping through a run of these steps (its fast-forward's own
    ``_sleep_through``, its loop closed) and a push at ``push_at``: when it wakes, the steps the run
    keeps, and the SimPy timeouts scheduled."""
    c = Cluster(cluster_from_dict(raw(cluster={"replicas": 1}, engine={"policy": "vllm", "max_model_len": 8192},
                                      workload={"rate": 0.001, "num_requests": 1})))  # fmt: skip
    env, eng, inbox = c.env, c.replicas[0].engine, c.replicas[0].inbox
    got: list = []

    def pusher():  # first: at the run's end instant its push comes before the run's own end
        yield env.timeout(push_at)
        inbox.push(object())

    def sleeper():
        eng.close()  # the engine's own loop waits no more
        k = yield from eng.ff._sleep_through(eng, 0.0, starts, ends, lambda: [0] * len(starts))
        got.extend([env.now, k, eng.run_view])

    timeouts = 0
    schedule = env.schedule

    def counting(event, priority=1, delay=0):
        nonlocal timeouts
        timeouts += type(event) is simpy.Timeout
        return schedule(event, priority, delay)

    env.schedule = counting  # type: ignore[method-assign]
    env.process(pusher())
    done = env.process(sleeper())
    env.run(until=done)
    assert got[2] is None  # the run's view is gone once it ends
    return got[0], got[1], timeouts


@pytest.mark.parametrize(
    ("push_at", "woke", "kept"),
    [
        (0.05, 0.1, 1),  # inside the first step: it still runs
        (0.1, 0.25, 2),  # at a step's start: that step started, it runs too
        (0.3, 0.45, 3),
        (0.45, 0.45, 3),  # at the run's end, before the run's own end event
        (0.6, 0.45, 3),  # after it: the run ended first
    ],
)
def test_a_push_cuts_a_run_at_the_end_of_the_steps_started(push_at: float, woke: float, kept: int) -> None:
    starts, ends = [0.0, 0.1, 0.25], [0.1, 0.25, 0.45]
    t, k, timeouts = _inbox_in_run(starts, ends, push_at)
    assert (t, k) == (woke, kept)
    # the pusher's and the run's end: a push wakes the sleeper by the inbox's own event at the cut, not
    # by a wake-up at the push and then a second timeout to the boundary
    assert timeouts == 2


def test_a_lazy_gateway_schedules_no_tick_for_a_finish_while_nothing_waits() -> None:
    """With nothing queued, a finish's tick would do nothing: the gateway's ticks are its arrivals', and
    a run where every finish still schedules its tick (as before) gives the same tables."""
    from sim.app.timing import LATE_GATEWAY

    def run(finish_ticks: bool):
        c = Cluster(cluster_from_dict(_cluster({"replicas": 3, "router": "least-outstanding"})))
        assert c.gateway.lazy
        c.gateway.lazy = not finish_ticks  # runs still pass finishes (set by start()); only the ticks differ
        ticks: list[float] = []
        schedule = c.env.schedule

        def counting(event, priority=1, delay=0):  # the gateway's events are its ticks (no polls: lazy)
            if priority == LATE_GATEWAY:
                ticks.append(c.env.now + delay)
            return schedule(event, priority, delay)

        c.env.schedule = counting  # type: ignore[method-assign]
        return c.run(), ticks

    res, ticks = run(finish_ticks=False)
    assert (res.requests["status"] == "finished").all()
    assert len(ticks) + 1 == len(res.requests)  # one per arrival (the first, scheduled by start(), not seen)
    old, old_ticks = run(finish_ticks=True)
    assert len(old_ticks) > len(ticks) + 50
    _same_run(res, old)


def test_succeed_after_schedules_as_the_environment_would() -> None:
    """``succeed_after`` puts an event in the schedule as ``Environment.schedule`` does (its own heap push
    on a plain Environment), and through ``schedule`` where a subclass or the instance replaces it."""
    import simpy

    from sim.app.timing import LATE_GATEWAY, Scheduler, succeed_after

    def entries(env: simpy.Environment) -> list[tuple]:
        a, b, c = simpy.Event(env), simpy.Event(env), simpy.Event(env)
        succeed_after(env, a, 0.25, LATE_GATEWAY, "x")
        env.schedule(b, LATE_GATEWAY, 0.25)
        Scheduler(env).succeed_after(c, 0.25, LATE_GATEWAY, "y")
        assert (a.value, c.value) == ("x", "y")
        return [(t, p, type(e).__name__) for t, p, _, e in sorted(env._queue)]

    plain = entries(simpy.Environment(initial_time=1.5))
    assert plain == [(1.75, LATE_GATEWAY, "Event")] * 3
    at_zero = simpy.Environment()  # the int 0 until the first event: the scheduler's time is the same
    assert type(Scheduler(at_zero).now()) is type(at_zero.now) is int
    Scheduler(at_zero).succeed_after(simpy.Event(at_zero), 0)  # an int delay stays an int, as in schedule()
    assert [type(t) for t, *_ in at_zero._queue] == [int]

    env = simpy.Environment(initial_time=1.5)
    sched, seen = Scheduler(env), []
    env.schedule = lambda event, priority=1, delay=0: seen.append((priority, delay))  # replaced after it
    sched.succeed_after(simpy.Event(env), 0.5, LATE_GATEWAY)
    assert seen == [(LATE_GATEWAY, 0.5)] and not env._queue

    class Watched(simpy.Environment):
        def schedule(self, event, priority=1, delay=0):
            self.seen = getattr(self, "seen", 0) + 1
            super().schedule(event, priority, delay)

    env = Watched(initial_time=1.5)
    assert entries(env) == plain and env.seen == 3
