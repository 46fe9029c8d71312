"""Summary statistics as vLLM's benchmark computes them, plus weighted and time-weighted variants.

Weighted, because the engine compresses runs of identical decode steps into (gap, count) pairs; the
answers equal numpy's on the expanded sample (tests/test_results.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

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


def _stat_keys(name: str, percentiles: Sequence[float]) -> list[str]:
    """vLLM's summary keys of one metric: mean, median, std, then each percentile."""
    return [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", *(f"p{p_word(q)}_{name}_ms" for q in percentiles)]


def stats_ms(name: str, values: np.ndarray, percentiles: Sequence[float],
              weights: np.ndarray | None = None) -> dict[str, float | None]:  # fmt: skip
    """mean/median/std/p<q> of one metric in ms, vLLM's key names; None for every key when empty."""
    if weights is None:
        v = np.asarray(values, dtype=np.float64)
        v, w = v[np.isfinite(v)], None
    else:
        v, w = clean_weighted(values, weights)
    keys = _stat_keys(name, percentiles)
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


# ---- the same statistics over a sample given in blocks ------------------------------------------------
# A million-request run has ~4·10^7 weighted gaps, rebuilt a block at a time (sim/engine/gaps.py): these
# give stats_ms's numbers bit for bit without the whole sample (nor its sorted copy) in memory.
Blocks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]  # a fresh pass over (values, weights)
LEAF = 1 << 16  # pairwise-summation leaves summed by numpy at once (>= 128, numpy's own block)
PIVOTS = 1 << 14  # about how many sample values split the sample into buckets for the percentiles


def clean_blocks(blocks: Blocks) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for values, weights in blocks():
        v, w = clean_weighted(values, weights)
        if v.size:
            yield v, w


class _Take:
    """The next m values of a stream of arrays, as one array."""

    def __init__(self, arrays: Iterator[np.ndarray]) -> None:
        self.arrays, self.rest = arrays, np.zeros(0)

    def __call__(self, m: int) -> np.ndarray:
        parts, have = [self.rest], len(self.rest)
        while have < m:
            a = next(self.arrays)
            parts.append(a)
            have += len(a)
        got = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.rest = got[m:]
        return got[:m]


def pairwise_sum(n: int, arrays: Iterator[np.ndarray]) -> np.float64:
    """``np.sum`` of the n values the arrays hold in turn, the same float: numpy sums a contiguous
    float64 array pairwise (halves rounded down to a multiple of 8, down to blocks of 128), so the
    halves above LEAF are split here the same way and each leaf is numpy's own sum."""
    return _node(n, _Take(arrays))


def _node(m: int, take: _Take) -> np.float64:
    if m <= LEAF:
        return np.sum(take(m))
    half = m // 2
    half -= half % 8
    return _node(half, take) + _node(m - half, take)


def stats_ms_blocks(name: str, blocks: Blocks, percentiles: Sequence[float]) -> dict[str, float | None]:
    """``stats_ms(name, values, percentiles, weights)`` of the sample ``blocks`` gives, pass by pass."""
    keys = _stat_keys(name, percentiles)
    n = total = 0
    for v, w in clean_blocks(blocks):
        n, total = n + len(v), total + int(w.sum())
    if n == 0:
        return dict.fromkeys(keys)
    scl = np.float64(total)  # np.average: the weights' sum (an integer: exact in any order)
    mean = pairwise_sum(n, (np.multiply(v, w, dtype=np.float64) for v, w in clean_blocks(blocks))) / scl
    var = pairwise_sum(n, (np.multiply((v - mean) ** 2, w, dtype=np.float64)
                           for v, w in clean_blocks(blocks))) / scl  # fmt: skip
    med, *pcts = weighted_percentiles_blocks(blocks, [50.0, *percentiles])
    out = [mean, med, math.sqrt(var), *pcts]
    return {k: float(x) * 1000.0 for k, x in zip(keys, out, strict=True)}


