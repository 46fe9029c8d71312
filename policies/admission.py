"""Admission control in front of any policy: a waiting-queue cap and a queue timeout (the seeds'
"admission control"; issue 3). Rejected and timed-out requests are reported through the engine's
rejection path with a reason, never dropped silently.

- ``max_waiting``: an arrival that finds ``max_waiting`` requests already waiting is rejected with
  reason ``"queue full"`` (a server's 503 / 429 under overload).
- ``queue_timeout_s``: a request still waiting, never scheduled, ``queue_timeout_s`` seconds after it
  was queued is dropped at the next step boundary with reason ``"queue timeout"``. A request that was
  scheduled once and then preempted back into the queue is already being served and does not time out.

The wrapper forwards everything else to the policy, so the engine, the results and tests see the
wrapped policy's attributes (``kv``, ``waiting``, ``running``, ...).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from policies.base import Policy, Quiet, StepPlan
from sim.core.request import Request, RequestSpec

QUEUE_FULL = "queue full"
QUEUE_TIMEOUT = "queue timeout"


class AdmissionControl:
    """Wraps a policy; see the module docstring."""

    def __init__(self, inner: Policy, max_waiting: int | None = None, queue_timeout_s: float | None = None):
        self.inner = inner
        self.max_waiting = max_waiting
        self.queue_timeout_s = queue_timeout_s
        self._queued: deque[Request] = deque()  # arrivals in queue order, for timeouts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # The Policy protocol, explicitly (attribute lookups on the hot path skip __getattr__).
    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def kv(self):
        return self.inner.kv

    @property
    def num_running(self) -> int:
        return self.inner.num_running

    @property
    def num_waiting(self) -> int:
        return self.inner.num_waiting

    def has_unfinished(self) -> bool:
        return self.inner.has_unfinished()

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        return self.inner.rejection_reason(spec)  # a full queue is the moment's load, not a limit

    def add_request(self, req: Request, now: float) -> str | None:
        if self.max_waiting is not None and self.inner.num_waiting >= self.max_waiting:
            return QUEUE_FULL
        reason = self.inner.add_request(req, now)
        if reason is None and self.queue_timeout_s is not None:
            self._queued.append(req)
        return reason

    def schedule(self, now: float) -> StepPlan:
        expired = self._expired(now) if self.queue_timeout_s is not None else []
        plan = self.inner.schedule(now)
        if expired:
            plan.rejected[:0] = [(r, QUEUE_TIMEOUT) for r in expired]
        return plan

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        return self.inner.update(plan, now)

    def abort(self, req: Request, now: float) -> None:
        self.inner.abort(req, now)

    def quiet(self) -> Quiet | None:
        # Skipped steps could jump over a timeout: quiet only when nobody can time out.
        if self.queue_timeout_s is not None and self._pending_timeouts():
            return None
        return self.inner.quiet()

    def on_skipped_steps(self, k: int) -> None:
        self.inner.on_skipped_steps(k)

    # ---- timeouts -------------------------------------------------------------------------------------
    def _waiting_unscheduled(self, req: Request) -> bool:
        return req.scheduled_time is None and not req.is_finished

    def _pending_timeouts(self) -> bool:
        q = self._queued
        while q and not self._waiting_unscheduled(q[0]):
            q.popleft()
        return bool(q)

    def _expired(self, now: float) -> list[Request]:
        """Never-scheduled waiting requests older than the timeout, removed from the policy's queue."""
        limit = self.queue_timeout_s
        assert limit is not None
        q = self._queued
        expired: list[Request] = []
        while q and q[0].queued_time is not None and now - q[0].queued_time > limit:
            r = q.popleft()
            if self._waiting_unscheduled(r):
                expired.append(r)
        if not expired:
            return expired
        gone = set(map(id, expired))
        drop = getattr(self.inner, "drop_waiting", None)
        if drop is not None:
            drop(gone)
        else:
            _drop_from_queue(self.inner.waiting, gone)
        return expired


def _drop_from_queue(waiting: Any, gone: set[int]) -> None:
    """Remove requests (by id()) from a waiting queue that offers popleft/append/len (a deque, or the
    vLLM priority heap); the order of the others is kept (a deque) or restored by the heap key."""
    items = [waiting.popleft() for _ in range(len(waiting))]
    for r in items:
        if id(r) not in gone:
            waiting.append(r)


def with_admission(policy: Policy, max_waiting: int | None, queue_timeout_s: float | None) -> Policy:
    """``policy`` itself when no admission knob is set, else wrapped."""
    if max_waiting is None and queue_timeout_s is None:
        return policy
    return AdmissionControl(policy, max_waiting, queue_timeout_s)  # type: ignore[return-value]
