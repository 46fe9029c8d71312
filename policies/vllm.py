"""vLLM V1 scheduler (vLLM 0.33 semantics), rule by rule from reference/engines.md §1.2.

One token budget per step; running requests first, in list order; preemption by recompute of the
most recently admitted running request; no admissions in a step that preempted; strict head-of-line
blocking of the waiting queue; whole-sequence admission gate (``scheduler_reserve_full_isl``); the
``watermark``: blocks held back when admitting a waiting or preempted request while others run.

Async scheduling (``async_scheduling``, vLLM's AsyncScheduler): the engine schedules step N+1 before
step N's output is applied (a 2-deep batch queue), so ``update`` gets the plan of the step before the
last one scheduled. Each row's sampled-but-unapplied tokens are placeholders: a running row asks for
``num_tokens + placeholders - computed`` tokens and is skipped once its last token is in flight; a
preempted row's in-flight output is stale: still appended when it lands (the row may finish while
waiting), resolving no placeholder. (vLLM also skips a waiting row whose stale output has not landed;
with a 2-deep queue it always lands before the next schedule, as a step that preempts admits nobody.)
Sources: vLLM 0.33 v1/core/sched/scheduler.py, async_scheduler.py, v1/engine/core.py
``step_with_batch_queue``; bench/README.md (the differential test).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from mypy_extensions import mypyc_attr

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.vllm_options import VllmOptions
from sim.core.batch import BatchSummary
from sim.core.request import Request, Status

_ENDED = (Status.FINISHED, Status.TIMED_OUT, Status.REJECTED)  # a landed token of these is dropped
# quiet()'s two answers, made once (a Quiet is immutable; building one was ~0.5 us of every decode run)
_QUIET_BLOCKED = Quiet(waiting_blocked=True, finishes_matter=False)
_QUIET_OPEN = Quiet(waiting_blocked=False, finishes_matter=False)


class _PriorityRequestQueue:
    """Waiting queue for ``scheduling_policy = "priority"``: heap on (priority, arrival, seq)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.seq, req))

    def appendleft(self, req: Request) -> None:
        self.append(req)  # a preempted request re-enters by its key (engines.md V1-3)

    def __getitem__(self, i: int) -> Request:
        assert i == 0
        return self._heap[0][3]

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap))  # in admission order

    def __bool__(self) -> bool:
        return bool(self._heap)


