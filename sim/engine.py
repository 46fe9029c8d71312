"""One replica as a SimPy process: schedule -> price -> wait -> apply outcomes.

Arrivals are pulled from a source at each step boundary (as a real engine drains its input queue
between steps). Quiet stretches of identical decode steps are priced and applied in one go: the
policy says how many steps nothing can change in, and the engine cuts the run at the next arrival.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from policies.base import Policy
from sim.metrics import Recorder
from sim.request import Request, RequestSpec, Status
from sim.sources import ClosedSource, OpenSource


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
        self.requests: list[Request] = []
        self.rejected: list[Request] = []
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
                t = source.peek_time()
                if t is None or t >= self.horizon:
                    return
                yield env.timeout(t - now)
                continue
            plan = policy.schedule(now)
            for req, reason in plan.rejected:  # e.g. a queue timeout: reported, never silently dropped
                self._reject(req, reason, now)
            if not plan.scheduled and plan.batch.is_empty:
                # Nothing can run until something arrives (e.g. a blocked queue with nothing running).
                t = source.peek_time()
                if t is None or t >= self.horizon:
                    return
                yield env.timeout(max(t - now, 0.0))
                continue
            num_running, num_waiting = policy.num_running, policy.num_waiting
            usage, free = kv.usage, kv.num_free_blocks
            dt = step_time(plan.batch)
            yield env.timeout(dt)
            end = env.now
            rec.on_tokens(plan.sampled, end)
            finished = policy.update(plan, end)
            rec.on_step(plan, now, dt, num_running, num_waiting, usage, free, finished)
            for req in finished:
                source.on_done(req.spec, end)
            # A finish frees blocks and a slot: whatever blocked the waiting queue may be gone.
            if self.fast_forward and not (finished and policy.num_waiting):
                nxt = source.peek_time()
                # Cheap pre-check: a run needs room for at least two steps before the next arrival.
                if nxt is None or nxt > end + 1.5 * dt:
                    yield from self._decode_run(end)

    def _decode_run(self, start: float):
        run = self.policy.decode_run()
        if run is None:
            return
        n = len(run.requests)
        k = run.max_steps
        ctx_sums = run.ctx_sum + n * np.arange(k, dtype=np.int64)
        durations = self.cost.decode_step_times(n, ctx_sums)
        ends = start + np.cumsum(durations)
        starts = ends - durations
        # A step may start only before the next arrival (it would join at that boundary) and the horizon.
        limit = min(self.source.peek_time() or math.inf, self.horizon)
        k = int(np.searchsorted(starts, limit, side="left"))
        if k < 2:
            return
        starts, durations, ends = starts[:k], durations[:k], ends[:k]
        kv = self.policy.kv
        free0 = kv.num_free_blocks
        bs = kv.block_size
        steps = np.arange(1, k + 1, dtype=np.int64)
        need = np.maximum(-(-(run.computed[None, :] + steps[:, None]) // bs) - run.held[None, :], 0).sum(axis=1)
        free_blocks = free0 - need
        last_tok = np.fromiter((r.last_token_time for r in run.requests), np.float64, n)
        num_waiting = self.policy.num_waiting
        yield self.env.timeout(float(ends[-1]) - start)
        finished = self.policy.apply_decode_run(run, ends)
        self.rec.on_decode_run(
            run, starts, durations, num_waiting, free_blocks, kv.usable_blocks, finished, last_tok
        )
        for req in finished:
            self.source.on_done(req.spec, float(ends[-1]))
