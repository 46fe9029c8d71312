"""The async loop's decode fast-forward (vLLM's two-deep batch queue, Engine._loop_async).

The synchronous fast-forward's rules (sim/engine/fastforward.py) with one batch always in flight: a run
starts right after a batch landed, covers the schedules of the next batches and the outputs of the one
in flight and of those, and leaves the last one it scheduled in flight.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from sim.core.request import Request
from sim.engine.fastforward import DecodeRun, FastForward
from sim.engine.rowpass import apply_async as _apply_async
from sim.engine.rowpass import decode_plan as _decode_plan
from sim.engine.rowpass import last_token_times, queued_rows
from sim.engine.runcalc import at_least, clock

if TYPE_CHECKING:
    from sim.engine.loop import Engine


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py), like FastForward
class AsyncFastForward(FastForward):
    """The fast-forward of the async loop (vLLM's two-deep batch queue, Engine._loop_async).

    Taken right after batch i's output was applied at E_i, while batch i+1 (already scheduled) runs. A
    run of k covers k more loop turns: schedules 1..k (of batches i+2..i+k+1) and the outputs of batches
    i+1..i+k, and leaves batch i+k+1 in flight, so the loop goes on as if it had turned k times. A row
    with R tokens left (its in-flight one included) gets its last token in batch i+R: schedule R skips
    it (its last token is in flight) and it finishes, freeing its blocks, when batch i+R lands; rows
    whose blocks get hashed are stepped one by one. Past a finish only as the synchronous run goes.
    """

    def after_batch(self, eng: Engine, queue: Any, now: float) -> Generator[Any, Any, Any] | None:
        """A process for the run, whose value is (queued batch, gpu_free), or None when there is none."""
        if len(queue) != 1:
            return None
        plan, start, dt, counters = queue[0]
        nxt = self._next_event(eng)
        if start != now or (nxt is not None and nxt <= now + dt):
            return None  # a run needs its second schedule (at the end of the queued batch) in time
        return self._run_async(eng, plan, dt, counters, now, nxt)

    def _run_async(self, eng: Engine, plan: Any, dt: float, counters: tuple, now: float,
                   nxt: float | None) -> Generator[Any, Any, Any]:
        policy = eng.policy
        quiet = policy.quiet()
        running: list[Request] = list(policy.running)
        num_waiting = policy.num_waiting
        n = len(running)
        if (quiet is None or not running or (num_waiting and not quiet.waiting_blocked)
                or len(plan.scheduled) != n or counters[0] != n or counters[1] != num_waiting):
            return None
        kv = policy.kv
        max_len = policy.limits.max_model_len
        rows = queued_rows(plan.scheduled, running, max_len)
        if rows is None:
            return None
        c0, left, prefills = rows
        # Schedule j gives a row its token c0 + j while j < R (the row's tokens left): its last is in
        # flight after schedule R - 1. The run ends at the first finish unless finishes may pass.
        through = self._passes_now() and not quiet.finishes_matter and not num_waiting
        k = max(left) - 1 if through else min(left) - 1
        if through and self.max_through is not None and k > self.max_through:
            k = self.max_through
        limit, cap = self._limit(nxt, now + dt, n)  # schedules 1.. happen after the queued batch
        if cap is not None and k > cap:
            k = cap
        if k < 2:
            return None
        last_sched = [f - 1 for f in left]  # the last schedule that gives each row a token
        cum = kv.decode_run_blocks(c0, kv.num_blocks_held_rows(running), last_sched, k)
        free0 = kv.num_free_blocks
        if cum[k] > free0 - quiet.keep_free:  # frees are not counted: a conservative cut
            k = bisect_right(cum, free0 - quiet.keep_free) - 1
            if k < 2:
                return None
        # Batch i+1+j (schedule j) holds the rows with last_sched >= j, at contexts c0 + j.
        sizes, durations = self._run_prices(last_sched, c0, k, now + dt, limit)
        # Schedule j happens when batch i+j starts: at now, then at the end of each applied batch.
        applied = [dt, *durations]  # batches i+1.. in order
        starts, ends = clock(now, applied, limit, len(durations))
        if self.response_delay is not None and through:
            starts = starts[:bisect_left(starts, self._caused(running, left, ends))]
        k = len(starts)
        if k < 2:
            return None
        applied = applied[:k]
        if len(ends) > k:
            ends = ends[:k]
        last_tok = last_token_times(running)
        cached0 = kv.num_cached_free_blocks
        # Schedules happen at ``starts``: a push ends the run after the schedules made by then, and the
        # loop goes on from there (_sleep_through).
        k = yield from self._sleep_through(eng, now, starts, ends, lambda: [free0 - x for x in cum[1:k + 1]],
                                           (running, left) if through and k >= min(left) else None)
        starts, applied, ends = starts[:k], applied[:k], ends[:k]
        free_after, cached_after, finished = _apply_async(policy, running, c0, left, cum, ends, k, cached0)
        policy.on_skipped_steps(k)
        run = DecodeRun(requests=running, max_steps=k, computed=c0, finish_step=left, new_blocks=cum[:k + 1],
                        cached_free_start=cached0)
        # The applied batch i+1 keeps the counters of its own schedule; batch i+1+j those of schedule j.
        run.free_blocks = [counters[3], *free_after[:k - 1]]
        run.cached_free = [counters[4], *cached_after[:k - 1]]
        batch_rows = [n, *sizes[:k - 1]]
        # rows with fin >= j, j = 0..k (a row runs, scheduled or not, until its last batch lands)
        still = at_least(left, k)
        self.runs += 1
        self.steps += k
        eng.rec.on_decode_run(run, starts, applied, batch_rows, num_waiting, kv.usable_blocks, finished, last_tok,
                              num_running=still[:k], first=plan if prefills else None)
        for req in finished:
            eng.source.on_done(req.spec, req.finish_time)
        # Batch i+k+1: scheduled by the run's last schedule, on the GPU from the last applied end.
        queued = _decode_plan(plan, running, left, c0, k)
        end = ends[-1]
        free_k, cached_k = free_after[k - 1], cached_after[k - 1]
        cnt = (still[k], num_waiting, 1.0 - free_k / kv.usable_blocks, free_k, cached_k)
        d_last = durations[k - 1]
        return (queued, end, d_last, cnt), end + d_last