@mypyc_attr(allow_interpreted_subclasses=True)  # tests subclass it
class VllmPolicy(QueuedPolicy):
    name = "vllm"
    def __init__(self, limits: PolicyLimits, options: VllmOptions | None = None) -> None:
        options = options or VllmOptions()
        super().__init__(limits)
        # kv_cache_manager.allocate_slots: blocks held back when admitting a waiting or preempted request.
        self.watermark_blocks = int(options.watermark * limits.num_gpu_blocks)
        self.priority = limits.scheduling_policy == "priority"
        if self.priority:
            self.waiting = _PriorityRequestQueue()
        self._head_blocked_by_kv = False
        # Async only: each request's sampled-but-unapplied tokens and unapplied scheduled tokens are its
        # own fields (Request.num_output_placeholders, num_in_flight_tokens), as in vLLM's Request.
        self.async_scheduling = limits.async_scheduling

    def _victim(self) -> Request:
        if self.priority:
            # engines.md V1-3: lowest priority (largest value), then the latest arrival.
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, victim: Request, now: float) -> None:
        self.running.remove(victim)
        self.kv.free(victim, preempted=True)
        victim.status = Status.PREEMPTED
        victim.num_discarded_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.num_output_placeholders = 0  # async: its in-flight output is stale now
        self.waiting.appendleft(victim)

    def schedule(self, now: float) -> StepPlan:
        lim = self.limits
        kv = self.kv
        budget = lim.max_num_batched_tokens
        thr = lim.long_prefill_token_threshold
        if thr and len(self.running) + len(self.waiting) <= 1:
            thr = 0  # vLLM 0.33 ignores the threshold when one request is alone in the system
        max_len = lim.max_model_len
        plan = StepPlan()
        scheduled = plan.scheduled
        running = self.running
        asyn = self.async_scheduling
        alloc = kv.allocate_slots

        # V1-2 / V1-3: running requests first, in list order.
        i = 0
        while i < len(running) and budget > 0:
            # A stretch of decode rows (one token each) in one tight pass; the row that ends it is
            # handled below. Synchronous: rows below max_model_len (or they would have finished). Async:
            # one token in flight, whose successor is neither the row's last nor past max_model_len.
            j = i
            end = min(len(running), i + budget)  # indexed, not islice: compiled, a typed list read
            if not asyn:
                while j < end:
                    req = running[j]
                    if req.num_tokens - req.num_computed_tokens != 1:
                        break
                    j += 1
            else:
                while j < end:
                    req = running[j]
                    c = req.num_computed_tokens
                    if (req.num_output_placeholders != 1 or c != req.num_tokens or c >= max_len - 1
                            or c + 1 >= req.prompt_len + req.output_len):
                        break
                    j += 1
            if j > i:
                j = i + kv.allocate_decode_slots(running[i:j])
            if j > i:
                # a loop of appends: compiled, extending with zip(..., repeat(1)) went through the
                # iterator protocol for every row (~100 instructions a row, callgrind, 240 rows running)
                for x in range(i, j):
                    scheduled.append((running[x], 1))
                budget -= j - i
                i = j
                if i >= len(running) or budget <= 0:
                    break
            req = running[i]
            c = req.num_computed_tokens
            n = req.num_tokens - c
            if asyn and (ph := req.num_output_placeholders):
                if c + 2 - ph >= req.prompt_len + req.output_len:
                    i += 1  # its last token is in flight: nothing more to schedule
                    continue
                n += ph
            if n != 1:  # a prompt chunk: the threshold, the budget and max_model_len cap it
                if 0 < thr < n:
                    n = thr
                n = min(n, budget, max_len - 1 - c)
            elif c >= max_len - 1:
                n = 0
            if n <= 0:
                i += 1
                continue
            while alloc(req, n) is None:
                victim = self._victim()
                if self.priority:
                    if running.index(victim) < i:
                        i -= 1  # the victim sat before the current request
                    for j, (r, m) in enumerate(scheduled):
                        if r is victim:
                            del scheduled[j]
                            budget += m
                            break
                self._preempt(victim, now)
                plan.preempted.append(victim)
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
                continue
            # The current request itself was preempted. FCFS: it was the last one, stop. Priority (vLLM
            # 0.33): it was the lowest priority; the ones after it rank higher and may still fit, and
            # ``i`` already points at the next one.
            if self.priority:
                continue
            break

        # V1-4 / V1-5: waiting requests, only if nothing was preempted.
        self._head_blocked_by_kv = False
        if not plan.preempted:
            self._admit_waiting(plan, budget, thr, now)
        return self._finalize_async(plan) if asyn else self.finalize_plan(plan)

    def _admit_waiting(self, plan: StepPlan, budget: int, thr: int, now: float) -> None:
        """V1-4 / V1-5: admit waiting requests in queue order while the budget, ``max_num_seqs`` and the
        KV pool allow; a head that does not fit blocks the queue (strict head-of-line blocking)."""
        lim = self.limits
        kv = self.kv
        running = self.running
        scheduled = plan.scheduled
        waiting = self.waiting
        while waiting and budget > 0:
            if len(running) >= lim.max_num_seqs:
                break
            req = waiting[0]
            # vLLM 0.33 counts a lookup in the prefix-cache stats only when the request is admitted.
            hit_blocks, hit = kv.get_computed_blocks(req, record=False)
            n = req.num_tokens - hit
            if 0 < thr < n:
                n = thr
            if not lim.enable_chunked_prefill and n > budget:
                break  # vLLM 0.33 stops admitting here (0.11 skipped the request, engines.md V1-5)
            n = min(n, budget)
            new = kv.allocate_slots(
                req, n, hit, hit_blocks, full_sequence_must_fit=lim.scheduler_reserve_full_isl,
                watermark_blocks=self.watermark_blocks if running else 0,
            )
            if new is None:
                self._head_blocked_by_kv = True
                break  # strict head-of-line blocking (V1-5)
            kv.record_prefix_cache_stats(req, hit)
            waiting.popleft()
            running.append(req)
            if req.status is Status.WAITING:
                req.num_cached_tokens = hit
                req.scheduled_time = now
            req.status = Status.RUNNING
            req.num_computed_tokens = hit
            scheduled.append((req, n))
            plan.admitted.append(req)
            budget -= n

    def schedule_waiting(self, num_scheduled: int, now: float) -> StepPlan:
        """The waiting pass of a schedule whose running pass gave ``num_scheduled`` rows one decode
        token each and preempted nobody (the engine's decode fast-forward takes those rows' part
        itself): the admissions alone, finalized. The running list holds the same requests as it would
        after that running pass (their counters may lag: this pass reads only its length)."""
        thr = self.limits.long_prefill_token_threshold
        if thr and len(self.running) + len(self.waiting) <= 1:
            thr = 0
        plan = StepPlan()
        self._head_blocked_by_kv = False
        self._admit_waiting(plan, self.limits.max_num_batched_tokens - num_scheduled, thr, now)
        return self._finalize_async(plan) if self.async_scheduling else self.finalize_plan(plan)

    def _finalize_async(self, plan: StepPlan) -> StepPlan:
        """finalize_plan with placeholders: a row samples when it reaches num_tokens + placeholders."""
        dec: list[int] = []
        chunks: list[int] = []
        ctxs: list[int] = []
        dec_sum = 0
        sampled: list[Request] = plan.sampled  # appended to directly: compiled, list.append is a C call
        for req, n in plan.scheduled:
            before = req.num_computed_tokens
            after = req.num_computed_tokens = before + n
            req.num_in_flight_tokens += n
            ph = req.num_output_placeholders
            if after >= req.num_tokens + ph:
                req.num_output_placeholders = ph + 1
                sampled.append(req)
                if n == 1 and before >= req.prompt_len:
                    dec.append(after)
                    dec_sum += after
                    continue
            chunks.append(n)
            ctxs.append(before)
        plan.batch = BatchSummary.of_lists(dec, chunks, ctxs, len(sampled), dec_sum)
        return plan

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step. Async: ``plan`` is the older of the two in flight; its tokens land on
        rows that may since have been preempted (stale: appended, but no placeholder to resolve)."""
        if not self.async_scheduling:
            return super().update(plan, now)
        sampled = plan.sampled  # in the order of plan.scheduled
        scheduled = plan.scheduled
        every = len(sampled) == len(scheduled)  # the usual batch: every row samples
        num_sampled = len(sampled)
        si = 0
        max_len = self.limits.max_model_len
        running, ended = Status.RUNNING, _ENDED
        to_cache: list[tuple[Request, int]] = []
        finished: list[Request] = []
        for req, n in scheduled:
            if not every:  # a row that does not sample (a prompt chunk not its last) only ends its in flight
                if si < num_sampled and sampled[si] is req:
                    si += 1
                else:
                    if req.status not in ended:
                        req.num_in_flight_tokens -= n
                    continue
            if req.status is not running and req.status in ended:
                continue  # finished or aborted since: nothing of it is in flight
            left = req.num_in_flight_tokens = req.num_in_flight_tokens - n
            out = req.num_output_tokens = req.num_output_tokens + 1
            t = req.num_tokens = req.num_tokens + 1
            ph = req.num_output_placeholders  # 0 when preempted since: the output is stale
            if ph:
                req.num_output_placeholders = ph - 1
                # The blocks of what the applied batches computed, outputs included. A row scheduled again
                # since (left > 0) had them registered by that allocation already (it caches up to
                # min(computed + new, num_tokens) >= what has landed), unless all its tokens have landed.
                known = req.num_computed_tokens - left
                if not left or known >= t:
                    to_cache.append((req, known))
            if out >= req.output_len or t >= max_len:
                finished.append(req)
        # Registering a row's blocks and freeing another's touch different state (the prefix map, the
        # free queue), so every registration goes first, in row order, then the frees, in row order.
        if to_cache:
            self.kv.cache_blocks_many(to_cache)
        if finished:
            kv = self.kv
            for req in finished:
                if req.status is not Status.RUNNING:
                    self.waiting.remove(req)  # preempted; its stale output was its last token
                req.num_output_placeholders = req.num_in_flight_tokens = 0
                req.status = Status.FINISHED
                req.finish_time = now
                req.finish_reason = "length" if req.num_output_tokens >= req.output_len else "max_model_len"
                kv.free(req)
            self.drop_finished(finished)
        return finished

    def finish(self, finished: list[Request], now: float) -> None:
        super().finish(finished, now)
        for req in finished:  # async: nothing of theirs is in flight any more
            req.num_output_placeholders = req.num_in_flight_tokens = 0

    def abort(self, req: Request, now: float) -> None:
        super().abort(req, now)
        # async: whatever it has in flight is dropped when it lands
        req.num_output_placeholders = req.num_in_flight_tokens = 0

    def on_skipped_steps(self, k: int) -> None:
        """Async: after a run every running row has one thing in flight, its one-token decode in the
        queued batch (a row whose prompt's last chunk was in flight when the run began had more)."""
        if self.async_scheduling:
            for req in self.running:
                req.num_in_flight_tokens = 1

    def quiet(self) -> Quiet | None:
        if self.limits.max_num_batched_tokens < len(self.running):
            return None  # the budget, not the batch, limits a decode step
        # A head blocked by KV stays blocked while decodes only consume blocks; lookups that do not
        # admit are not counted in the prefix-cache stats (vLLM 0.33), so skipping them is exact.
        # With nothing waiting, a finish only shortens the running list.
        blocked = len(self.running) >= self.limits.max_num_seqs or self._head_blocked_by_kv
        return _QUIET_BLOCKED if blocked else _QUIET_OPEN


@register("vllm", options=VllmOptions)
def _make(limits: PolicyLimits, options: VllmOptions) -> VllmPolicy:
    return VllmPolicy(limits, options)
