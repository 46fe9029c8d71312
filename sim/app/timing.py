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
from heapq import heappush

import simpy
from simpy.events import NORMAL, EventPriority

LATE_POLL = EventPriority(2)  # metrics polls: after replica boundaries, before routing at the same instant
LATE_GATEWAY = EventPriority(3)  # routing, queue release, KV transfer arrivals


def late_event(env: simpy.Environment, when: float, priority: EventPriority, fn: Callable[[simpy.Event], None],
               value: object = None) -> None:
    """Call ``fn(event)`` at time ``when``, after every event of a lower priority value at that instant,
    ``event.value`` being ``value``: a plain event with ``fn`` as its callback, triggered when made and
    scheduled at ``priority`` (``succeed_after``). The gateway's tick (once per arrival) passes its time
    as the value and a bound method as ``fn``: no closure per call."""
    ev = simpy.Event(env)
    ev.callbacks.append(fn)
    succeed_after(env, ev, max(when - env._now, 0.0), priority, value)


def _call_value(ev: simpy.Event) -> None:
    ev._value()


def at_late(env: simpy.Environment, when: float, priority: EventPriority, fn: Callable[[], None]) -> None:
    """Call ``fn()`` at time ``when``, after every NORMAL event of that instant (``late_event``)."""
    late_event(env, when, priority, _call_value, fn)


def succeed_after(env: simpy.Environment, ev: simpy.Event, delay: float, priority: EventPriority = NORMAL,
                  value: object = None) -> None:
    """Trigger ``ev`` (successfully, with ``value``) to be processed ``delay`` seconds from now at ``priority``,
    as SimPy's own Timeout triggers itself (``Event.succeed`` schedules at NORMAL priority, now): a
    gateway call after the replicas' boundaries, a wake-up event found to be due later."""
    ev._ok = True
    ev._value = value
    if type(env) is simpy.Environment and "schedule" not in env.__dict__:  # its schedule(), inlined (one
        heappush(env._queue, (env._now + delay, priority, next(env._eid), ev))  # interpreted call less)
    else:  # a subclass, or an observer wrapping the instance's schedule (SimPy's event tracing)
        env.schedule(ev, priority, delay)
