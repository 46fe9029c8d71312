"""One replica as a SimPy process: schedule -> price -> wait -> apply outcomes.

Arrivals are pulled from a source at each step boundary (as a real engine drains its input queue
between steps). Quiet stretches of decode-only steps after a step are taken in one go by the
fast-forward (sim/engine/fastforward.py), which the loop only calls.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import simpy
from mypy_extensions import mypyc_attr

from sim.core.batch import BatchSummary
from sim.core.policy import Policy, StepPlan
from sim.core.request import Request, RequestSpec, Status
from sim.cost.step_price import NEED_TABLES, StepPricer
from sim.engine.fastforward import FastForward, RunView
from sim.engine.fastforward_async import AsyncFastForward
from sim.engine.recorder import Recorder
from sim.engine.request_log import RequestLog

SWEEP_MIN = 4096  # held requests before the first sweep (and the least between two)
BREATH = 16  # every BREATH-th wait is a SimPy event even where it could be jumped (Engine.jump)
JUMPS = True  # False: an engine built from now on takes every wait as a SimPy event (tests compare the two)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py); a notebook may extend it
class Engine:
    def __init__(
        self,
        env: simpy.Environment,
        policy: Policy,
        cost_model,
        source: Any,  # OpenSource, ClosedSource, a cluster replica's Inbox: pop_due, peek_time, on_done
        recorder: Recorder,
        horizon: float | None = None,
        fast_forward: bool = True,
        async_scheduling: bool = False,
        client_timeout_s: float | None = None,
        keep_requests: bool = True,
    ) -> None:
        self.env = env
        # Any: compiled (sim/native.py), the engine takes any policy, cost model or source with the methods
        # it calls (plug-ins, a cluster replica's inbox), read as Python attributes
        self.policy: Any = policy
        self.cost: Any = cost_model
        # the cost model's compiled pricer, priced through without an interpreted call per step (None: a
        # cost model without one, a plug-in's: its step_time). Looked up on its class: a proxy that
        # forwards attributes to a roofline model prices its own way.
        pricer = getattr(type(cost_model), "step_pricer", None)
        self.pricer: StepPricer | None = pricer(cost_model) if callable(pricer) else None
        self.source: Any = source
        self.rec = recorder
        self.num_schedules = 0  # policy.schedule calls (each priced step is one, or part of a decode run)
        usable = getattr(getattr(policy, "kv", None), "usable_blocks", None)
        if usable:
            recorder.set_usable_blocks(usable)  # kv_usage is then derived from the free blocks, not stored
        self.horizon = math.inf if horizon is None else horizon
        self.async_scheduling = async_scheduling
        # The decode fast-forward of the loop that runs (None: every step through the policy).
        self.ff = None if not fast_forward else AsyncFastForward(self) if async_scheduling else FastForward(self)
        # The Request objects the engine holds, in arrival order: all of them with ``keep_requests``;
        # otherwise finished and rejected ones move to ``log`` as result rows now and then (``_sweep``)
        # and their objects go, so a long run's memory is what is in flight plus ~190 bytes a request.
        # Timed-out requests stay to the end: a static batch still adds tokens to an aborted row.
        self.keep_requests = keep_requests
        self.requests: list[Request] = []
        self._keys = array("q")  # each held request's arrival index (the log's row order)
        self.log = RequestLog()
        self.num_submitted = 0
        self.num_logged_finished = 0
        self._next_sweep = SWEEP_MIN
        self.last_rejected: RequestSpec | None = None
        # Clients that give up: (send time + timeout, seq, request), aborted at the first step boundary
        # at or after the deadline, wherever the request is (inference-perf / aiohttp's total timeout).
        self.client_timeout_s = client_timeout_s
        self._deadlines: list[tuple[float, int, Request]] = []
        # A decode run in flight, for observers that need the state mid-run (a cluster router reading KV
        # usage, a gateway counting finishes; fastforward.RunView); None otherwise.
        self.run_view: RunView | None = None
        # only on SimPy's own Environment, whose clock this sets (a subclass may pace or watch its events:
        # a RealtimeEnvironment syncs each one with the wall clock)
        self.jumps = JUMPS and type(env) is simpy.Environment
        self._jumps = 0  # waits jumped so far (Engine.jump)
        self._gen = self._loop_async() if async_scheduling else self._loop()
        self.process = env.process(self._gen)

    def jump(self, delay: float) -> bool:
        """Wait ``delay`` seconds without a SimPy event when no other event is due by then: the clock is
        set to what the timeout would have set it to (``now + delay``, the same float), and the loop
        goes on in the same process. True when it jumped; False: the caller yields ``env.timeout``.

        Exact: with nothing in the schedule at or before the wait's end, no other process could run
        in between (only a running one can schedule an event), and an event already due at that very
        instant was scheduled first, so it would run first: no jump then. A single engine's run is one
        process whose every wait is its own, so it pays no event (a Timeout, a heap push and pop, a
        resumed generator chain: ~2 per request) for most of its waits. Every BREATH-th wait is taken
        as an event all the same, so the run loop around ``env.step`` (its progress bar and young
        collections, sim/app/progress.py) still gets a turn now and then."""
        env = self.env
        t = env._now + delay
        queue = env._queue  # env.peek(), read in place: the next event's time
        if not self.jumps or not delay >= 0 or (queue and queue[0][0] <= t):  # a negative delay: SimPy's timeout refuses it
            return False
        self._jumps += 1
        if not self._jumps % BREATH:
            return False
        env._now = t  # SimPy's clock (Environment.now is its read-only view)
        return True

    def land(self, t: float) -> None:
        """After a wait meant to end at ``t`` that SimPy's ``now + delay`` could only bring an ulp short of
        it (fastforward.delay_to): the clock set to ``t`` itself, as stepping would have left it, when no
        event is due before then (none can have run in between: the schedule holds nothing that early)."""
        env = self.env
        now = env._now
        if now < t:
            queue = env._queue
            if not queue or queue[0][0] > t:
                env._now = t

    def step_seconds(self, batch: BatchSummary) -> float:
        """The cost model's seconds for a step (through its compiled pricer when it has one)."""
        p = self.pricer
        if p is not None:
            t = p.step_time(batch)
            if t != NEED_TABLES:
                return t
        return float(self.cost.step_time(batch))  # a plug-in's numpy float32 too (the recorder is compiled)

    def close(self) -> None:
        """End the loop where it waits (a cluster replica's waits for a push that will not come): its
        frame, which holds the policy and the KV pool, goes now rather than with the cycle of events
        around it. The engine does not run again."""
        self._gen.close()

    # ---- arrivals --------------------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        for spec in self.source.pop_due(now):
            self.submit(spec, now)

    def submit(self, spec: RequestSpec, now: float) -> Request:
        req = Request(spec)
        if not self.keep_requests:
            if len(self.requests) >= self._next_sweep:
                self._sweep()
            self._keys.append(self.num_submitted)
        self.requests.append(req)
        self.num_submitted += 1
        reason = self.policy.add_request(req, now)
        if reason is not None:
            req.queued_time = now
            self._reject(req, reason, now)
        elif self.client_timeout_s is not None:
            heapq.heappush(self._deadlines, (spec.arrival_time + self.client_timeout_s, self.num_submitted, req))
        return req

    def _sweep(self) -> None:
        """Move the finished and rejected requests' rows to the log, in place (observers may hold the
        list). The next sweep waits until the list has doubled: O(1) a request, amortised."""
        fin, rej = Status.FINISHED, Status.REJECTED
        keep: list[Request] = []
        keys = array("q")
        log, replica = self.log, self.rec.replica
        for req, key in zip(self.requests, self._keys, strict=True):
            st = req.status
            if st is fin:
                log.add(req, replica, "finished", key)
                self.num_logged_finished += 1
            elif st is rej:
                log.add(req, replica, "rejected", key)
            else:
                keep.append(req)
                keys.append(key)
        self.requests[:] = keep
        self._keys = keys
        self._next_sweep = max(2 * len(keep), SWEEP_MIN)

    def num_finished(self) -> int:
        """Requests that finished here so far (rows in the log and objects still held)."""
        return self.num_logged_finished + sum(r.status is Status.FINISHED for r in self.requests)

    def drain_rows(self, replica: int, status_of: Callable[[Request], str]) -> RequestLog:
        """Every request that reached the engine as a result row, in arrival order, with the held ones'
        status from ``status_of``. Without ``keep_requests`` the engine is emptied (its objects go)."""
        if self.keep_requests:
            return RequestLog.of((req, replica, status_of(req)) for req in self.requests)
        log = self.log
        for req, key in zip(self.requests, self._keys, strict=True):
            log.add(req, replica, status_of(req), key)
        self.requests.clear()
        self._keys = array("q")
        out = log.sorted()
        ints = out.ints["replica"]
        if len(out) and type(ints) is array and self.rec.replica != replica:
            out.ints["replica"] = array("q", [replica]) * len(out)
        return out

    def next_deadline(self) -> float | None:
        """When the next live request's client gives up (None: no timeout pending)."""
        dl = self._deadlines
        while dl and dl[0][2].is_finished:
            heapq.heappop(dl)
        return dl[0][0] if dl else None

    def _expire(self, now: float) -> None:
        """Abort the requests whose clients gave up by ``now`` (vLLM aborts on disconnect: KV freed)."""
        dl = self._deadlines
        while dl and dl[0][0] <= now:
            req = heapq.heappop(dl)[2]
            if req.is_finished:
                continue
            self.policy.abort(req, now)
            req.status = Status.TIMED_OUT
            req.finish_reason = "client timeout"
            req.finish_time = now
            self.source.on_done(req.spec, now)

    def _reject(self, req: Request, reason: str, now: float) -> None:
        req.status = Status.REJECTED
        req.finish_reason = reason
        req.finish_time = now
        self.last_rejected = req.spec
        self.source.on_done(req.spec, now)

    def _wait_for_arrival(self, now: float) -> Generator[Any, Any, bool]:
        """Sleep until the next arrival; returns True when none can come before the horizon.

        A source that is pushed to (a cluster replica's inbox, sim/app/inbox.py) offers ``wake_event()``:
        its pushes come at times nobody knows in advance, so the replica sleeps until one wakes it.
        """
        deadline = self.next_deadline() if self._deadlines else None
        until = self.horizon if deadline is None else min(deadline, self.horizon)
        wake = getattr(self.source, "wake_event", None)
        if wake is not None:
            ev = wake()
            yield ev if until == math.inf else ev | self.env.timeout(max(until - now, 0.0))
            return False
        t = self.source.peek_time()
        if t is None or t >= self.horizon:
            if deadline is None or deadline >= self.horizon:
                return True
            t = deadline  # a waiting request's client gives up before anything arrives
        elif deadline is not None and deadline < t:
            t = deadline
        delay = max(t - now, 0.0)
        if not self.jump(delay):
            yield self.env.timeout(delay)
        return False

    def _boundary(self, now: float) -> bool:
        """What a step boundary takes in before scheduling: arrivals (queued up to the horizon: in
        flight, not lost; one due after the horizon is not arrived, even when the step that crossed it
        ends later) and the clients that gave up. True at the horizon: the loop ends."""
        self._admit(min(now, self.horizon))
        if self._deadlines:
            self._expire(now)
        return now >= self.horizon

    # ---- the loop --------------------------------------------------------------------------------
    def _loop(self) -> Generator[Any, Any, None]:
        env, policy, rec, source = self.env, self.policy, self.rec, self.source
        kv = policy.kv
        ff = self.ff
        while True:
            now = env._now
            if self._boundary(now):
                return
            if not policy.has_unfinished():
                if (yield from self._wait_for_arrival(now)):
                    return
                continue
            plan = policy.schedule(now)
            self.num_schedules += 1
            for req, reason in plan.rejected:  # e.g. a queue timeout: reported, never silently dropped
                self._reject(req, reason, now)
            if not plan.scheduled and plan.batch.is_empty:
                # Nothing can run until something arrives (e.g. a blocked queue with nothing running).
                if (yield from self._wait_for_arrival(now)):
                    return
                continue
            num_running, num_waiting = policy.num_running, policy.num_waiting
            usage, free, cached = kv.usage, kv.num_free_blocks, kv.num_cached_free_blocks
            dt = self.step_seconds(plan.batch)
            if not self.jump(dt):
                yield env.timeout(dt)
            end = env._now
            rec.on_tokens(plan.sampled, end)
            finished = policy.update(plan, end)
            rec.on_step(plan, now, dt, num_running, num_waiting, usage, free, finished, num_cached_free=cached)
            for req in finished:
                source.on_done(req.spec, end)
            if ff is not None and (run := ff.after_step(self, end, dt, finished)) is not None:
                yield from run

    def _loop_async(self) -> Generator[Any, Any, None]:
        """vLLM V1's engine core with ``async_scheduling``: a two-deep batch queue (EngineCore's
        step_with_batch_queue). Batch i+1 is scheduled when batch i starts on the GPU, before i's
        output is applied, so an arrival during batch i first runs in batch i+2, and a finish frees
        its blocks one schedule later than in the synchronous loop. Batches run back to back; the
        scheduler's CPU time is hidden behind the GPU (it is what async scheduling is for). An empty
        batch (every row's last token in flight) costs nothing but keeps its place in the queue."""
        env, policy, rec, source = self.env, self.policy, self.rec, self.source
        kv = policy.kv
        queue: deque[tuple[StepPlan, float, float, tuple]] = deque()  # in flight, oldest first
        gpu_free = env._now  # when the last launched batch ends (SimPy's clock, read in place: its now is a property)
        aff = self.ff if isinstance(self.ff, AsyncFastForward) else None
        while True:
            now = env._now
            if self._boundary(now):
                return  # batches still on the GPU are in flight at the horizon
            if policy.has_unfinished():
                plan = policy.schedule(now)
                self.num_schedules += 1
                for req, reason in plan.rejected:
                    self._reject(req, reason, now)
                work = bool(plan.scheduled) or not plan.batch.is_empty
                if work or queue:
                    start = gpu_free if gpu_free > now else now
                    dt = self.step_seconds(plan.batch) if work else 0.0
                    gpu_free = start + dt
                    counters = (policy.num_running, policy.num_waiting, kv.usage, kv.num_free_blocks,
                                kv.num_cached_free_blocks)
                    queue.append((plan, start, dt, counters))
                    if work and len(queue) < 2 and gpu_free > now:
                        continue  # the queue has room: schedule the next batch before waiting
            if not queue:
                # Nothing runs and nothing can until something arrives.
                if (yield from self._wait_for_arrival(now)):
                    return
                continue
            plan, start, dt, (num_running, num_waiting, usage, free, cached) = queue.popleft()
            if start + dt > now and not self.jump(start + dt - now):
                yield env.timeout(start + dt - now)
            end = env._now
            finished = policy.update(plan, end)
            if plan.scheduled or not plan.batch.is_empty:
                sampled = plan.sampled
                if self.client_timeout_s is not None:  # a row aborted while its batch ran emits nothing
                    sampled = [r for r in sampled if r.status is not Status.TIMED_OUT]
                rec.on_tokens(sampled, end)
                rec.on_step(plan, start, dt, num_running, num_waiting, usage, free, finished,
                            num_cached_free=cached)
            for req in finished:
                source.on_done(req.spec, end)
            if aff is not None and not (finished and policy.num_waiting):
                run = aff.after_batch(self, queue, end)
                if run is not None and (res := (yield from run)) is not None:
                    entry, gpu_free = res
                    queue[0] = entry
