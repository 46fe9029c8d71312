"""Summary statistics as vLLM's benchmark computes them, plus weighted and time-weighted variants.

Weighted, because the engine compresses runs of identical decode steps into (gap, count) pairs; the
answers equal numpy's on the expanded sample (tests/test_results.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from sim.app import rank_select
from sim.app.rank_select import (  # Blocks: a fresh pass over (values, weights)
    Blocks,
    CellSums,
    Tally,
    count_blocks,
)
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
LEAF = 1 << 16  # pairwise-summation leaves summed by numpy at once (>= 128, numpy's own block)


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


def stats_ms_blocks(name: str, blocks: Blocks, percentiles: Sequence[float],
                    size: int | None = None) -> dict[str, float | None]:  # fmt: skip
    """``stats_ms(name, values, percentiles, weights)`` of the sample ``blocks`` gives, pass by pass.

    ``size``: how many entries the blocks hold (a run's gaps know it without a pass). Then the pass that
    sums the mean also counts the sample, and the variance's pass also makes the percentiles' first
    cell sums: two passes fewer (each rebuilds a big run's gaps). Should entries be dropped (a zero
    weight, a value that is not finite), or no size be given, the kept entries are counted first."""
    keys = _stat_keys(name, percentiles)
    counted = _sum_counted(blocks, size) if size is not None else None
    if counted is None:
        counted = _sum_counted(blocks, count_blocks(clean_blocks(blocks))[0])
        assert counted is not None  # told the kept count, the sum's tree is laid out for them
    (n, total, span), wsum = counted
    if n == 0 or span is None:
        return dict.fromkeys(keys)
    scl = np.float64(total)  # np.average: the weights' sum (an integer: exact in any order)
    mean = wsum / scl
    cells = CellSums(span)
    var = _pairwise_adding(n, blocks, cells.add, lambda v, w: np.multiply((v - mean) ** 2, w, dtype=np.float64)) / scl
    med, *pcts = weighted_percentiles_blocks(blocks, [50.0, *percentiles], total, span, cells=cells)
    out = [mean, med, math.sqrt(var), *pcts]
    return {k: float(x) * 1000.0 for k, x in zip(keys, out, strict=True)}


def _pairwise_adding(n: int, blocks: Blocks, add: Callable[[np.ndarray, np.ndarray], None],
                     term: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.float64:
    """``pairwise_sum`` of ``term(v, w)`` over the n kept entries, each kept block handed to ``add`` as it
    goes by, every one of them (raises StopIteration when fewer than n are kept)."""
    kept = clean_blocks(blocks)

    def adding() -> Iterator[np.ndarray]:
        for v, w in kept:
            add(v, w)
            yield term(v, w)

    terms = adding()
    got = pairwise_sum(n, terms)
    for _ in terms:  # past the n values (more kept than n): added, and seen by the caller's count
        pass
    return got


def _sum_counted(blocks: Blocks, size: int) -> tuple[tuple[int, int, tuple[float, float] | None], np.float64] | None:
    """``count_blocks`` of the kept entries and ``pairwise_sum`` of their values times weights in one
    pass, the sum's tree laid out for ``size`` entries; None when that is not how many were kept (the
    sum is then of another tree)."""
    tally = Tally()
    try:
        wsum = _pairwise_adding(size, blocks, tally.add, lambda v, w: np.multiply(v, w, dtype=np.float64))
    except StopIteration:  # fewer entries than ``size``
        return None
    return (tally.counts(), wsum) if tally.n == size else None


def weighted_percentiles_blocks(blocks: Blocks, qs: Sequence[float], total: int | None = None,
                                value_range: tuple[float, float] | None = None,
                                cells: CellSums | None = None) -> np.ndarray:  # fmt: skip
    """``weighted_percentiles`` of the sample ``blocks`` gives: the two entries around each virtual index
    found by rank selection (sim/app/rank_select.py), then numpy's linear interpolation. ``total`` and
    ``value_range``: the kept entries' weight and least and greatest value, when the caller has them
    (``count_blocks``: a pass over the blocks less for each; a million-request run's gaps are rebuilt for each
    pass); ``cells``: rank selection's first cell sums when the caller made them (rank_select.CellSums)."""
    if total is None:
        _, total, value_range = count_blocks(clean_blocks(blocks))
    if total == 0:
        raise ValueError("weighted_percentiles of an empty sample")
    n = np.int64(total)
    h = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100.0)
    lo = np.floor(h)
    frac = h - lo
    got, _ = rank_select.select(lambda: clean_blocks(blocks), np.concatenate([lo, np.minimum(lo + 1, n - 1)]),
                                by_count=False, value_range=value_range, cells=cells)  # fmt: skip
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


def ecdf_fractions(cum_w: np.ndarray, total: int) -> np.ndarray:
    """``ecdf_points``' cumulated weights as the fractions of the total the CDF draws."""
    return cum_w.astype(np.float64) / np.float64(total) if total else cum_w.astype(np.float64)


def ecdf_points(blocks: Blocks, max_points: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A weighted sample's empirical CDF as sim/app/report.py ``_ecdf`` draws it, from blocks: the values
    at entry ranks ``unique(linspace(0, n - 1, max_points))`` of the kept entries sorted stably by value
    (every entry when there are at most ``max_points``), the cumulated weight through each as an integer
    (``ecdf_fractions`` draws it; ``report_style.decades_from_ecdf`` reads it exactly), and the total."""
    n, total, span = count_blocks(clean_blocks(blocks))
    if n <= max_points:
        parts = list(clean_blocks(blocks))
        v = np.concatenate([p for p, _ in parts]) if parts else np.zeros(0)
        w = np.concatenate([q for _, q in parts]) if parts else np.zeros(0, dtype=np.int64)
        order = np.argsort(v, kind="stable")
        return v[order], np.cumsum(w[order], dtype=np.int64), total
    ranks = np.unique(np.linspace(0, n - 1, max_points).astype(np.int64))
    values, cum_w = rank_select.select(lambda: clean_blocks(blocks), ranks, by_count=True, value_range=span)
    return values, cum_w.astype(np.int64), total
