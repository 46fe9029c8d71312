"""One cluster replica: a full Engine (policy, KV pool, cost model, recorder) fed by an inbox the gateway
pushes to, and the view of it the routers read."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

from policies.base import Policy
from routers.base import ReplicaView
from sim.app.cluster_config import ReplicaSpec
from sim.app.simulate import Setup, resolve
from sim.app.timing import succeed_after
from sim.core.request import RequestSpec
from sim.engine.fastforward import RunView, delay_to
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder


class Inbox:
    """A replica's request source: the gateway pushes specs in, the engine pulls them at its next step
    boundary. It cannot know when the next push comes, so it offers the engine a wake-up event.

    A gateway that can take finishes from a decode run's view (``Gateway.start``) sets ``may_pass`` and
    ``run_hook``: the engine's runs then go on past finishes while ``may_pass()``, the gateway counts
    each finish at its time from the view, and ``on_done`` skips those it took (``taken``)."""

    def __init__(self, env: simpy.Environment, on_done: Callable[[RequestSpec, float], None]) -> None:
        self.env = env
        self.items: deque[tuple[float, RequestSpec]] = deque()
        self._on_done = on_done
        self._wake: simpy.Event | None = None
        self._run: RunView | None = None  # the decode run the engine sleeps through (wake_event)
        self.may_pass: Callable[[], bool] | None = None
        self.run_hook: Callable[[RunView], None] | None = None
        self.taken: set[str] = set()  # request ids whose finish the gateway took from a run's view

    def finishes_may_pass(self) -> bool:
        """May the engine's next decode run go on past finishes (the fast-forward asks at each run)?"""
        return self.may_pass is not None and self.may_pass()

    def on_run(self, view: RunView) -> None:
        """A decode run past finishes is in flight (the engine's ``run_view``)."""
        if self.run_hook is not None:
            self.run_hook(view)

    def push(self, spec: RequestSpec) -> None:
        self.items.append((self.env.now, spec))
        self.nudge()

    def nudge(self) -> None:
        """Wake the engine (a push, or a change of its shared card's load that ends a decode run). In a
        decode run it wakes when the steps started by now end (``RunView.cut``): one event then."""
        ev = self._wake
        if ev is None:
            return
        run, self._wake, self._run = self._run, None, None
        if run is None:
            ev.succeed()
        else:
            now = self.env.now
            succeed_after(self.env, ev, delay_to(now, run.cut(now)))

    def wake_event(self, run: RunView | None = None) -> simpy.Event:
        """The event the engine waits on: for a push, or with ``run`` for the end of that decode run,
        cut short by a push."""
        if self._wake is None:
            self._wake = self.env.event()
        self._run = run
        return self._wake

    def peek_time(self) -> float | None:
        return self.items[0][0] if self.items else None

    def pop_due(self, now: float) -> list[RequestSpec]:
        out = []
        while self.items and self.items[0][0] <= now:
            out.append(self.items.popleft()[1])
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        taken = self.taken
        if taken and spec.request_id in taken:  # the gateway counted it at its time, mid-run
            taken.discard(spec.request_id)
            return
        self._on_done(spec, now)

    def remaining(self) -> list[RequestSpec]:
        return [s for _, s in self.items]


@dataclass
class Replica:
    index: int
    spec: ReplicaSpec
    setup: Setup
    policy: Policy
    recorder: Recorder
    inbox: Inbox
    engine: Engine
    view: ReplicaView

    def kv_usage(self, now: float) -> float:
        """KV usage at ``now`` after the step boundaries up to ``now``, also inside a decode run (the
        one place the cluster reads the engine's ``run_view``)."""
        rv = self.engine.run_view
        if rv is None:
            return self.policy.kv.usage
        starts, free = rv.starts, rv.free_blocks
        if free is None:  # rows finish inside the run: the gateway lets that happen only if it never polls
            raise RuntimeError(f"replica {self.index}: KV usage read inside a decode run past finishes")
        j = bisect_right(starts, now) - 1
        return 1.0 - free[j if j > 0 else 0] / self.policy.kv.usable_blocks

    def poll(self, now: float) -> None:
        v = self.view
        v.num_running = self.policy.num_running
        v.num_waiting = self.policy.num_waiting + len(self.inbox.items)
        v.kv_usage = self.kv_usage(now)
        v.polled_at = now

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        """Why this replica's policy would never run ``spec`` (None: it would queue it)."""
        return self.policy.rejection_reason(spec)


def build_replica(
    env: simpy.Environment,
    index: int,
    rs: ReplicaSpec,
    cost_for: Callable[[str | None, int, Any], Any],
    on_done: Callable[[RequestSpec, float], None],
    *,
    record_step_trace: bool,
    horizon: float | None,
    fast_forward: bool,
    resolve_run: Callable[[Any], Setup] = resolve,
) -> Replica:
    """Resolve ``rs`` and start its engine on ``env``; ``cost_for`` prices it (a shared card or not).
    ``resolve_run``: how its config is resolved (``SetupCache``: once for replicas with equal configs)."""
    setup = resolve_run(rs.run)
    policy = setup.make_policy()  # the preset with its options, behind admission control
    cost = cost_for(rs.device, index, setup.cost_model)
    rec = Recorder(replica=index, trace=record_step_trace)
    inbox = Inbox(env, on_done)
    # P/D replicas keep their Request objects: the coordinator merges each pair's rows at the end
    engine = Engine(env, policy, cost, inbox, rec, horizon, fast_forward,
                    async_scheduling=setup.limits.async_scheduling, keep_requests=rs.role != "mixed")
    lim = setup.limits
    view = ReplicaView(
        index=index,
        name=rs.name,
        pool=rs.pool,
        role=rs.role,
        block_size=lim.block_size,
        max_model_len=lim.max_model_len,
        num_gpu_blocks=lim.num_gpu_blocks,
    )
    return Replica(index, rs, setup, policy, rec, inbox, engine, view)


class SetupCache:
    """``resolve`` once per distinct replica config: replicas built from equal configs share one Setup.
    Its cost model is a pure function of its construction (the tables it grows hold the same value at
    each index whatever grew them), so sharing it changes no step time; each replica still gets its own
    policy (``Setup.make_policy``). Sixteen equal replicas resolved one by one built sixteen memory plans
    and cost tables (~11 % of a 3,000-request run of 16 replicas, in instructions)."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, Setup]] = []  # configs hold dicts (not hashable): compared by equality

    def __call__(self, run: Any) -> Setup:
        for cfg, setup in self._done:
            if cfg == run:
                return setup
        setup = resolve(run)
        self._done.append((run, setup))
        return setup