def weighted_percentiles_blocks(blocks: Blocks, qs: Sequence[float]) -> np.ndarray:
    """``weighted_percentiles`` of the sample ``blocks`` gives.

    The values at the ranks needed are found by buckets: a strided sample's distinct values split the
    line into "equal to pivot i" and "between pivots i−1 and i"; one pass sums each bucket's weight, a
    second keeps only the few buckets holding a needed rank, sorted like the whole sample would be."""
    n_values = total = 0
    for _, w in clean_blocks(blocks):
        n_values, total = n_values + len(w), total + int(w.sum())
    if total == 0:
        raise ValueError("weighted_percentiles of an empty sample")
    stride = max(1, n_values // PIVOTS)
    samples = [v[::stride].copy() for v, _ in clean_blocks(blocks)]  # copies: a view would keep its block
    pivots = np.unique(np.concatenate(samples))

    def bucket(v: np.ndarray) -> np.ndarray:
        i = np.searchsorted(pivots, v, side="left")
        return 2 * i + (pivots[np.minimum(i, len(pivots) - 1)] == v)

    mass = np.zeros(2 * len(pivots) + 1, dtype=np.int64)
    for v, w in clean_blocks(blocks):
        mass += np.bincount(bucket(v), weights=w, minlength=len(mass)).astype(np.int64)
    cum = np.cumsum(mass)
    n = np.int64(total)
    h = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100.0)
    lo = np.floor(h)
    frac = h - lo
    ranks = np.concatenate([lo, np.minimum(lo + 1, n - 1)])
    where = np.searchsorted(cum, ranks, side="right")  # the bucket of each rank
    got = np.empty(len(ranks))
    between = sorted({int(b) for b in where if b % 2 == 0})
    keep: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {b: [] for b in between}
    if between:
        for v, w in clean_blocks(blocks):
            bv = bucket(v)
            sel = np.isin(bv, between)
            for b in between if sel.any() else ():
                mine = sel & (bv == b)
                keep[b].append((v[mine], w[mine]))
    for j, (rank, b) in enumerate(zip(ranks.tolist(), where.tolist(), strict=True)):
        if b % 2:
            got[j] = pivots[b // 2]
            continue
        v = np.concatenate([x for x, _ in keep[b]])
        w = np.concatenate([x for _, x in keep[b]])
        order = np.argsort(v, kind="stable")
        local = rank - (cum[b - 1] if b else 0)
        got[j] = v[order][np.searchsorted(np.cumsum(w[order]), local, side="right")]
    a, b = got[: len(qs)], got[len(qs) :]
    diff = b - a
    return np.where(frac >= 0.5, b - diff * (1 - frac), a + diff * frac)


def time_weighted_blocks(n: int, blocks: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]) -> float | None:
    """The duration-weighted mean of the n (values, durations) that ``blocks`` gives a block at a time (the
    plain mean when no time passed; None with no values)."""
    if n == 0:
        return None
    total = pairwise_sum(n, (np.asarray(d, dtype=np.float64) for _, d in blocks()))
    if total > 0:
        return float(pairwise_sum(n, (np.asarray(v, dtype=np.float64) * np.asarray(d, dtype=np.float64)
                                      for v, d in blocks())) / total)  # fmt: skip
    return float(pairwise_sum(n, (np.asarray(v, dtype=np.float64) for v, _ in blocks())) / n)


def ecdf_blocks(blocks: Blocks, max_points: int, pivots_wanted: int = 1 << 18) -> tuple[np.ndarray, np.ndarray]:
    """A weighted sample's empirical CDF as sim/app/report.py ``_ecdf`` draws it, from blocks: the values
    at entry ranks ``unique(linspace(0, n - 1, max_points))`` of the kept entries sorted stably by value,
    and the cumulated weight there over the total; every entry when there are at most ``max_points``."""
    n = total = 0
    for v, w in clean_blocks(blocks):
        n, total = n + len(v), total + int(w.sum())
    if n <= max_points:
        parts = list(clean_blocks(blocks))
        v = np.concatenate([p for p, _ in parts]) if parts else np.zeros(0)
        w = np.concatenate([q for _, q in parts]).astype(np.float64) if parts else np.zeros(0)
        order = np.argsort(v, kind="stable")
        cw = np.cumsum(w[order])
        return v[order], cw / cw[-1] if cw.size else cw
    ranks = np.unique(np.linspace(0, n - 1, max_points).astype(np.int64))
    stride = max(1, n // pivots_wanted)
    pivots = np.unique(np.concatenate([v[::stride].copy() for v, _ in clean_blocks(blocks)]))

    def bucket(v: np.ndarray) -> np.ndarray:
        i = np.searchsorted(pivots, v, side="left")
        return 2 * i + (pivots[np.minimum(i, len(pivots) - 1)] == v)

    m = 2 * len(pivots) + 1
    count, weight = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    for v, w in clean_blocks(blocks):
        b = bucket(v)
        count += np.bincount(b, minlength=m)
        weight += np.bincount(b, weights=w, minlength=m).astype(np.int64)
    cum_n, cum_w = np.cumsum(count), np.cumsum(weight)
    where = np.searchsorted(cum_n, ranks, side="right")
    before_n = np.where(where > 0, cum_n[np.maximum(where - 1, 0)], 0)
    before_w = np.where(where > 0, cum_w[np.maximum(where - 1, 0)], 0)
    local = ranks - before_n  # entry rank inside its bucket
    needed = np.unique(where)
    # the needed buckets' entries in sample order: (bucket, value, weight)
    got_b, got_v, got_w = [], [], []
    for v, w in clean_blocks(blocks):
        b = bucket(v)
        sel = np.isin(b, needed)
        got_b.append(b[sel])
        got_v.append(v[sel])
        got_w.append(w[sel])
    gb, gv, gw = np.concatenate(got_b), np.concatenate(got_v), np.concatenate(got_w)
    order = np.lexsort((gv, gb))  # by bucket, then value; ties keep the sample's order (stable)
    gb, gv, gw = gb[order], gv[order], np.cumsum(gw[order])
    first = np.searchsorted(gb, where, side="left")  # each rank's bucket's first entry
    j = first + local
    in_bucket = gw[j] - np.where(first > 0, gw[np.maximum(first - 1, 0)], 0)
    values = gv[j]
    return values, (before_w + in_bucket).astype(np.float64) / np.float64(total)
