"""Exact rank selection in a weighted sample given a block at a time: the entry at a rank of the sample
sorted stably by value, without the whole sample (nor its sorted copy) in memory.

A run's inter-token gaps are ~10^7 (value, count) entries, read as blocks (sim/engine/gaps.py); the
summary's percentiles and the report's CDF need a few thousand order statistics of them. Each float64
is mapped to a uint64 with the same order (``order_keys``), and a pass counts entries and weights in
2^RADIX_BITS cells of equal key width (a shift, no search: the binary search against sampled pivots
this replaces cost ~56 ns an entry, 0.48 s of the report's ITL CDF at 100k requests). A cell holding a wanted rank and more than
its share of GATHER entries is split again in a further pass (2^SPLIT_BITS sub-cells); at width one key
a cell holds one value, so ties (a constant-time cost model gives one gap value) stop the splitting,
and a weighted percentile there is that value. Last, the entries of the other wanted cells are
gathered, in sample order, and sorted stably: a rank's entry is then read from its cell, and cells are
value intervals, so the order is the whole sample's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

Blocks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]  # a fresh pass over (values, weights); select: clean ones

RADIX_BITS = 16  # cells of the first pass: 2^16 counts and weights stay in cache
SPLIT_BITS = 10  # sub-cells of each wanted heavy cell in a further pass
GATHER = 1 << 21  # entries gathered (~50 MB) but for one-key cells of a CDF: a wanted cell over its share is split

_SIGN = np.uint64(1 << 63)


def order_keys(v: np.ndarray) -> np.ndarray:
    """Each float64 as a uint64 in the same order: the sign bit set for v >= 0, every bit flipped for
    v < 0; -0.0 is first made 0.0 (they are equal values, so they must share a key)."""
    b = (np.asarray(v, dtype=np.float64) + 0.0).view(np.uint64)
    neg = (b >> np.uint64(63)).astype(bool)
    return np.where(neg, ~b, b | _SIGN) if neg.any() else b | _SIGN


def from_keys(k: np.ndarray) -> np.ndarray:
    """The float64 values of ``order_keys``' keys."""
    k = np.asarray(k, dtype=np.uint64)
    pos = (k >> np.uint64(63)).astype(bool)
    return np.where(pos, k ^ _SIGN, ~k).view(np.float64)


class Tally:
    """Entries, total weight, and least and greatest value of (values, weights) blocks added in turn."""

    def __init__(self) -> None:
        self.n = self.total = 0
        self.lo, self.hi = math.inf, -math.inf

    def add(self, v: np.ndarray, w: np.ndarray) -> None:
        if len(v):
            self.n, self.total = self.n + len(v), self.total + int(w.sum())
            self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))

    def counts(self) -> tuple[int, int, tuple[float, float] | None]:
        """(entries, total weight, (least, greatest) or None when empty): ``count_blocks``' answer."""
        return self.n, self.total, (self.lo, self.hi) if self.n else None


