"""Decode-only step times over plain lists, compiled by mypyc (sim/native.py): the fast-forward prices a
run of tens of steps, where numpy's fixed cost per call outweighs the arithmetic.

The same operations in the same order as ``RooflineCostModel.decode_step_times`` (and ``step_time``),
so the three agree to the bit (tests/test_runcalc.py). The C build keeps every multiply and add
separate (sim/native.py turns off floating-point contraction), as numpy and the interpreter do.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_times(tok: list[float], head: list[float], pad: list[int], step_oh: float, seq_oh: float,
                 layers: float, attn_t0: float, kv_coef: float, dec_seq: float,
                 rows: list[int], ctx_sums: list[int]) -> list[float]:
    """Step j's seconds with ``rows[j]`` decode rows (each sampling) whose contexts sum to ``ctx_sums[j]``;
    raises IndexError when a row count is beyond the tables (the caller grows them)."""
    out = [0.0] * len(rows)
    np_ = len(pad)
    for j in range(len(rows)):
        n = rows[j]
        if n <= 0:
            continue
        mg = pad[n] if n < np_ else n
        const = tok[mg] + head[n] + step_oh + seq_oh * n
        out[j] = const + layers * (attn_t0 + (kv_coef * ctx_sums[j] + n * dec_seq))
    return out


def price_decode_steps(cost: Any, rows: list[int], ctx_sums: list[int]) -> list[float]:
    """A cost model's times of consecutive decode-only steps (``rows[j]`` rows, context sum ``ctx_sums[j]``)
    as a list: its ``decode_step_list`` when it has one (the same values as ``decode_step_times``, without
    numpy's per-call cost), else ``decode_step_times`` on arrays (a plug-in cost model needs only that)."""
    fn = getattr(cost, "decode_step_list", None)
    if fn is not None:
        return fn(rows, ctx_sums)
    times = cost.decode_step_times(np.asarray(rows, dtype=np.int64), np.asarray(ctx_sums, dtype=np.float64))
    return np.asarray(times, dtype=np.float64).tolist()
