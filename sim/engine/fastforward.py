"""The decode fast-forward: quiet stretches of decode-only steps built, priced and applied in one go.

With fastforward_async.py and chain.py (the same for the async loop, whose runs go on through
arrivals), the only modules that know about decode runs. A policy answers one question, ``quiet()``: may the
next steps be plain decodes (every running row computes one token, nobody is admitted), and would a
finish change its next decision? It gets one hook, ``on_skipped_steps(k)``, for the bookkeeping its
``schedule`` would have done in the k steps the engine skipped. Everything else (which rows, how many
steps, how many blocks each step takes, step durations, the end state) is derived here from the
running rows and the KV manager, so a run ends in exactly the state k schedule+update calls would
(checked by tests/test_decode_runs.py and the fast-forward invariant, fast-forward on vs off).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import numpy as np
from mypy_extensions import mypyc_attr

from sim.core.request import Request
from sim.cost.decode_price import price_decode_steps
from sim.cost.step_price import StepPricer
from sim.engine.rowpass import advance, last_token_times
from sim.engine.runcalc import advance_clock, clock, finish_counts, finish_order, run_rows, segment_free
from sim.engine.sync_chain import chain_rows, run_chain

if TYPE_CHECKING:
    from sim.engine.loop import Engine


PUSHED_RUN_STEPS = 32  # the most steps a pushed source's run past finishes is planned: one pricing window (FastForward)
CHAINS = True  # False: an engine built from now on ends every run at the next arrival (tests compare the two)


class DecodeRun:
    """Up to ``max_steps`` decode-only steps taken in one go.

    Every row decodes one token per step and row i leaves after step ``finish_step[i]`` (1-based, the
    step of its last token); nothing else changes in between (no admission, no preemption). Rows
    finish inside a run only when the engine's arrivals ignore finishes, the policy says finishes do
    not matter and nothing waits; otherwise ``max_steps <= min(finish_step)``.

    A plain class, not a dataclass: compiled, its constructor is native (a ``slots`` dataclass stays a
    Python class, with the generated, interpreted ``__init__``: ~2 % of a 16-replica run's wall, this and
    RunView together, made once a run). So ``free_blocks`` and ``cached_free`` are set, not passed, and
    two runs compare by identity.
    """

    def __init__(self, requests: list[Request], max_steps: int, computed: list[int], finish_step: list[int],
                 new_blocks: list[int], cached_free_start: int = 0) -> None:
        self.requests = requests
        self.max_steps = max_steps
        self.computed = computed  # each row's computed tokens before the run
        self.finish_step = finish_step  # step whose token finishes each row
        self.new_blocks = new_blocks  # new_blocks[s]: blocks allocated by steps 1..s (new_blocks[0] == 0)
        # Cached-free blocks when the run was planned: a disaggregated decode replica's pool can gain
        # cached blocks mid-run (a KV transfer lands), which must not show in the steps before it.
        self.cached_free_start = cached_free_start
        # Set when the run is applied, for the recorder: free and cached-free blocks after each step's
        # allocation.
        self.free_blocks: list[int] | None = None
        self.cached_free: list[int] | None = None


class RunView:
    """A decode run in flight, for observers of a pushed source's engine (a cluster's gateway): when
    each step starts and ends, the free blocks after each step's allocation (None when rows finish
    inside the run: their frees are not known before it is applied), and the rows that finish inside it
    with when, in the order the engine reports them. A push that cuts the run keeps the steps started by
    then (``cut``), so a finish at or before any later instant of the run is certain."""

    def __init__(self, starts: list[float], ends: list[float], free_blocks: list[int] | None,
                 finish_times: list[float], finish_specs: list[Any]) -> None:
        self.starts = starts
        self.ends = ends
        self.free_blocks = free_blocks
        self.finish_times = finish_times
        self.finish_specs = finish_specs
        self.cut_step = 0  # the steps kept once cut (0: not cut yet)

    def cut(self, t: float) -> float:
        """End the run at ``t`` (a push, or its own end): it keeps the steps started by then, at least
        the first, and the engine goes on when the last of them ends, returned (``t`` when it has)."""
        k = bisect_right(self.starts, t)
        if k < 1:
            k = 1
        self.cut_step = k
        end = self.ends[k - 1]
        return end if end > t else t


def plan_run(policy: Any, finishes_ok: bool, max_through: int | None = None,
             max_steps: int | None = None) -> DecodeRun | None:
    """The decode run the policy's next steps are, if they are a quiet stretch (else None).

    Quiet: the policy says so, every running row is decoding, nothing can be admitted, and the free
    blocks cover every row's growth (finished rows' frees not counted). ``finishes_ok``: the engine's
    arrivals do not depend on finishes, or it cuts the run before the arrivals they cause, so the run
    may go on past them when the policy allows it, for at most ``max_through`` steps (None: to the last).
    ``max_steps``: no more steps than that in any case (those that can start before the next event).
    """
    quiet = policy.quiet()
    if quiet is None:
        return None
    running: list[Request] = policy.running
    waiting = policy.num_waiting
    if not running or (waiting and not quiet.waiting_blocked):
        return None
    max_len = policy.limits.max_model_len
    n = len(running)
    computed = [0] * n
    left = [0] * n
    for i, req in enumerate(running):
        c = req.num_computed_tokens
        t = req.num_tokens
        if t - c != 1 or t == req.prompt_len:
            return None
        computed[i] = c
        rest = req.output_len - req.num_output_tokens
        left[i] = rest if rest < max_len - t else max_len - t
    through = finishes_ok and not quiet.finishes_matter and not waiting
    k = max(left) if through else min(left)
    if through and max_through is not None and k > max_through:
        k = max_through
    if max_steps is not None and k > max_steps:
        k = max_steps
    if k < 2:
        return None
    kv = policy.kv
    cum = kv.decode_run_blocks(computed, kv.num_blocks_held_rows(running), left, k)
    free = kv.num_free_blocks - quiet.keep_free
    if cum[k] > free:
        k = bisect_right(cum, free) - 1  # cum is non-decreasing
        if k < 2:
            return None
    return DecodeRun(requests=list(running), max_steps=k, computed=computed, finish_step=left,
                     new_blocks=cum[:k + 1], cached_free_start=kv.num_cached_free_blocks)


def apply_run(policy: Any, run: DecodeRun, end_times: list[float]) -> list[Request]:
    """Apply k decode steps at once: the same end state as k calls to schedule+update.

    Rows that finish inside the run split it into segments: each segment grows the rows still
    running, then frees the finished ones, so blocks return to the free queue in the same order and
    at the same step as step by step (later growth may pop them, or evict cached blocks instead).
    """
    k = len(end_times)
    kv = policy.kv
    fin_l = run.finish_step
    cum = run.new_blocks
    free_out = [0] * k
    cached_out = [0] * k
    bounds = sorted({f for f in fin_l if f < k})  # steps after which rows finish, then the last
    bounds.append(k)
    # Rows whose blocks get hashed need their token counts current at every allocation; the others
    # are advanced once, when they finish or when the run ends (the manager is given their counts).
    reqs = run.requests
    lazy = not kv.enable_caching or not any(r.num_computed_tokens < r.hash_end for r in reqs)
    base = run.computed
    max_len = policy.limits.max_model_len
    finished: list[Request] = []
    alive = list(range(len(reqs)))
    a = 0
    for b in bounds:
        m = b - a
        rows = [reqs[i] for i in alive]
        free0 = kv.num_free_blocks
        cached0 = run.cached_free_start if a == 0 else kv.num_cached_free_blocks
        segment_free(free0, cum, a, b, cached0, free_out, cached_out)  # uncached free blocks go first
        if lazy:
            kv.grow_decodes(rows, m, computed=[base[i] + a for i in alive])
        elif kv.grow_stepped(rows, [m] * len(rows), 0):
            # Hashed content registers each block when it completes, in step then row order as vLLM
            # does: two rows completing blocks of the same content in one run must register them in
            # that order (the first registered is the one a later lookup returns).
            advance(rows, m)
        else:
            for _ in range(m):
                kv.grow_decodes(rows, 1)
                for req in rows:
                    req.num_computed_tokens += 1
                    req.num_output_tokens += 1  # inlined add_output_tokens
                    req.num_tokens += 1
        if kv.num_free_blocks != free_out[b - 1]:
            raise RuntimeError(f"decode run: {free0 - kv.num_free_blocks} blocks taken, "
                               f"{free0 - free_out[b - 1]} predicted")
        done = [reqs[i] for i in alive if fin_l[i] == b]
        if done:
            for req in done:
                if lazy:
                    req.num_computed_tokens += b
                    req.num_output_tokens += b
                    req.num_tokens += b
                if req.num_output_tokens < req.output_len and req.num_tokens < max_len:
                    raise RuntimeError(f"decode run: request {req.request_id} was to finish at step {b}")
            policy.finish(done, end_times[b - 1])
            finished.extend(done)
            alive = [i for i in alive if fin_l[i] != b]
        a = b
    if lazy:
        advance([reqs[i] for i in alive], k)
    run.free_blocks, run.cached_free = free_out, cached_out
    policy.on_skipped_steps(k)
    return finished


def _own_waiting_pass(policy: Any) -> bool:
    """Does the policy's ``schedule`` come with a ``schedule_waiting`` from the same class, its waiting
    pass alone? A subclass (a plug-in) that overrides ``schedule`` has rules of its own that a chain
    would skip at an arrival's step, and a wrapper (admission control) checks its queue there: neither
    takes chains until it says how its waiting pass goes."""
    for klass in type(policy).__mro__:
        own = vars(klass)
        if "schedule" in own:
            return "schedule_waiting" in own
    return False


def delay_to(now: float, t: float) -> float:
    """A delay ``d`` with ``now + d == t`` where one exists (SimPy schedules a timeout at ``now + delay``;
    ``t - now`` alone can round), so the clock after a run is the last step's end, as after stepping. Not
    every ``t`` is ``now + d`` for some ``d``: when ``now`` has a finer last bit than ``t``'s binade allows,
    every such sum rounds to an even neighbour of ``t``, and the clock comes one ulp short; ``Engine.land``
    then sets it to ``t`` where nothing else is due before (a single engine's runs: always). So where no
    ``d`` lands on ``t``, the largest that stays short is returned: a clock past ``t`` would stay there
    (the next step would start an ulp or two late, and every time after it with it)."""
    d = t - now
    for _ in range(4):
        got = now + d
        if got == t:
            return d
        d = math.nextafter(d, math.inf if got < t else -math.inf)
    while now + d > t:  # the sums step over t: short of it, for Engine.land
        d = math.nextafter(d, -math.inf)
    return d


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py); tests observe it from a subclass
class FastForward:
    """One engine's decode fast-forward: after each step, take the quiet stretch that follows, if any.

    ``runs`` counts the runs taken and ``steps`` the steps they covered (tests and benchmarks read them).
    """

    def __init__(self, engine: Engine) -> None:
        # No reference back to the engine (it is passed to each call): the engine holds its fast-forward,
        # and the pair would be a cycle that keeps the engine's policy and KV pool (~29k block objects on
        # an 80 GB card) alive after a run until a full collection, which runs of one process (a notebook,
        # a sizing search) rarely reach. The cost model and the horizon are the engine's for its life.
        self.cost: Any = engine.cost
        self.pricer: StepPricer | None = engine.pricer  # the cost model's compiled pricer (Engine.step_seconds), or None
        self.horizon: float = engine.horizon
        # Rows may finish inside a decode run when no arrival depends on a finish (an open source: not a
        # closed loop, not a cluster inbox that routes on replica state), or when the source can say how
        # soon a finish brings its arrival (``response_delay``: closed loops, sessions): the run then ends
        # before the earliest arrival its finishes cause.
        self.finishes_ok = bool(getattr(engine.source, "arrivals_ignore_finishes", False))
        delay = getattr(engine.source, "response_delay", None)
        self.response_delay = delay if callable(delay) and not self.finishes_ok else None
        self.passes = self.finishes_ok or self.response_delay is not None
        # A pushed source may let a run go on past finishes while it can take them from the run's view
        # (``finishes_may_pass()``, asked at each run; ``on_run(view)`` is told of such a run).
        self.may_pass: Callable[[], bool] | None = getattr(engine.source, "finishes_may_pass", None)
        # Such a run is planned PUSHED_RUN_STEPS at most: a push soon cuts it, and pricing the stretch to
        # the last row's finish costs more than starting another run now and then.
        self.max_through = PUSHED_RUN_STEPS if self.may_pass is not None else None
        self._fastest: list[float] = []  # _steps_before: the quickest decode step of 1..n rows, by n
        self.runs = 0
        self.steps = 0
        # Runs go on through arrivals (sim/engine/chain.py) with a policy that has a waiting pass of
        # its own (``schedule_waiting``) and schedules for the engine's loop (an async policy under the
        # synchronous loop, which a test may build, keeps its runs), where the run may pass finishes;
        # not with client timeouts nor a step trace (it lists each step's rows): chains_now, asked at
        # each run (the engine sets those after building its fast-forward).
        pol = engine.policy
        self.chains = (CHAINS and _own_waiting_pass(pol)
                       and bool(getattr(pol, "async_scheduling", False)) == engine.async_scheduling)
        self.chained = 0  # arrivals' steps taken inside chains (tests and benchmarks read them)
        self.joined = 0  # requests admitted there that joined a chain's rows

    def chains_now(self, eng: Engine) -> bool:
        """May this run go on through arrivals (given that it may pass finishes)?"""
        return self.chains and eng.client_timeout_s is None and eng.rec.trace is None

    def _sleep_to(self, eng: Engine, t: float) -> Generator[Any, Any, None]:
        """Wait until ``t`` (the clock set to ``t`` itself, as stepping leaves it: delay_to, Engine.land)."""
        now = eng.env._now
        if t > now:
            d = delay_to(now, t)
            if not eng.jump(d):
                yield eng.env.timeout(d)
            eng.land(t)

    def after_step(self, eng: Engine, end: float, dt: float,
                   finished: list[Request]) -> Generator[Any, Any, None] | None:
        """Called by the engine after each scheduled step that ended at ``end`` and took ``dt``: the
        process to run for a possible decode run, or None (checked without building a generator)."""
        # A finish frees blocks and a slot: whatever blocked the waiting queue may be gone.
        if finished and eng.policy.num_waiting:
            return None
        nxt = self._next_event(eng)
        # Cheap pre-check: a run needs room for at least two steps before the next arrival.
        if nxt is None or nxt > end + 1.5 * dt:
            return self._run(eng, end, nxt)
        return None

    def _caused(self, reqs: list[Request], fin: list[int], ends: list[float]) -> float:
        """The earliest arrival the finishes within ``ends`` cause (inf: none). Row i ends with step
        ``fin[i]`` (1-based), at ``ends[fin[i] - 1]``."""
        delay = self.response_delay
        if delay is None:
            return math.inf
        first = math.inf
        m = len(ends)
        for i, f in enumerate(fin):
            if f > m:
                continue
            d = delay(reqs[i].spec)
            if d is not None:
                t = ends[f - 1] + d
                if t < first:
                    first = t
        return first

    @staticmethod
    def _next_event(eng: Engine) -> float | None:
        """The next arrival or client timeout, whichever comes first (None: neither)."""
        nxt = eng.source.peek_time()
        if eng._deadlines:
            dl = eng.next_deadline()
            if dl is not None and (nxt is None or dl < nxt):
                return dl
        return nxt

    def _passes_now(self) -> bool:
        """May this run go on past finishes (the source's standing answer, or a pushed source's now)?"""
        return self.passes or (self.may_pass is not None and self.may_pass())

    def _sleep_through(self, eng: Engine, start: float, starts: list[float], ends: list[float],
                       free_after: Callable[[], list[int]],
                       finishing: tuple[list[Request], list[int]] | None = None) -> Generator[Any, Any, int]:
        """Wait out a run of ``len(starts)`` steps begun at ``start``; returns how many of them happened.

        A pushed source (a cluster replica's inbox, sim/app/inbox.py) cannot say when the next request
        comes, so a push ends the run early: the steps that started by then still run (the push comes after
        every step boundary at its instant) and the request joins at the next boundary, as without the
        jump. While it runs, ``engine.run_view`` shows it: without finishes inside (``finishing`` None) the
        free blocks after each step (``free_after()``), for a router reading the replica mid-run; with
        them (rows and the step, 1-based, of each one's finish) the finishes and their times instead,
        announced to the source's ``on_run``."""
        env = eng.env
        k = len(starts)
        wake = getattr(eng.source, "wake_event", None)
        if wake is None:
            d = delay_to(start, ends[-1])
            if not eng.jump(d):
                yield env.timeout(d)
            eng.land(ends[-1])  # where start + d cannot be the run's end (delay_to)
            return k
        if finishing is None:
            view = RunView(starts, ends, free_after(), [], [])
        else:
            reqs, fin = finishing
            rows = finish_order(fin, k)  # by step, then row: the order they are applied
            view = RunView(starts, ends, None, [ends[fin[i] - 1] for i in rows], [reqs[i].spec for i in rows])
        eng.run_view = view
        if finishing is not None:
            eng.source.on_run(view)
        # One wake-up event: a push cuts the run (``RunView.cut``) and the source schedules the event at
        # the end of the steps kept; the run's own end cuts it there. The engine resumes once, when the
        # run ends either way (a push mid-run costs one event, not a wake-up and then a timeout).
        ev, nudge = wake(view), eng.source.nudge
        timeout = env.timeout(delay_to(start, ends[-1]))
        timeout.callbacks.append(lambda _t: ev.triggered or nudge())
        yield ev
        eng.run_view = None
        return view.cut_step

    def _run_prices(self, last: list[int], computed: list[int], k: int, start: float, limit: float,
                    counts: tuple[list[int], list[int]] | None = None) -> tuple[list[int], list[float]]:
        """Rows of each of a run's k steps (``run_rows``) and the durations of its first steps (``_price_until``):
        in one pass by the compiled pricer, without a list of context sums; the lists otherwise (a plug-in
        cost model, or a row count past the pricer's tables, which the cost model then grows). ``counts``:
        ``finish_counts(last, computed, k)`` where the caller has them already."""
        p = self.pricer
        if p is not None:
            count, ctx = finish_counts(last, computed, k) if counts is None else counts
            try:
                return p.decode_run(count, ctx, start, limit)
            except IndexError:
                pass
        rows, ctx_sums = run_rows(last, computed, k)
        return rows, self._price_until(rows, ctx_sums, start, limit)

    def _price_until(self, rows: list[int], ctx_sums: list[int], start: float, limit: float) -> list[float]:
        """Durations of the run's first steps, enough of them to pass ``limit`` (or all): priced in
        growing windows, since a run is usually cut by an arrival long before its last finish."""
        k = len(rows)
        cost = self.cost
        out: list[float] = []
        a, t, window = 0, start, 32
        while a < k:
            b = min(k, a + window)
            # one window covering the run (a pushed replica's, planned PUSHED_RUN_STEPS at most): no copies
            d = (self._decode_prices(cost, rows, ctx_sums) if a == 0 and b == k
                 else self._decode_prices(cost, rows[a:b], ctx_sums[a:b]))
            out += d
            t = advance_clock(t, d)
            if t >= limit:
                break
            a, window = b, window * 2
        return out

    def _decode_prices(self, cost: Any, rows: list[int], ctx_sums: list[int]) -> list[float]:
        """Decode-only steps' seconds: the compiled pricer's, or the cost model's (which grows its tables
        when the pricer reads past them)."""
        p = self.pricer
        if p is not None:
            try:
                return p.decode_list(rows, ctx_sums)
            except IndexError:
                pass
        return price_decode_steps(cost, rows, ctx_sums)

    def _limit(self, nxt: float | None, first: float, rows: int) -> tuple[float, int | None]:
        """When the run's steps must have started by (the next arrival or client timeout ``nxt``, which
        it would join or abort at that boundary, or the horizon), and a bound on how many can start by
        then counting from ``first`` (None: no bound)."""
        limit = min(math.inf if nxt is None else nxt, self.horizon)
        return limit, (self._steps_before(limit - first, rows) if limit < math.inf and rows else None)

    def _steps_before(self, span: float, rows: int) -> int:
        """At least as many steps as can start within ``span`` seconds: a run is planned to its last
        row's finish (often hundreds of steps) but cut by the next arrival (often after tens), so its
        arrays are sized by this bound. Every step of up to ``rows`` rows takes at least the quickest
        decode step of 1..rows rows at no context; a bound that came out short (a cost model faster with
        more context) would only end the run early, which is exact too."""
        fastest = self._fastest
        if len(fastest) < rows:
            n = max(rows, 2 * len(fastest), 64)
            times = self.cost.decode_step_times(np.arange(1, n + 1), np.zeros(n))
            fastest = self._fastest = np.minimum.accumulate(times).tolist()
        m = fastest[rows - 1]
        if not m > 0:
            return 1 << 62
        return int(span / m) + 3 if span > 0 else 2

    def _run(self, eng: Engine, start: float, nxt: float | None) -> Generator[Any, Any, None]:
        policy, source = eng.policy, eng.source
        passes = self._passes_now()
        if passes and not policy.num_waiting and self.chains_now(eng):
            quiet = policy.quiet()
            if quiet is not None and not quiet.finishes_matter and policy.running:
                taken = chain_rows(policy, policy.limits.max_model_len)
                if taken is not None and (yield from run_chain(self, eng, start, nxt, taken[0], taken[1],
                                                               quiet.keep_free)):
                    return  # (declined, it changed nothing: the run below is planned as before)
        limit, cap = self._limit(nxt, start, len(policy.running))
        run = plan_run(policy, passes, self.max_through, cap)
        if run is None:
            return
        fin = run.finish_step
        k = run.max_steps
        first_fin = min(fin)
        if not passes and k > first_fin:
            raise RuntimeError(f"policy {policy.name}: decode run past a finish that may bring an arrival")
        # Rows running in each step 1..k, and the seconds of the steps up to the limit (priced from their context).
        rows, durations = self._run_prices(fin, run.computed, k, start, limit)
        starts, ends = clock(start, durations, limit, k)
        if self.response_delay is not None and len(ends) > first_fin:
            starts = starts[:bisect_left(starts, self._caused(run.requests, fin, ends))]
        k = len(starts)
        if k < 2:
            return
        ends, durations, rows = ends[:k], durations[:k], rows[:k]
        kv = policy.kv
        last_tok = last_token_times(run.requests)
        num_waiting = policy.num_waiting
        free = kv.num_free_blocks
        k = yield from self._sleep_through(eng, start, starts, ends, lambda: [free - x for x in run.new_blocks[1:k + 1]],
                                           (run.requests, fin) if k > first_fin else None)
        starts, durations, ends, rows = starts[:k], durations[:k], ends[:k], rows[:k]
        finished = apply_run(policy, run, ends)
        self.runs += 1
        self.steps += k
        eng.rec.on_decode_run(run, starts, durations, rows, num_waiting, kv.usable_blocks, finished, last_tok)
        for req in finished:
            source.on_done(req.spec, req.finish_time)
