"""Gateway-side events on the replicas' SimPy clock.

Everything the gateway does at an instant -- route arrivals, release its queue, poll metrics, finish a
KV transfer -- runs *after* every replica's step boundary at that instant: its events carry a priority
value above SimPy's NORMAL (lower values go first). So a request pushed at time t joins a replica at its
first step boundary strictly after t (or at t if the replica is idle and woken), with or without the
engine's fast-forwarded decode runs (the engine cuts a run when its inbox is pushed to).

Compiled (sim/native.py): the gateway schedules a tick for each arrival and each push wakes an engine.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, EventPriority

LATE_POLL = EventPriority(2)  # metrics polls: after replica boundaries, before routing at the same instant
LATE_GATEWAY = EventPriority(3)  # routing, queue release, KV transfer arrivals


def late_event(env: simpy.Environment, when: Any, priority: EventPriority, fn: Callable[[simpy.Event], None],
               value: object = None) -> None:
    """Call ``fn(event)`` at time ``when``, after every event of a lower priority value at that instant,
    ``event.value`` being ``value``: a plain event with ``fn`` as its callback, triggered when made and
    scheduled at ``priority`` (``succeed_after``). The gateway's tick (once per arrival, through its own
    ``Scheduler``) passes its time as the value and a bound method as ``fn``: no closure per call."""
    Scheduler(env).late_event(when, priority, fn, value)


def _call_value(ev: simpy.Event) -> None:
    ev._value()


def at_late(env: simpy.Environment, when: Any, priority: EventPriority, fn: Callable[[], None]) -> None:
    """Call ``fn()`` at time ``when``, after every NORMAL event of that instant (``late_event``)."""
    Scheduler(env).late_event(when, priority, _call_value, fn)


def succeed_after(env: simpy.Environment, ev: simpy.Event, delay: Any, priority: EventPriority = NORMAL,
                  value: object = None) -> None:
    """Trigger ``ev`` (successfully, with ``value``) to be processed ``delay`` seconds from now at ``priority``,
    as SimPy's own Timeout triggers itself (``Event.succeed`` schedules at NORMAL priority, now): a
    gateway call after the replicas' boundaries, a wake-up event found to be due later."""
    Scheduler(env).succeed_after(ev, delay, priority, value)


class Scheduler:
    """One environment's clock and schedule as the gateway and an inbox use them for every request: its
    heap and event counter looked up once (each lookup from compiled code is a generic attribute read,
    ~6 an event in ``succeed_after``), the time read from its field (``now`` is a Python property).
    Events go on the heap as ``Environment.schedule`` puts them, through ``schedule`` wherever a subclass
    or the instance replaces it (checked at each event, as ``succeed_after`` does)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._queue = env._queue
        self._eid = env._eid
        self._plain = type(env) is simpy.Environment
        self._attrs: dict[str, Any] = env.__dict__

    def now(self) -> Any:
        """``env.now``: the environment's time as it holds it (an int until the first event, for an
        environment started at the int 0)."""
        return self.env._now

    def succeed_after(self, ev: simpy.Event, delay: Any, priority: EventPriority = NORMAL,
                      value: object = None) -> None:
        """``succeed_after(env, ev, delay, priority, value)``: on a plain environment whose schedule is its
        own, the heap push its ``schedule`` makes (one interpreted call less an event). ``delay`` and
        ``when`` are taken as given (an int stays an int, as in ``schedule``)."""
        ev._ok = True
        ev._value = value
        if self._plain and "schedule" not in self._attrs:
            heappush(self._queue, (self.env._now + delay, priority, next(self._eid), ev))
        else:
            self.env.schedule(ev, priority, delay)

    def late_event(self, when: Any, priority: EventPriority, fn: Callable[[simpy.Event], None],
                   value: object = None) -> None:
        """``late_event(env, when, priority, fn, value)``."""
        ev = simpy.Event(self.env)
        ev.callbacks.append(fn)
        self.succeed_after(ev, max(when - self.env._now, 0.0), priority, value)

    def at_late(self, when: Any, priority: EventPriority, fn: Callable[[], None]) -> None:
        """``at_late(env, when, priority, fn)``."""
        self.late_event(when, priority, _call_value, fn)


def run_steps(env: Any, n: int) -> None:
    """``env.step()`` ``n`` times, for SimPy's own Environment: its step (pop the next event, set the
    clock, run the event's callbacks, crash on a failed event nobody defused) without an interpreted
    call per event. A cluster processes ~4 events a request (the gateway's tick, the replicas' waits).
    Raises EmptySchedule when the schedule runs out, as ``step`` does. One difference, in a corner: a
    callback that stops the run (StopSimulation) leaves the callbacks after its position with the event,
    where SimPy looks the callback up by value (the same unless one callback is listed twice)."""
    queue: list = env._queue
    for _ in range(n):
        if not queue:
            empty = EmptySchedule()
            empty.__suppress_context__ = True  # step's ``from None`` (which the compiled raise does not set)
            raise empty
        entry: tuple = heappop(queue)
        env._now = entry[0]
        event = entry[3]
        callbacks: Any = event.callbacks  # a list, as SimPy makes it (any iterable, as its step takes)
        event.callbacks = None
        i = 0
        try:
            for cb in callbacks:
                cb(event)
                i += 1
        except StopSimulation:
            # as SimPy: the callbacks not run yet stay with the event, which goes first when the run resumes
            event.callbacks = callbacks[i + 1:]
            env.schedule(event, EventPriority(-1))
            raise
        if not event._ok and not hasattr(event, "_defused"):
            value = event._value
            exc = type(value)(*value.args)
            exc.__cause__ = value
            raise exc
