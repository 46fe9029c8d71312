"""A cluster replica's request source: the gateway pushes requests in, the engine pulls them at its step
boundaries and sleeps on the inbox's wake-up event (compiled, sim/native.py: it is on every request's
path)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import simpy

from sim.app.timing import Scheduler
from sim.core.request import RequestSpec
from sim.engine.fastforward import RunView, delay_to


class Inbox:
    """A replica's request source: the gateway pushes specs in, the engine pulls them at its next step
    boundary. It cannot know when the next push comes, so it offers the engine a wake-up event.

    A gateway that can take finishes from a decode run's view (``Gateway.start``) sets ``may_pass`` and
    ``run_hook``: the engine's runs then go on past finishes while ``may_pass()``, the gateway counts
    each finish at its time from the view, and ``on_done`` skips those it took (``taken``)."""

    def __init__(self, env: simpy.Environment, on_done: Callable[[RequestSpec, float], None]) -> None:
        self.env = env
        self.clock = Scheduler(env)
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
        self.items.append((self.clock.now(), spec))
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
            now = self.clock.now()
            self.clock.succeed_after(ev, delay_to(now, run.cut(now)))

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
