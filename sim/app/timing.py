"""Gateway-side events on the replicas' SimPy clock.

Everything the gateway does at an instant -- route arrivals, release its queue, poll metrics, finish a
KV transfer -- runs *after* every replica's step boundary at that instant: its events carry a priority
value above SimPy's NORMAL (lower values go first). So a request pushed at time t joins a replica at its
first step boundary strictly after t (or at t if the replica is idle and woken), with or without the
engine's fast-forwarded decode runs (the engine cuts a run when its inbox is pushed to).
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

LATE_POLL = 2  # metrics polls: after replica boundaries, before routing at the same instant
LATE_GATEWAY = 3  # routing, queue release, KV transfer arrivals


class LateCall(simpy.Event):
    """A call of ``fn`` at time ``when``, after every event of a lower priority value at that instant.

    Triggered when made, scheduled at ``priority`` (``succeed_after``).
    """

    def __init__(self, env: simpy.Environment, when: float, priority: int, fn: Callable[[], None]) -> None:
        super().__init__(env)
        self.callbacks.append(lambda _ev: fn())
        succeed_after(env, self, max(when - env.now, 0.0), priority)


def at_late(env: simpy.Environment, when: float, priority: int, fn: Callable[[], None]) -> None:
    """Call ``fn`` at time ``when``, after every NORMAL event of that instant."""
    LateCall(env, when, priority, fn)


def late_event(env: simpy.Environment, when: float, priority: int, fn: Callable[[simpy.Event], None],
               value: object) -> None:
    """Call ``fn(event)`` at time ``when`` as ``at_late`` does, ``event.value`` being ``value``: a plain
    event with ``fn`` as its callback (the gateway's tick, once per arrival: no closure, no subclass)."""
    ev = simpy.Event(env)
    ev.callbacks.append(fn)
    ev._ok = True
    ev._value = value
    env.schedule(ev, priority, max(when - env.now, 0.0))


def succeed_after(env: simpy.Environment, ev: simpy.Event, delay: float, priority: int = simpy.events.NORMAL) -> None:
    """Trigger ``ev`` (successfully, value None) to be processed ``delay`` seconds from now at ``priority``,
    as SimPy's own Timeout triggers itself (``Event.succeed`` schedules at NORMAL priority, now): a
    gateway call after the replicas' boundaries, a wake-up event found to be due later."""
    ev._ok = True
    ev._value = None
    env.schedule(ev, priority, delay)
