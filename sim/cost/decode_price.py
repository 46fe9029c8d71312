"""Decode-only step times over plain lists, compiled by mypyc (sim/native.py): the fast-forward prices a
run of tens of steps, where numpy's fixed cost per call outweighs the arithmetic.

The same operations in the same order as ``RooflineCostModel.decode_step_times`` (and ``step_time``),
so the three agree to the bit (tests/test_runcalc.py). The C build keeps every multiply and add
separate (sim/native.py turns off floating-point contraction), as numpy and the interpreter do.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_step(tok: list[float], head: list[float], pad: list[int], step_oh: float, seq_oh: float,
                layers: float, attn_t0: float, kv_coef: float, dec_seq: float, n: int, ctx_sum: int) -> float:
    """One decode-only step's seconds with ``n`` > 0 rows (each sampling) whose contexts sum to ``ctx_sum``:
    the roofline's decode formula, in one place for both passes below; raises IndexError when ``n`` is
    beyond the tables (the caller grows them)."""
    mg = pad[n] if n < len(pad) else n
    return tok[mg] + head[n] + step_oh + seq_oh * n + layers * (attn_t0 + (kv_coef * ctx_sum + n * dec_seq))


def decode_times(tok: list[float], head: list[float], pad: list[int], step_oh: float, seq_oh: float,
                 layers: float, attn_t0: float, kv_coef: float, dec_seq: float,
                 rows: list[int], ctx_sums: list[int]) -> list[float]:
    """Step j's seconds with ``rows[j]`` decode rows (each sampling) whose contexts sum to ``ctx_sums[j]``
    (0 without rows); raises IndexError when a row count is beyond the tables (the caller grows them)."""
    out = [0.0] * len(rows)
    for j in range(len(rows)):
        n = rows[j]
        if n > 0:
            out[j] = decode_step(tok, head, pad, step_oh, seq_oh, layers, attn_t0, kv_coef, dec_seq, n, ctx_sums[j])
    return out


def decode_run_times(tok: list[float], head: list[float], pad: list[int], step_oh: float, seq_oh: float,
                     layers: float, attn_t0: float, kv_coef: float, dec_seq: float, count: list[int],
                     ctx: list[int], start: float, limit: float) -> tuple[list[int], list[float]]:
    """A decode run's rows per step and ``decode_times`` of its steps in one pass, from how many rows end
    at each step 0..k and their computed tokens (``runcalc.finish_counts``), without the list of context
    sums (an int object a step, most of them priced for steps a push then discards): each step's rows and
    context sum are ``run_rows``', carried forward. Priced as ``FastForward._price_until`` prices the
    lists: windows of 32, 64, ... steps until the clock from ``start`` reaches ``limit`` after a window,
    so the durations are the same list (tests/test_runcalc.py holds the two paths equal). Returns (rows
    of each of the k steps, the durations priced); raises IndexError as ``decode_times`` does."""
    k = len(count) - 1
    n = sum(count) - count[0]  # the rows that take step 1 (row i takes steps 1..last[i])
    s = sum(ctx) - ctx[0]  # their computed tokens before the run
    rows = [0] * k
    out: list[float] = []
    t = start
    a, window, j = 0, 32, 0
    while a < k:
        b = min(k, a + window)
        while j < b:
            step = j + 1
            rows[j] = n
            d = 0.0
            if n > 0:
                d = decode_step(tok, head, pad, step_oh, seq_oh, layers, attn_t0, kv_coef, dec_seq, n, s + n * step)
            out.append(d)
            t = t + d
            n -= count[step]
            s -= ctx[step]
            j += 1
        if t >= limit:
            break
        a, window = b, window * 2
    while j < k:  # rows of the steps past the priced ones
        rows[j] = n
        n -= count[j + 1]
        j += 1
    return rows, out


def price_decode_steps(cost: Any, rows: list[int], ctx_sums: list[int]) -> list[float]:
    """A cost model's times of consecutive decode-only steps (``rows[j]`` rows, context sum ``ctx_sums[j]``)
    as a list: its ``decode_step_list`` when it has one (the same values as ``decode_step_times``, without
    numpy's per-call cost), else ``decode_step_times`` on arrays (a plug-in cost model needs only that)."""
    fn = getattr(cost, "decode_step_list", None)
    if fn is not None:
        return fn(rows, ctx_sums)
    times = cost.decode_step_times(np.asarray(rows, dtype=np.int64), np.asarray(ctx_sums, dtype=np.float64))
    return np.asarray(times, dtype=np.float64).tolist()
