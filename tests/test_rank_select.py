"""Rank selection over blocks (sim/app/rank_select.py) against the whole sample sorted stably: the same
entry at every rank, for samples that stress the cells (ties, one value, both signs and zeros of both
signs, a span of 600 decades), with cells split down to single keys and with the defaults."""

from __future__ import annotations

import numpy as np
import pytest

import sim.app.rank_select as rank_select
from sim.app.rank_select import count_blocks


def _sample(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "ties":
        return rng.integers(0, 7, n) * 0.25
    if kind == "one value":
        return np.full(n, 0.0125)
    if kind == "signs":  # negatives, +0.0 and -0.0 (equal values: stable order decides)
        v = rng.standard_normal(n)
        v[rng.random(n) < 0.2] = 0.0
        v[rng.random(n) < 0.2] = -0.0
        return v
    if kind == "span":  # keys far apart: the uint64 offsets use the whole range
        return np.sign(rng.standard_normal(n)) * 10.0 ** rng.uniform(-300, 300, n)
    return np.exp(rng.standard_normal(n) * 3)


@pytest.mark.parametrize("kind", ["lognormal", "ties", "one value", "signs", "span"])
@pytest.mark.parametrize("cells", [(2, 1, 3), (5, 3, 64), (16, 10, 1 << 21)])
def test_every_rank_is_the_sorted_samples_entry(kind: str, cells: tuple[int, int, int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for name, value in zip(("RADIX_BITS", "SPLIT_BITS", "GATHER"), cells, strict=True):
        monkeypatch.setattr(rank_select, name, value)
    rng = np.random.default_rng(len(kind) * 31 + cells[0])
    n = 3000
    v, w = _sample(kind, rng, n), rng.integers(1, 9, n)
    cuts = np.sort(rng.integers(0, n, 4))

    def blocks():
        return zip(np.split(v, cuts), np.split(w, cuts), strict=True)

    order = np.argsort(v, kind="stable")
    sv, cw = v[order], np.cumsum(w[order])
    by_count = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, 40)]))
    got_v, got_w = rank_select.select(blocks, by_count, by_count=True)
    assert np.array_equal(got_v, sv[by_count]) and np.array_equal(got_w, cw[by_count])
    assert np.array_equal(np.signbit(got_v), np.signbit(sv[by_count]))  # -0.0 where the sample has it
    by_weight = np.concatenate([[0, cw[-1] - 1], rng.integers(0, cw[-1], 40)])
    got_v, _ = rank_select.select(blocks, by_weight, by_count=False)
    assert np.array_equal(got_v, sv[np.searchsorted(cw, by_weight, side="right")])
    # the caller's pass handing the range on (rank_select.count_blocks) gives the same entries
    n_, total, span = count_blocks(blocks())
    assert (n_, total, span) == (n, int(w.sum()), (float(v.min()), float(v.max())))
    got_v, got_w = rank_select.select(blocks, by_count, by_count=True, value_range=span)
    assert np.array_equal(got_v, sv[by_count]) and np.array_equal(got_w, cw[by_count])
    got_v, _ = rank_select.select(blocks, by_weight, by_count=False, value_range=span)
    assert np.array_equal(got_v, sv[np.searchsorted(cw, by_weight, side="right")])


def test_keys_keep_the_order_of_the_values() -> None:
    v = np.array([-np.inf, -1e300, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1.0, 1e300, np.inf])
    k = rank_select.order_keys(v)
    assert np.all(np.diff(k[[0, 1, 2, 3, 4]].astype(object)) > 0) and k[4] == k[5]  # -0.0 and 0.0 share one
    assert np.all(np.diff(k[5:].astype(object)) > 0)
    assert np.array_equal(rank_select.from_keys(k), v + 0.0)


def test_an_empty_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        rank_select.select(lambda: iter([(np.zeros(0), np.zeros(0, dtype=np.int64))]), np.array([0]), True)
