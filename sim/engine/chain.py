"""A decode run that goes on through arrivals: the running rows' state kept in arrays.

Issue 12 item 1. A decode run (fastforward*.py) used to end at every arrival: every row's counters
and blocks brought up to date, the steps recorded, a full schedule and update through the policy, then
a new run planned from the requests again: about ten passes over the running rows a request. A chain
keeps the rows in arrays across arrivals instead. At an arrival's schedule it brings up to date only
what that schedule reads: the KV pool (the decode rows' pops so far, as counts, and the finished rows'
frees, in stepping's order) and the running list (finished rows dropped as they land); the policy is
asked for its waiting pass alone (``schedule_waiting``); an admitted request whose whole prompt is in
the batch joins the arrays. Requests' counters, blocks and token times are applied once, when the
chain ends, and the steps are recorded as one run.

Rows are in global step numbers. Async (``lag`` 1, vLLM's two-deep batch queue): schedule m (1-based)
makes batch m + 1, batch 1 was in flight when the chain began, and a row decodes at schedules
base+1 .. fin-1 and finishes when batch ``fin`` lands. Synchronous (``lag`` 0): step m is scheduled and
lands at its end, and a row decodes at steps base+1 .. fin and finishes with step ``fin``. Either way
its context is ``c0 + m`` at step m, it came into the chain at ``base`` (0: it was running; j: admitted
at step j), and its counters were last set with the tokens of steps up to ``lb`` landed (``base``, but
j - 1 for a row admitted at synchronous step j, whose prompt's step lands its first token). Only rows
without hashed content ahead of them (the ``lazy`` rows of rowpass.apply_async / fastforward.apply_run)
are taken: their growth registers nothing, so a pop's block is any blank block and only the counts, in
order with the frees and lookups, are observable.
"""

from __future__ import annotations

import heapq
from typing import Any

from sim.core.batch import BatchSummary
from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.engine.rowpass import decode_plan
from sim.engine.runcalc import finishes_per_step, segment_free

# A chain takes no arrival after this many steps: its arrays (a few per step and per row) and the
# requests it holds stay bounded, and the recorder gets its steps now and then.
CHAIN_STEPS = 4096


def chain_full(a: int) -> bool:
    """Has a chain taken so many steps that it takes no more arrivals (CHAIN_STEPS)?"""
    return a >= CHAIN_STEPS


