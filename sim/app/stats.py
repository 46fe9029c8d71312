"""Summary statistics as vLLM's benchmark computes them, plus weighted and time-weighted variants.

Weighted, because the engine compresses runs of identical decode steps into (gap, count) pairs; the
answers equal numpy's on the expanded sample (tests/test_results.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from sim.core.errors import ResultsIntegrityError


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """Percentiles of ``values`` repeated ``weights`` times, without expanding them.

    Same answer as ``np.percentile(np.repeat(values, weights), qs)`` (linear method): the virtual index
    (N−1)·q/100 into the expanded sorted array is mapped back through the cumulative weights.
    """
    v, w = clean_weighted(values, weights)
    if v.size == 0:
        raise ValueError("weighted_percentiles of an empty sample")
    order = np.argsort(v, kind="stable")
    v, cw = v[order], w[order]
    del order  # three arrays the sample's size at most (a big run has ~10^7 gaps)
    np.cumsum(cw, out=cw)
    n = cw[-1]
    h = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100.0)
    lo = np.floor(h)
    frac = h - lo
    # expanded[k] = v[first j with cw[j] > k]
    a = v[np.searchsorted(cw, lo, side="right")]
    b = v[np.searchsorted(cw, np.minimum(lo + 1, n - 1), side="right")]
    diff = b - a
    # numpy's _lerp: interpolate from the nearer end so that t=1 gives b exactly
    return np.where(frac >= 0.5, b - diff * (1 - frac), a + diff * frac)


def clean_weighted(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values, dtype=np.float64).ravel()
    w = np.asarray(weights).ravel()
    if v.shape != w.shape:
        raise ResultsIntegrityError(f"{v.size} values but {w.size} weights")
    if w.size and (np.any(w < 0) or (w.dtype.kind not in "iu" and np.any(w != np.floor(w)))):
        raise ResultsIntegrityError("ITL weights must be non-negative integers (counts of equal gaps)")
    keep = (w > 0) & np.isfinite(v)
    if keep.all():  # the usual case: no copies (a million-request run has ~10^7 gaps)
        return v, w.astype(np.int64, copy=False)
    return v[keep], w[keep].astype(np.int64)


def p_word(q: float) -> str:
    # serve.py: p_word = str(int(p)) if int(p) == p else str(p)
    return str(int(q)) if int(q) == q else str(q)


def stats_ms(name: str, values: np.ndarray, percentiles: Sequence[float],
              weights: np.ndarray | None = None) -> dict[str, float | None]:  # fmt: skip
    """mean/median/std/p<q> of one metric in ms, vLLM's key names; None for every key when empty."""
    if weights is None:
        v = np.asarray(values, dtype=np.float64)
        v, w = v[np.isfinite(v)], None
    else:
        v, w = clean_weighted(values, weights)
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms"] + [
        f"p{p_word(q)}_{name}_ms" for q in percentiles
    ]
    if v.size == 0:
        return dict.fromkeys(keys)
    if w is None:  # plain numpy, exactly what serve.py calls
        mean, std, med = np.mean(v), np.std(v), np.median(v)
        pcts = np.percentile(v, list(percentiles)) if len(percentiles) else np.array([])
    else:
        mean = np.average(v, weights=w)
        std = math.sqrt(np.average((v - mean) ** 2, weights=w))
        med, *rest = weighted_percentiles(v, w, [50.0, *percentiles])
        pcts = np.asarray(rest)
    out = [mean, med, std, *pcts]
    return {k: float(x) * 1000.0 for k, x in zip(keys, out, strict=True)}


def time_weighted(values: pd.Series | np.ndarray, durations: pd.Series | np.ndarray) -> float | None:
    v = np.asarray(values, dtype=np.float64)
    d = np.asarray(durations, dtype=np.float64)
    if v.size == 0:
        return None
    total = d.sum()
    return float((v * d).sum() / total) if total > 0 else float(v.mean())
