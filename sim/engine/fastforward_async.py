"""The async loop's decode fast-forward (vLLM's two-deep batch queue, Engine._loop_async).

The synchronous fast-forward's rules (sim/engine/fastforward.py) with one batch always in flight: a run
starts right after a batch landed, covers the schedules of the next batches and the outputs of the one
in flight and of those, and leaves the last one it scheduled in flight. Where it may pass finishes, the
run goes on through arrivals as a chain (sim/engine/chain.py holds its arrays): an arrival costs
its own admission, not a run's end and a new run's start.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from sim.core.request import Request
from sim.engine.chain import Chain
from sim.engine.chain_legs import ARRIVAL, DECLINE, arrival_step, legs
from sim.engine.fastforward import DecodeRun, FastForward
from sim.engine.rowpass import apply_async as _apply_async
from sim.engine.rowpass import decode_plan as _decode_plan
from sim.engine.rowpass import last_token_times, queued_rows, stamp_run
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
        if through and self.chains_now(eng) and _chainable(kv, running, c0):
            res = yield from self._chain(eng, plan, dt, counters, now, nxt, c0, left, prefills, quiet.keep_free)
            if res is not None:
                return res  # (declined, it changed nothing: the run below is planned as before)
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

    def _chain(self, eng: Engine, plan: Any, dt: float, counters: tuple, now: float, nxt: float | None,
               c0: list[int], left: list[int], prefills: bool, keep_free: int) -> Generator[Any, Any, Any]:
        """A run through arrivals (sim/engine/chain.py). Legs of decode schedules, each up to the
        next arrival (or, for a pushed source, until a push cuts it: PUSHED_RUN_STEPS at most) and
        waited out as a run is; then the pool and the running list are brought to the leg's end. At an
        arrival's schedule the decode rows take their tokens from the arrays and the policy takes its
        waiting pass; a request admitted with its whole prompt joins the rows, and the batch in flight
        is waited out (a plain step: its landing's finishes counted at their time). The chain ends at the
        horizon, when no row decodes, when the pool would run short, when finishes may no longer pass,
        or at an arrival's schedule that leaves anything waiting or a prompt in chunks; the loop goes on
        from there as after a run. Its first leg is the run the loop would have taken (None where that
        run would not be taken)."""
        policy = eng.policy
        kv = policy.kv
        running: list[Request] = list(policy.running)
        ch = Chain(policy, eng.source, running, list(c0), list(left), kv.num_blocks_held_rows(running),
                   last_token_times(running), plan, counters, prefills)
        max_len = policy.limits.max_model_len
        a = 0  # schedules taken; the clock is at s_next, schedule a + 1's time (batch a's end)
        s_next = now
        d_next = dt  # batch a + 1's seconds
        while True:
            got_to, a, s_next, d_next = yield from legs(self, eng, ch, a, s_next, d_next, nxt, keep_free)
            if got_to == DECLINE:
                return None
            if got_to != ARRIVAL:
                break
            j = a + 1  # schedule j is an arrival's: taken here, or the chain ends before it
            got = arrival_step(eng, ch, j, s_next, keep_free)
            if got is None:
                break
            rows, adm, batch, d_new = got
            ch.record_batch(s_next, d_next)  # batch j, in flight since schedule j - 1
            ch.admitted(j, rows, adm, batch, policy.num_running)
            self.chained += 1
            end = s_next + d_next  # batch j's end, when schedule j + 1 happens
            if adm is not None:
                # Those admitted with the whole prompt join the rows, and the chain goes on, if nothing
                # waits; otherwise it ends with this schedule's batch queued.
                quiet = policy.quiet()
                goes_on = (not policy.num_waiting and quiet is not None and not quiet.finishes_matter
                           and quiet.keep_free == keep_free)
                if goes_on:
                    for req in adm.admitted:
                        p = req.num_computed_tokens
                        if (p != req.num_tokens or p != req.prompt_len or req.num_output_tokens
                                or (kv.enable_caching and req.hash_end > p)):
                            goes_on = False
                            break
                if not goes_on:
                    return (yield from self._end_chain(eng, ch, plan, j, end, d_new))
                for req in adm.admitted:
                    ch.join(req, j, max_len)
                self.joined += len(adm.admitted)
            # Batch j runs out as a plain step would (its landing's finishes counted at its end).
            yield from self._sleep_to(eng, end)
            a, s_next, d_next = j, end, d_new
            ch.bring_to(a)
            nxt = self._next_event(eng)
        return (yield from self._end_chain(eng, ch, plan, a, s_next, d_next))

    def _end_chain(self, eng: Engine, ch: Chain, plan: Any, k: int, end: float,
                   d_last: float) -> Generator[Any, Any, Any]:
        """The chain's end after k schedules: wait until batch k lands (``end``), apply everything, record
        the k batches as one run, and leave schedule k's batch in flight (``d_last`` seconds)."""
        policy = eng.policy
        kv = policy.kv
        yield from self._sleep_to(eng, end)
        ch.finish_chain(k)
        policy.on_skipped_steps(k)
        queued = None
        if ch.adm_at == k:
            cnt = ch.counters_at
            queued = ch.mixed_plan()
        else:
            free_k, cached_k = ch.free_after[k - 1], ch.cached_after[k - 1]
            cnt = (ch.run_n[k], 0, 1.0 - free_k / kv.usable_blocks, free_k, cached_k)
        if queued is None:
            queued = ch.queued_decode(plan, k)
        starts, durations = ch.starts[:k], ch.durations[:k]
        n0 = ch.n0
        first_gaps = stamp_run(ch.reqs[:n0], ch.fin[:n0], starts, durations, ch.last_before, ch.prefills)
        ch.stamp_joined(k)
        eng.rec.on_run_columns(starts, durations, ch.pre[:k] if ch.any_prefill else 0, ch.dec[:k], ch.run_n[:k],
                               ch.finishes(k), [ch.free_b[0], *ch.free_after[:k - 1]],
                               [ch.cached_b[0], *ch.cached_after[:k - 1]], kv.usable_blocks, first_gaps)
        self.runs += 1
        self.steps += k
        return (queued, end, d_last, cnt), end + d_last


def _chainable(kv: Any, rows: list[Request], c0: list[int]) -> bool:
    """Rows a chain may carry: none with hashed content ahead of it (rowpass.apply_async's ``lazy``),
    nor one whose hashed content ends with its in-flight token past its prompt (that block is
    registered when the token lands, which a chain does not step)."""
    if not kv.enable_caching:
        return True
    for i in range(len(rows)):
        h = rows[i].hash_end
        if h > c0[i] or (h == c0[i] and h > rows[i].prompt_len):
            return False
    return True