class Chain:
    """The arrays of a decode run that absorbs admissions, and the pool brought up to a step on demand.
    Per batch (async) or step m (list index m - 1): its start and seconds, and the decode rows, prompt
    tokens, running count, free and cached-free blocks of the schedule that made it. ``first`` and
    ``counters``: the async batch in flight when the chain began and its schedule's counts (None:
    synchronous)."""

    def __init__(self, policy: Any, source: Any, reqs: list[Request], c0: list[int], fin: list[int],
                 held: list[int], last_before: list[float], first: StepPlan | None = None,
                 counters: tuple | None = None, prefills: bool = False) -> None:
        self.policy: Any = policy
        self.source: Any = source
        self.kv: Any = policy.kv
        self.bs: int = policy.kv.block_size
        n = len(reqs)
        self.reqs = reqs
        self.c0 = c0
        self.fin = fin
        self.base = [0] * n
        self.lb = [0] * n
        self.lag = 0 if first is None else 1
        self.held = held  # blocks held at the row's origin (its start in the chain)
        self.n0 = n  # the rows the chain began with (stamped as a run's rows)
        self.last_before = last_before
        self.prefills = prefills
        self.live = list(range(n))  # rows not finished, in running order (compacted at each leg)
        heap = [(fin[i], i) for i in range(n)]
        heapq.heapify(heap)
        self.heap = heap  # (landing batch, row) of the rows not finished
        self.gcum = [0]  # gcum[m]: decode pops of schedules 1..m
        self.popped = 0  # schedules whose decode pops the pool has
        self.reserve: list[Any] = []  # popped blocks not yet handed to their rows
        self.cached_start: int = 0  # cached-free blocks when the current leg began (start_leg)
        self.leg_start = 0  # its first schedule - 1
        self.free_after: list[Any] = []  # after schedule m's allocations, m = 1.. (index m - 1)
        self.cached_after: list[Any] = []
        # per batch
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.ends: list[float] = []
        self.dec: list[int] = []
        self.pre: list[int] = []
        self.run_n: list[int] = []
        self.free_b: list[Any] = []
        self.cached_b: list[Any] = []
        if first is not None and counters is not None:  # async: batch 1, in flight
            b = first.batch
            self.dec.append(b.num_decode if prefills else n)
            self.pre.append(b.num_prefill_tokens if prefills else 0)
            self.run_n.append(n)
            self.free_b.append(counters[3])
            self.cached_b.append(counters[4])
        self.any_prefill = prefills
        self.waiting_last = 0  # the requests left waiting by the last arrival's step
        self.adm_at = -1  # the last arrival's schedule: its decode rows, the policy's plan and the batch
        self.adm_rows: list[int] = []
        self.adm: StepPlan | None = None  # (None: it admitted and rejected nobody)
        self.adm_batch: BatchSummary | None = None
        self.counters_at: tuple = () if counters is None else counters

    # ---- legs -------------------------------------------------------------------------------------
    def leg_rows(self, a: int) -> tuple[list[int], list[int], list[int], list[int]]:
        """The rows that run at step a + 1 (not finished before it) in leg coordinates: row indices, last
        step they decode (async, 0: its last token is in flight), computed tokens at step a, blocks held
        then."""
        fin, c0, held, base = self.fin, self.c0, self.held, self.base
        bs = self.bs
        off = self.lag + a
        live: list[int] = []
        last: list[int] = []
        comp: list[int] = []
        hold: list[int] = []
        for i in self.live:
            f = fin[i]
            if f <= a:
                continue  # landed by batch a: finished (the pool may not have it yet)
            live.append(i)
            last.append(f - off)
            c = c0[i] + a
            comp.append(c)
            h = -(-c // bs)
            hold.append(held[i] if held[i] > h else h)
            if base[i] > a:
                raise RuntimeError("chain: a row admitted after the leg's start")
        self.live = live
        return live, last, comp, hold

    def start_leg(self, a: int) -> None:
        """A leg begins after schedule a: the pool's cached-free blocks now are those its first stretch
        starts from (a disaggregated decode replica's pool gains cached blocks when a KV transfer lands
        mid-leg, which must not show in the steps before it), as for a run (rowpass.apply_async)."""
        self.cached_start = self.kv.num_cached_free_blocks
        self.leg_start = a

    def leg_requests(self, live: list[int]) -> list[Request]:
        """The requests of a leg's rows (``leg_rows``' indices), for a caller that reads their specs."""
        reqs = self.reqs
        return [reqs[i] for i in live]

    def add_leg(self, a: int, cum: list[int], k: int) -> None:
        """The leg's decode pops (cumulative from schedule a) as the chain's, through schedule a + k."""
        g = self.gcum
        del g[a + 1:]
        base = g[a]
        for j in range(1, k + 1):
            g.append(base + cum[j])

    def record_leg(self, starts: list[float], applied: list[float], ends: list[float], sizes: list[int],
                   count: list[int], kl: int) -> None:
        """The first ``kl`` schedules of a leg: their batches' starts and seconds, and the batches they
        make (decode rows, running count after the schedule: the decoding rows and, async, those whose
        last token is in flight)."""
        for j in range(kl):
            self.starts.append(starts[j])
            self.durations.append(applied[j])
            self.ends.append(ends[j])
            self.dec.append(sizes[j])
            self.pre.append(0)
            self.run_n.append(sizes[j] + count[j] if self.lag else sizes[j])

    # ---- the pool, brought up to date in stepping's order ------------------------------------------
    def _pop_through(self, m: int) -> None:
        a = self.popped
        if m <= a:
            return
        kv = self.kv
        free0 = kv.num_free_blocks
        cached0 = self.cached_start if a == self.leg_start else kv.num_cached_free_blocks
        fa, ca = self.free_after, self.cached_after
        while len(fa) < m:
            fa.append(0)
            ca.append(0)
        segment_free(free0, self.gcum, a, m, cached0, fa, ca)
        n = self.gcum[m] - self.gcum[a]
        if n:
            self.reserve.extend(kv.pop_run_blocks(n))
        if kv.num_free_blocks != fa[m - 1]:
            raise RuntimeError(f"chain: {free0 - kv.num_free_blocks} blocks taken, {free0 - fa[m - 1]} predicted")
        self.popped = m

    def bring_to(self, m: int) -> None:
        """The pool and the running list as at schedule m + 1's start: the decode pops of schedules
        1..m and the landings of batches 1..m (a row finishing at batch b frees its blocks after
        schedule b's pops and before schedule b + 1's)."""
        heap = self.heap
        reqs, c0, lb = self.reqs, self.c0, self.lb
        lag = self.lag
        kv = self.kv
        while heap and heap[0][0] <= m:
            b = heap[0][0]
            self._pop_through(b)
            done: list[Request] = []
            while heap and heap[0][0] == b:
                i = heapq.heappop(heap)[1]
                req = reqs[i]
                c = c0[i] + b - lag
                landed = b - lb[i]
                req.num_computed_tokens = c
                req.num_output_tokens += landed
                req.num_tokens += landed
                if lag:
                    kv.hand_blocks(req, self.reserve, c, -1)
                    kv.cache_blocks(req, c)  # landing, it caches all it computed (rowpass.apply_async)
                else:
                    kv.hand_blocks(req, self.reserve, c, c)  # all of it known (fastforward.apply_run)
                # its token times now (as the chain's end would stamp them): the engine may move a finished
                # request's row to its log before the chain ends (Engine._sweep)
                if i >= self.n0:
                    req.first_token_time = self.ends[lb[i]]
                elif self.prefills and self.last_before[i] != self.last_before[i]:
                    req.first_token_time = self.ends[0]
                req.last_token_time = self.ends[b - 1]
                if req.num_output_tokens < req.output_len and req.num_tokens < self.policy.limits.max_model_len:
                    raise RuntimeError(f"chain: request {req.request_id} was to finish with batch {b}")
                done.append(req)
            t = self.ends[b - 1]
            self.policy.finish(done, t)
            source = self.source
            for req in done:  # now: a closed loop's next turn, a gateway's count (one it took mid-leg: skipped)
                source.on_done(req.spec, t)
        self._pop_through(m)

    # ---- an admission's schedule --------------------------------------------------------------------
    def decode_rows(self, j: int) -> tuple[list[int], list[int], int]:
        """Schedule j's decode rows (running order), their contexts, and the blocks they pop."""
        fin, c0, held, bs = self.fin, self.c0, self.held, self.bs
        last = j + self.lag
        rows: list[int] = []
        ctx: list[int] = []
        pops = 0
        for i in self.live:
            if fin[i] < last:
                continue  # finished, or (async) its last token in flight
            c = c0[i] + j
            rows.append(i)
            ctx.append(c)
            h = -(-(c - 1) // bs)
            if held[i] > h:
                h = held[i]
            if h * bs < c:
                pops += 1
        return rows, ctx, pops

    def schedule_pops(self, j: int, pops: int) -> None:
        """Schedule j's decode pops, applied (the pool as after its running pass)."""
        g = self.gcum
        del g[j:]
        g.append(g[j - 1] + pops)
        self._pop_through(j)

    def record_batch(self, start: float, seconds: float) -> None:
        """An arrival's step's start and seconds (its end: the clock's sum): async, the batch in flight
        at the arrival's schedule (the schedule before made it); synchronous, the arrival's own step."""
        self.starts.append(start)
        self.durations.append(seconds)
        self.ends.append(start + seconds)

    def admitted(self, j: int, rows: list[int], adm: StepPlan | None, batch: BatchSummary,
                 num_running: int) -> None:
        """Step j (an arrival's) scheduled: what it made recorded (async: batch j + 1; synchronous: step
        j itself), the pool's counts after its admissions, and its plan kept in case the chain ends with
        it in flight (async)."""
        self.adm_at = j
        kv = self.kv
        self.free_after[j - 1] = kv.num_free_blocks
        self.cached_after[j - 1] = kv.num_cached_free_blocks
        self.dec.append(len(rows))
        pre = 0 if adm is None else adm.batch.num_prefill_tokens
        if pre:
            self.any_prefill = True
        self.pre.append(pre)
        self.run_n.append(num_running)
        self.waiting_last = self.policy.num_waiting
        self.adm_rows = rows
        self.adm = adm if adm is not None and (adm.scheduled or adm.rejected) else None
        self.adm_batch = batch
        self.counters_at = (num_running, self.policy.num_waiting, kv.usage, kv.num_free_blocks,
                            kv.num_cached_free_blocks)

    def mixed_plan(self) -> StepPlan | None:
        """The plan of the last arrival's schedule, built when the chain ends with its batch in flight:
        its decode rows' one token each, then what the policy admitted (their prompts in flight: their
        ``num_in_flight_tokens`` set back to the chunk, as the run's end sets every other row's to 1).
        None when it admitted and rejected nobody (a decode plan then)."""
        adm, batch = self.adm, self.adm_batch
        if adm is None or batch is None:
            return None
        reqs = self.reqs
        rows = self.adm_rows
        scheduled: list[tuple[Request, int]] = [(reqs[i], 1) for i in rows]
        sampled: list[Request] = [reqs[i] for i in rows]
        scheduled.extend(adm.scheduled)
        sampled.extend(adm.sampled)
        for req, m in adm.scheduled:
            req.num_in_flight_tokens = m
        return StepPlan(scheduled=scheduled, preempted=[], admitted=adm.admitted, sampled=sampled,
                        rejected=adm.rejected, batch=batch)

    def join(self, req: Request, j: int, max_len: int) -> None:
        """A request admitted at step j with its whole prompt (async: in batch j + 1; synchronous: in
        step j, which lands its first token): a row from there on."""
        i = len(self.reqs)
        p = req.num_computed_tokens
        rest = req.output_len - req.num_output_tokens
        left = rest if rest < max_len - p else max_len - p
        f = j + left - 1 + self.lag
        self.reqs.append(req)
        self.c0.append(p - j)
        self.fin.append(f)
        self.base.append(j)
        self.lb.append(j - 1 + self.lag)
        self.held.append(self.kv.num_blocks_held(req))
        self.live.append(i)
        heapq.heappush(self.heap, (f, i))

    # ---- the end ----------------------------------------------------------------------------------
    def finish_chain(self, k: int) -> None:
        """Everything through step k and the landing of batch k: the pool, the finished rows, then the
        running rows' blocks and counters (rows admitted at async schedule k are in their prompt: as
        the policy left them)."""
        self.bring_to(k)
        reqs, c0, lb, fin = self.reqs, self.c0, self.lb, self.fin
        lag = self.lag
        kv = self.kv
        for i in self.live:
            if fin[i] <= k or lb[i] >= k:
                continue
            req = reqs[i]
            c = c0[i] + k
            kv.hand_blocks(req, self.reserve, c, c - lag)  # async: the newest token in flight, not yet known
            m = k - lb[i]
            req.num_computed_tokens = c
            req.num_output_tokens += m
            req.num_tokens += m
        if self.reserve:
            raise RuntimeError(f"chain: {len(self.reserve)} popped blocks left unhanded")

    def stamp_joined(self, k: int) -> None:
        """Token times of the rows admitted in the chain: the first when their prompt's batch landed,
        the last when their last batch within the chain did (their later gaps are the steps')."""
        ends = self.ends
        reqs, lb, fin = self.reqs, self.lb, self.fin
        for i in range(self.n0, len(reqs)):
            s = lb[i]
            if s >= k:
                continue
            req = reqs[i]
            t: object = ends[s]  # batch / step s + 1: its prompt's
            req.first_token_time = t  # type: ignore[assignment]
            f = fin[i] if fin[i] < k else k
            req.last_token_time = ends[f - 1]

    def finishes(self, k: int) -> list[int]:
        """Rows finishing with each batch 1..k."""
        return finishes_per_step(self.fin, k)

    def queued_decode(self, like: StepPlan, k: int) -> StepPlan:
        """The plan of a decode schedule k left in flight: the rows with a token after k, one each
        (rowpass.decode_plan over the rows not finished)."""
        reqs, c0, fin = self.reqs, self.c0, self.fin
        live = self.live
        return decode_plan(like, [reqs[i] for i in live], [fin[i] for i in live], [c0[i] for i in live], k)
