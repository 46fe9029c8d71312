"""The synchronous loop's decode runs through arrivals (sim/engine/chain.py holds the arrays).

The synchronous fast-forward (fastforward.py) takes a quiet stretch after a step; where it may pass
finishes and the policy has a waiting pass of its own, the stretch goes on through arrivals: legs of
decode steps up to each arrival, planned, priced and waited out as a run; at an arrival's step the
decode rows take their tokens from the arrays and the policy takes its waiting pass
(``schedule_waiting``); the step is priced and waited out as the loop would, and what it admitted with
the whole prompt (its first token lands with the step) joins the rows. The chain ends at the horizon,
when no row decodes, when the pool would run short, when finishes may no longer pass, or after an
arrival's step that leaves a request waiting or a prompt in chunks; the loop goes on from there.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.engine.chain import Chain
from sim.engine.chain_legs import ARRIVAL, DECLINE, arrival_step, legs
from sim.engine.rowpass import last_token_times, stamp_run


def chain_rows(policy: Any, max_len: int) -> tuple[list[int], list[int]] | None:
    """The running rows as a synchronous chain takes them (plan_run's decode rows): each row's computed
    tokens and the step of its last token; None where a row is not decoding one token or has hashed
    content ahead of it (its blocks would register as they fill)."""
    running: list[Request] = policy.running
    caching = policy.kv.enable_caching
    n = len(running)
    c0 = [0] * n
    left = [0] * n
    for i in range(n):
        req = running[i]
        c = req.num_computed_tokens
        t = req.num_tokens
        if t - c != 1 or t == req.prompt_len or (caching and req.hash_end > c):
            return None
        c0[i] = c
        rest = req.output_len - req.num_output_tokens
        left[i] = rest if rest < max_len - t else max_len - t
    return c0, left


def run_chain(ff: Any, eng: Any, start: float, nxt: float | None, c0: list[int], left: list[int],
              keep_free: int) -> Generator[Any, Any, bool]:
    """The chain after a step that ended at ``start`` (the clock); returns False, changing nothing, where
    its first leg would not be taken as a run (two steps at least), True when it ran."""
    policy = eng.policy
    kv = policy.kv
    running: list[Request] = list(policy.running)
    ch = Chain(policy, eng.source, running, list(c0), list(left), kv.num_blocks_held_rows(running),
               last_token_times(running))
    max_len = policy.limits.max_model_len
    a = 0  # steps taken; the clock is at s_next, step a + 1's start
    s_next = start
    while True:
        got_to, a, s_next, _ = yield from legs(ff, eng, ch, a, s_next, 0.0, nxt, keep_free)
        if got_to == DECLINE:
            return False
        if got_to != ARRIVAL:
            break
        j = a + 1  # step j begins with an arrival: taken here, or the chain ends before it
        got = arrival_step(eng, ch, j, s_next, keep_free)
        if got is None:
            break
        rows, adm, batch, d = got
        ch.record_batch(s_next, d)
        ch.admitted(j, rows, adm, batch, policy.num_running)
        ff.chained += 1
        goes_on = True
        if adm is not None:
            # Those admitted with the whole prompt (their first token lands with the step) join the rows,
            # all of them or none.
            sampled = {id(r) for r in adm.sampled}
            joins = True
            for req in adm.admitted:
                if (req.num_computed_tokens != req.prompt_len or req.num_output_tokens or id(req) not in sampled
                        or (kv.enable_caching and req.hash_end > req.prompt_len)):
                    joins = False
            if joins:
                for req in adm.admitted:
                    ch.join(req, j, max_len)
                ff.joined += len(adm.admitted)
            quiet = policy.quiet()
            goes_on = (joins and not policy.num_waiting and quiet is not None and not quiet.finishes_matter
                       and quiet.keep_free == keep_free)
        end = s_next + d
        yield from ff._sleep_to(eng, end)
        a, s_next = j, end
        ch.bring_to(a)  # the step's landing: the chain's rows that finish with it
        if not goes_on:
            # The admitted rows that did not join land as the loop's update lands them, after the rows
            # before them in the step's plan.
            _end(ff, eng, ch, a, 0 if adm is None else _land_unjoined(eng, ch, adm, end))
            return True
        nxt = ff._next_event(eng)
    _end(ff, eng, ch, a, 0)
    return True


def _land_unjoined(eng: Any, ch: Chain, adm: Any, end: float) -> int:
    """The admissions of a chain's last step that did not join its rows (a prompt in chunks, hashed
    content past a prompt): what the loop's update does for those that sampled when the step lands.
    Returns how many of them finished."""
    joined = {id(ch.reqs[i]) for i in range(ch.n0, len(ch.reqs))}
    rows = [r for r in adm.sampled if id(r) not in joined]
    if not rows:
        return 0
    eng.rec.on_tokens(rows, end)
    done = eng.policy.update(StepPlan(sampled=rows), end)
    for req in done:
        eng.source.on_done(req.spec, end)
    return len(done)


def _end(ff: Any, eng: Any, ch: Chain, k: int, more_done: int) -> None:
    """Everything applied through step k, and the k steps recorded as one run (``more_done``: requests
    that finished with step k outside the chain's rows)."""
    policy = eng.policy
    kv = policy.kv
    ch.finish_chain(k)
    policy.on_skipped_steps(k)
    starts, durations = ch.starts[:k], ch.durations[:k]
    n0 = ch.n0
    first_gaps = stamp_run(ch.reqs[:n0], ch.fin[:n0], starts, durations, ch.last_before, False)
    ch.stamp_joined(k)
    waiting: list[int] | int = 0
    if ch.waiting_last and ch.adm_at == k:
        waiting = [0] * k
        waiting[k - 1] = ch.waiting_last
    finished = ch.finishes(k)
    finished[k - 1] += more_done
    eng.rec.on_run_columns(starts, durations, ch.pre[:k] if ch.any_prefill else 0, ch.dec[:k], ch.run_n[:k],
                           finished, ch.free_after[:k], ch.cached_after[:k], kv.usable_blocks, first_gaps,
                           waiting)
    ff.runs += 1
    ff.steps += k
