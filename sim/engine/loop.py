"""One replica as a SimPy process: schedule -> price -> wait -> apply outcomes.

Arrivals are pulled from a source at each step boundary (as a real engine drains its input queue
between steps). Quiet stretches of decode-only steps are priced and applied in one go: the
policy says how many steps nothing can change in, and the engine cuts the run at the next arrival.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from sim.core.policy import Policy
from sim.core.request import Request, RequestSpec, Status
from sim.engine.recorder import Recorder
from sim.engine.sources import ClosedSource, OpenSource


class Engine:
    def __init__(
        self,
        env: simpy.Environment,
        policy: Policy,
        cost_model,
        source: OpenSource | ClosedSource,
        recorder: Recorder,
        horizon: float | None = None,
        fast_forward: bool = True,
    ) -> None:
        self.env = env
        self.policy = policy
        self.cost = cost_model
        self.source = source
        self.rec = recorder
        self.horizon = math.inf if horizon is None else horizon
        self.fast_forward = fast_forward
        # Rows may finish inside a decode run only when no arrival depends on a finish (an open
        # source: not a closed loop, not a cluster inbox that routes on replica state).
        self._finishes_in_runs = bool(getattr(source, "arrivals_ignore_finishes", False))
        self.requests: list[Request] = []
        self.rejected: list[Request] = []
        # (step starts, free blocks after each step's allocation) while a decode run is in flight, for
        # observers that need the state mid-run (a cluster router reading KV usage); None otherwise.
        self.run_view: tuple[np.ndarray, np.ndarray] | None = None
        self.process = env.process(self._loop())

    # ---- arrivals --------------------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        for spec in self.source.pop_due(now):
            self.submit(spec, now)

    def submit(self, spec: RequestSpec, now: float) -> Request:
        req = Request(spec)
        self.requests.append(req)
        reason = self.policy.add_request(req, now)
        if reason is not None:
            req.queued_time = now
            self._reject(req, reason, now)
        return req

    def _reject(self, req: Request, reason: str, now: float) -> None:
        req.status = Status.REJECTED
        req.finish_reason = reason
        req.finish_time = now
        self.rejected.append(req)
        self.source.on_done(req.spec, now)

    def _wait_for_arrival(self, now: float):
        """Sleep until the next arrival; returns True when none can come before the horizon.

        A source that is pushed to (a cluster replica's inbox, sim/app/cluster.py) offers ``wake_event()``:
        its pushes come at times nobody knows in advance, so the replica sleeps until one wakes it.
        """
        wake = getattr(self.source, "wake_event", None)
        if wake is not None:
            ev = wake()
            yield ev if self.horizon == math.inf else ev | self.env.timeout(self.horizon - now)
            return False
        t = self.source.peek_time()
        if t is None or t >= self.horizon:
            return True
        yield self.env.timeout(max(t - now, 0.0))
        return False

    # ---- the loop --------------------------------------------------------------------------------
    def _loop(self):
        env, policy, rec, source = self.env, self.policy, self.rec, self.source
        kv = policy.kv
        step_time = self.cost.step_time
        while True:
            now = env.now
            self._admit(now)  # arrivals up to the horizon are queued (in flight), not lost
            if now >= self.horizon:
                return
            if not policy.has_unfinished():
                if (yield from self._wait_for_arrival(now)):
                    return
                continue
            plan = policy.schedule(now)
            for req, reason in plan.rejected:  # e.g. a queue timeout: reported, never silently dropped
                self._reject(req, reason, now)
            if not plan.scheduled and plan.batch.is_empty:
                # Nothing can run until something arrives (e.g. a blocked queue with nothing running).
                if (yield from self._wait_for_arrival(now)):
                    return
                continue
            num_running, num_waiting = policy.num_running, policy.num_waiting
            usage, free, cached = kv.usage, kv.num_free_blocks, kv.num_cached_free_blocks
            dt = step_time(plan.batch)
            yield env.timeout(dt)
            end = env.now
            rec.on_tokens(plan.sampled, end)
            finished = policy.update(plan, end)
            rec.on_step(plan, now, dt, num_running, num_waiting, usage, free, finished, num_cached_free=cached)
            for req in finished:
                source.on_done(req.spec, end)
            # A finish frees blocks and a slot: whatever blocked the waiting queue may be gone.
            if self.fast_forward and not (finished and policy.num_waiting):
                nxt = source.peek_time()
                # Cheap pre-check: a run needs room for at least two steps before the next arrival.
                if nxt is None or nxt > end + 1.5 * dt:
                    yield from self._decode_run(end)

    def _price_until(self, rows: np.ndarray, ctx_sums: np.ndarray, start: float, limit: float) -> np.ndarray:
        """Durations of the run's first steps, enough of them to pass ``limit`` (or all): priced in
        growing windows, since a run is usually cut by an arrival long before its last finish."""
        k = len(rows)
        out: list[np.ndarray] = []
        a, t, window = 0, start, 32
        while a < k:
            b = min(k, a + window)
            d = self.cost.decode_step_times(rows[a:b], ctx_sums[a:b])
            out.append(d)
            t += float(d.sum())
            if t >= limit:
                break
            a, window = b, window * 2
        return np.concatenate(out) if len(out) > 1 else out[0]

    def _decode_run(self, start: float):
        run = self.policy.decode_run(finishes_ok=self._finishes_in_runs)
        if run is None:
            return
        fin = run.finish_step
        k = run.max_steps
        wake = getattr(self.source, "wake_event", None)
        if not self._finishes_in_runs and k > int(fin.min()):
            raise RuntimeError(f"policy {self.policy.name}: decode run past a finish that may bring an arrival")
        # Rows running in each step 1..k, and their total context (each row adds a token per step).
        last = np.minimum(fin, k)
        rows = np.bincount(last, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        ctx0 = np.bincount(last, weights=run.computed, minlength=k + 1)[::-1].cumsum()[::-1][1:]
        ctx_sums = ctx0 + rows * np.arange(1, k + 1, dtype=np.int64)
        # A step may start only before the next arrival (it would join at that boundary) and the horizon.
        limit = min(self.source.peek_time() or math.inf, self.horizon)
        durations = self._price_until(rows, ctx_sums, start, limit)
        ends = start + np.cumsum(durations)
        starts = ends - durations
        k = int(np.searchsorted(starts, limit, side="left"))
        if k < 2:
            return
        starts, durations, ends, rows = starts[:k], durations[:k], ends[:k], rows[:k]
        kv = self.policy.kv
        last_tok = np.fromiter((r.last_token_time for r in run.requests), np.float64, len(run.requests))
        num_waiting = self.policy.num_waiting
        if wake is None:
            yield self.env.timeout(float(ends[-1]) - start)
        else:
            # A pushed source (sim/app/cluster.py) cannot say when the next request comes, so a push ends the
            # run early: the steps that started by then still run (the push comes after every step
            # boundary at its instant), and the request joins at the next boundary, as without the jump.
            # No row finishes inside such a run, so the free blocks are known before it is applied.
            self.run_view = (starts, kv.num_free_blocks - run.new_blocks[1:k + 1])
            timeout = self.env.timeout(float(ends[-1]) - start)
            fired = yield wake() | timeout
            if timeout not in fired:
                t = self.env.now
                k = max(int(np.searchsorted(starts, t, side="right")), 1)
                starts, durations, ends, rows = starts[:k], durations[:k], ends[:k], rows[:k]
                yield self.env.timeout(max(float(ends[-1]) - t, 0.0))
            self.run_view = None
        finished = self.policy.apply_decode_run(run, ends)
        self.rec.on_decode_run(run, starts, durations, rows, num_waiting, kv.usable_blocks, finished, last_tok)
        for req in finished:
            self.source.on_done(req.spec, req.finish_time)
