"""What both loops' chains do (sim/engine/chain.py holds the arrays): plan and wait out a leg of decode
steps, and take an arrival's step; the drivers are fastforward_async.py (vLLM's async loop) and
sync_chain.py (the synchronous one)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator
from typing import Any

from sim.core.batch import BatchSummary
from sim.core.plan import StepPlan
from sim.engine.chain import Chain, chain_full
from sim.engine.runcalc import clock, finish_counts

DECLINE = 0  # plan_leg: the chain's first leg is shorter than a run is taken for (nothing has changed)
STOP = 1  # plan_leg: no leg after step a (the chain ends there)


class Leg:
    """A leg ``plan_leg`` planned after step a: the starts and ends of its steps that begin before the
    next event, each step's seconds (``applied``; async: the batch in flight's first), its rows and
    finish counts per step (runcalc.finish_counts), the pool's cumulative pops, the free blocks at its
    start, and its rows with the step (1-based in the leg) whose landing finishes each."""

    def __init__(self, starts: list[float], ends: list[float], applied: list[float], sizes: list[int],
                 count: list[int], cum: list[int], free0: int, live: list[int], fin: list[int]) -> None:
        self.starts = starts
        self.ends = ends
        self.applied = applied
        self.sizes = sizes
        self.count = count
        self.cum = cum
        self.free0 = free0
        self.live = live
        self.fin = fin


def plan_leg(ff: Any, ch: Chain, a: int, s_next: float, d_next: float, nxt: float | None,
             keep_free: int) -> Leg | int:
    """The decode steps after step a up to the next event ``nxt``, planned and priced as a run is
    (fastforward.FastForward._run, fastforward_async's run): the clock is at ``s_next``, step a + 1's
    start (async: ``d_next``, the seconds of the batch in flight). DECLINE or STOP where there is none."""
    kv = ch.kv
    lag = ch.lag
    ch.start_leg(a)
    live, last, comp, hold = ch.leg_rows(a)
    k = max(last) if last else 0
    if ff.max_through is not None and k > ff.max_through:
        k = ff.max_through
    first = s_next + d_next if lag else s_next  # when the leg's first priced step starts
    limit, cap = ff._limit(nxt, first, len(live))
    if cap is not None and k > cap:
        k = cap
    if k < 2 and a == 0:
        return DECLINE
    if k < 1:
        return STOP
    cum = kv.decode_run_blocks(comp, hold, last, k)
    free0 = kv.num_free_blocks
    if cum[k] > free0 - keep_free:  # frees are not counted: a conservative cut
        k = bisect_right(cum, free0 - keep_free) - 1
        if k < 2 and a == 0:
            return DECLINE
        if k < 1:
            return STOP
    count, ctx = finish_counts(last, comp, k)
    sizes, durations = ff._run_prices(last, comp, k, first, limit, (count, ctx))
    applied = [d_next, *durations] if lag else durations
    starts, ends = clock(s_next, applied, limit, len(durations) if lag else k)
    fin = [f + lag for f in last] if lag else last
    if ff.response_delay is not None and len(ends) > min(last):
        starts = starts[:bisect_left(starts, ff._caused(ch.leg_requests(live), fin, ends))]
    kl = len(starts)
    if kl < 2 and a == 0:
        return DECLINE
    if kl < 1:
        return STOP
    ch.add_leg(a, cum, k)
    return Leg(starts, ends[:kl], applied, sizes, count, cum, free0, live, fin)


def arrival_step(eng: Any, ch: Chain, j: int, start: float,
                 keep_free: int) -> tuple[list[int], StepPlan | None, BatchSummary, float] | None:
    """Step j, which begins at ``start`` with an arrival: its decode rows from the chain's arrays and
    their pops, the arrivals queued at the boundary, the policy's waiting pass, and the step priced
    (its rows, the policy's plan or None, the batch, its seconds). None, with nothing changed, where the
    chain ends before it: no row decodes, or the running pass would preempt. (The budget covers every
    decode row: the setup keeps max_num_batched_tokens >= max_num_seqs.)"""
    policy = eng.policy
    kv = ch.kv
    rows, ctx, pops = ch.decode_rows(j)
    if not rows or pops > kv.num_free_blocks - keep_free:
        return None
    ch.schedule_pops(j, pops)
    eng._boundary(start)  # the arrivals, queued
    adm = policy.schedule_waiting(len(rows), start) if policy.num_waiting else None
    dec_sum = sum(ctx)
    if adm is None:
        batch = BatchSummary.of_lists(ctx, [], [], len(rows), dec_sum)
    else:
        b = adm.batch
        batch = BatchSummary.of_lists(ctx, b.prefill_chunks(), b.prefill_ctxs(), len(rows) + b.num_logits, dec_sum)
    return rows, adm, batch, eng.step_seconds(batch)


ARRIVAL = 2  # legs: step a + 1 begins with an arrival, within the horizon and the chain's cap


def legs(ff: Any, eng: Any, ch: Chain, a: int, s_next: float, d_next: float, nxt: float | None,
         keep_free: int) -> Generator[Any, Any, tuple[int, int, float, float]]:
    """Legs from step a (the clock at ``s_next``, step a + 1's start; async: ``d_next`` the batch in
    flight's seconds), each planned (``plan_leg``) and waited out (``wait_leg``), until step a + 1
    begins with an arrival ``nxt``. Returns (ARRIVAL, STOP or DECLINE, a, s_next, d_next): STOP where the
    chain ends there (the horizon, the cap, nothing to run, finishes that may no longer pass, or a leg
    that ended before any arrival but a push could cut it)."""
    pushed = ff.may_pass is not None
    while nxt is None or nxt > s_next:
        if a and not ff._passes_now():
            return STOP, a, s_next, d_next
        leg = plan_leg(ff, ch, a, s_next, d_next, nxt, keep_free)
        if not isinstance(leg, Leg):
            return leg, a, s_next, d_next
        kl = yield from wait_leg(ff, eng, ch, leg, a, s_next)
        a += kl
        s_next = leg.ends[kl - 1]
        if ch.lag:
            d_next = leg.applied[kl]
        nxt = ff._next_event(eng)
        if (nxt is None or nxt > s_next) and not (pushed and not chain_full(a) and s_next < ff.horizon):
            return STOP, a, s_next, d_next  # (a pushed source: no push yet, another leg)
    if s_next >= ff.horizon or chain_full(a):
        return STOP, a, s_next, d_next
    return ARRIVAL, a, s_next, d_next


def wait_leg(ff: Any, eng: Any, ch: Chain, leg: Leg, a: int, start: float) -> Generator[Any, Any, int]:
    """Wait a leg out from ``start`` as a run is (``_sleep_through``: a push cuts it, a router reads it
    through its view, a gateway takes its finishes), record the steps it kept and bring the pool and
    the running list to their end; returns how many it kept."""
    fin = leg.fin
    kl = len(leg.starts)
    finishing = (ch.leg_requests(leg.live), fin) if ff.may_pass is not None and kl > min(fin) - ch.lag else None
    kl = yield from ff._sleep_through(eng, start, leg.starts, leg.ends, _frees(leg.free0, leg.cum, kl), finishing)
    ch.record_leg(leg.starts, leg.applied, leg.ends, leg.sizes, leg.count, kl)
    ch.bring_to(a + kl)
    return kl


def _frees(free0: int, cum: list[int], k: int) -> Callable[[], list[int]]:
    """The free blocks after each of a leg's k steps (its pops only), for its RunView."""
    return lambda: [free0 - x for x in cum[1:k + 1]]