def count_blocks(blocks: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[int, int, tuple[float, float] | None]:
    """Entries, total weight, and least and greatest value (None when empty) of (values, weights) blocks, in
    one pass: a caller that counts its sample hands the range on to ``select``."""
    tally = Tally()
    for v, w in blocks:
        tally.add(v, w)
    return tally.counts()


class CellSums:
    """Entries and weight in each cell of ``select``'s first pass (2^RADIX_BITS cells of equal key width
    over the sample's value range), added a block at a time: a caller that passes over the sample anyway
    (the summary's variance) adds each block as it goes and hands the sums to ``select``, which then
    spares that pass (a big run's gaps are rebuilt for each)."""

    def __init__(self, value_range: tuple[float, float]) -> None:
        lo, hi = (int(k) for k in order_keys(np.array(value_range, dtype=np.float64)))
        self.base = np.uint64(lo)
        self.shift = max(0, (hi - lo).bit_length() - RADIX_BITS)
        cells = ((hi - lo) >> self.shift) + 1
        self.count, self.weight = np.zeros(cells, dtype=np.int64), np.zeros(cells, dtype=np.int64)

    def add(self, v: np.ndarray, w: np.ndarray) -> None:
        cells = len(self.count)
        c = ((order_keys(v) - self.base) >> np.uint64(self.shift)).astype(np.int64)
        self.count += np.bincount(c, minlength=cells)
        self.weight += np.bincount(c, weights=w, minlength=cells).astype(np.int64)


def select(blocks: Blocks, ranks: np.ndarray, by_count: bool, value_range: tuple[float, float] | None = None,
           cells: CellSums | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """For each rank r (0-based; in entries when ``by_count``, else in weight), the entry of the sample
    sorted stably by value where the cumulative measure first exceeds r: its value and (``by_count``)
    the cumulative weight through it. ``blocks`` gives finite values and int64 weights > 0; ranks lie in
    [0, the total measure). ``value_range``: the sample's least and greatest value, when the caller's own
    pass found them (a pass over the blocks less: a big run's gaps are rebuilt for each); ``cells``: the
    first pass's sums when the caller added every block to them (another pass less; ``value_range`` is
    then not read: the cells were laid out over it)."""
    ranks = np.asarray(ranks)
    if cells is None:
        if value_range is None:
            value_range = count_blocks(blocks())[2]
        if value_range is None:
            raise ValueError("rank selection in an empty sample")
        # finite values: their keys' order is the values' (order_keys), -0.0 and 0.0 one key
        cells = CellSums(value_range)
        for v, w in blocks():
            cells.add(v, w)
    base, shift, count, weight = cells.base, cells.shift, cells.count, cells.weight
    cum_m, cum_w, cum_n = np.cumsum(count if by_count else weight), np.cumsum(weight), np.cumsum(count)
    at = np.searchsorted(cum_m, ranks, side="right")  # each rank's cell at this level
    prev = np.maximum(at - 1, 0)
    before_m, before_w = np.where(at > 0, cum_m[prev], 0), np.where(at > 0, cum_w[prev], 0)
    size = cum_n[at] - np.where(at > 0, cum_n[prev], 0)  # entries in each rank's cell
    cell, shifts = at.astype(np.uint64), np.full(len(ranks), shift, dtype=np.int64)
    while shift > 0:
        share = GATHER // len(set(zip(cell.tolist(), shifts.tolist(), strict=True)))
        heavy = np.flatnonzero((size > share) & (shifts == shift))
        if not heavy.size:
            break
        active = np.unique(cell[heavy])
        # sub-cells per active cell: 2^SPLIT_BITS, fewer when many are active (2^16 bins in all at most)
        bits = min(SPLIT_BITS, shift, max(1, RADIX_BITS - int(len(active) - 1).bit_length()))
        new, sub = shift - bits, 1 << bits
        count, weight = _sub_sums(blocks, base, shift, new, active)
        row = np.searchsorted(active, cell[heavy])  # each heavy rank's active cell
        m, w, n = (np.cumsum(x.reshape(len(active), sub), axis=1)
                   for x in (count if by_count else weight, weight, count))  # fmt: skip
        # each row's cumulated measure lifted above the rows before it: one search for every rank
        lift = np.arange(len(active), dtype=np.float64) * (float(m[:, -1].max()) + 1.0)
        flat = (m + lift[:, None]).ravel()
        at = np.searchsorted(flat, ranks[heavy] - before_m[heavy] + lift[row], side="right") - row * sub
        prev = np.maximum(at - 1, 0)
        before_m[heavy] += np.where(at > 0, m[row, prev], 0)
        before_w[heavy] += np.where(at > 0, w[row, prev], 0)
        size[heavy] = n[row, at] - np.where(at > 0, n[row, prev], 0)
        cell[heavy] = cell[heavy] * np.uint64(sub) + at.astype(np.uint64)
        shifts[heavy] = new
        shift = new
    return _resolve(blocks, base, ranks, cell, shifts, before_m, before_w, by_count)


def _sub_sums(blocks: Blocks, base: np.uint64, shift: int, new: int, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries and weight of the 2^(shift - new) sub-cells of each ``active`` cell (sorted), in turn."""
    sub = 1 << (shift - new)
    bins = len(active) * sub
    count, weight = np.zeros(bins, dtype=np.int64), np.zeros(bins, dtype=np.int64)
    top = int(active[-1])
    table = None
    if top < 1 << 22:  # the cells of the first pass: a lookup, not a search
        table = np.full(top + 2, -1, dtype=np.int64)
        table[active.astype(np.int64)] = np.arange(len(active))
    for v, w in blocks():
        off = order_keys(v) - base
        parent = off >> np.uint64(shift)
        if table is not None:
            i = table[np.minimum(parent, np.uint64(top + 1)).astype(np.int64)]
            hit = i >= 0
        else:
            i = np.minimum(np.searchsorted(active, parent), len(active) - 1)
            hit = active[i] == parent
        if hit.any():
            b = i[hit] * sub + ((off[hit] >> np.uint64(new)) & np.uint64(sub - 1)).astype(np.int64)
            count += np.bincount(b, minlength=bins)
            weight += np.bincount(b, weights=w[hit], minlength=bins).astype(np.int64)
    return count, weight


def _resolve(blocks: Blocks, base: np.uint64, ranks: np.ndarray, cell: np.ndarray, shifts: np.ndarray,
             before_m: np.ndarray, before_w: np.ndarray, by_count: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each rank's entry in its final cell (the cells are disjoint key intervals). A weighted percentile in
    a one-key cell is that key's value; the other cells' entries are gathered and sorted stably by key."""
    start = np.array([c << s for c, s in zip(cell.tolist(), shifts.tolist(), strict=True)], dtype=np.uint64)
    values = np.zeros(len(ranks))
    cum_w = before_w.copy()
    known = (shifts == 0) & (not by_count)
    if known.any():
        values[known] = from_keys(start[known] + base)
    want = ~known
    if not want.any():
        return values, cum_w
    ends = np.array([(c + 1) << s for c, s in zip(cell[want].tolist(), shifts[want].tolist(), strict=True)],
                    dtype=np.uint64)  # fmt: skip
    starts, first = np.unique(start[want], return_index=True)
    ends = ends[first]
    got_k, got_v, got_w = [], [], []
    for v, w in blocks():
        off = order_keys(v) - base
        j = np.searchsorted(starts, off, side="right") - 1
        inside = (j >= 0) & (off < ends[np.maximum(j, 0)])
        got_k.append(off[inside])
        got_v.append(np.asarray(v)[inside])
        got_w.append(w[inside])
    gk, gv, gw = np.concatenate(got_k), np.concatenate(got_v), np.concatenate(got_w)
    order = np.argsort(gk, kind="stable")  # key order is value order; ties keep the sample's order
    gk, gv, gw = gk[order], gv[order], np.cumsum(gw[order])
    gm = np.arange(1, len(gk) + 1, dtype=np.int64) if by_count else gw
    lo = np.searchsorted(gk, start[want], side="left")  # each rank's cell's first gathered entry
    m_before = np.where(lo > 0, gm[np.maximum(lo - 1, 0)], 0)
    w_before = np.where(lo > 0, gw[np.maximum(lo - 1, 0)], 0)
    j = np.searchsorted(gm, m_before + (ranks[want] - before_m[want]), side="right")
    values[want] = gv[j]
    cum_w[want] = before_w[want] + gw[j] - w_before
    return values, cum_w
