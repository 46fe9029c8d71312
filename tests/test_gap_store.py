"""Inter-token gaps rebuilt from the step store (sim/engine/gaps.py) and summarised a block at a time
(sim/app/stats.py stats_ms_blocks): the same sample, in the same order, and the same numbers, bit for
bit, as the whole arrays give."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sim.app.stats as stats
from sim.app.results import summarize
from sim.engine.gaps import GapTable
from tests.test_outputs_unchanged import CASES

QS = [50, 90, 95, 99, 0, 100, 33.3]
# rank selection's (RADIX_BITS, SPLIT_BITS, GATHER) (sim/app/rank_select.py): 4 cells split in 2 until a
# wanted cell holds <= 3 / (its share) entries, i.e. down to single keys; a middle setting; the default
RADIX = ((2, 1, 3), (5, 3, 200), (16, 10, 1 << 21))


def _radix(monkeypatch: pytest.MonkeyPatch, cells: tuple[int, int, int]) -> None:
    import sim.app.rank_select as rank_select

    for name, value in zip(("RADIX_BITS", "SPLIT_BITS", "GATHER"), cells, strict=True):
        monkeypatch.setattr(rank_select, name, value)


@pytest.mark.parametrize("kind", ["uniform", "ties", "lognormal", "constant", "dropped"])
def test_block_statistics_are_the_arrays_statistics(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mean, std and percentiles of a weighted sample cut into blocks equal stats_ms on the arrays; a
    small LEAF makes the pairwise sum split above numpy's leaves, and rank selection runs with cells split
    down to single keys, a middle setting and its defaults (RADIX)."""
    rng = np.random.default_rng(len(kind))
    n = 20_000
    v = {"uniform": rng.random(n), "ties": rng.integers(0, 20, n) * 0.01,
         "lognormal": np.exp(rng.standard_normal(n)) * 1e-2, "constant": np.full(n, 0.02),
         "dropped": rng.random(n)}[kind]  # fmt: skip
    w = rng.integers(1, 40, n)
    if kind == "dropped":  # entries clean_weighted leaves out: the sums' split follows what is kept
        w[rng.random(n) < 0.1] = 0
        v[rng.random(n) < 0.05] = np.nan
    cuts = np.sort(rng.integers(0, n, 6))

    def blocks():
        return zip(np.split(v, cuts), np.split(w, cuts), strict=True)

    expected = stats.stats_ms("itl", v, QS, w)
    for leaf, cells in ((128, RADIX[0]), (1000, RADIX[1]), (1 << 20, RADIX[2])):
        monkeypatch.setattr(stats, "LEAF", leaf)
        _radix(monkeypatch, cells)
        assert stats.stats_ms_blocks("itl", blocks, QS) == expected, (leaf, cells)
        # told the sample's size, the mean's pass counts it and the variance's makes the first cells;
        # a size that is not the kept entries' (some dropped, or a wrong hint) falls back to counting
        kept = int(((w > 0) & np.isfinite(v)).sum())  # what the fused pass counts ("dropped": fewer than n)
        for size in (kept, n, n - 1, n + 7, 0):
            assert stats.stats_ms_blocks("itl", blocks, QS, size=size) == expected, (leaf, cells, size)
    got = stats.weighted_percentiles_blocks(blocks, [12.5, 99.9])
    np.testing.assert_array_equal(got, stats.weighted_percentiles(v, w, [12.5, 99.9]))


def test_an_empty_sample_gives_no_numbers() -> None:
    assert set(stats.stats_ms_blocks("itl", lambda: iter([]), [50]).values()) == {None}


def test_a_results_gaps_stay_in_the_stores_until_read() -> None:
    """The summary reads the gaps a block at a time (they are not built); built before or after the
    step frame (which empties the step stores they are rebuilt from), they are the same arrays."""
    res, other = CASES["async_timeout"](), CASES["async_timeout"]()
    s = summarize(res)
    assert isinstance(res.__dict__["_itl_values"], GapTable)
    values, weights = res.itl_values, res.itl_weights  # gaps first, then the steps
    _ = other.steps  # steps first: the gaps are built before the stores are emptied
    np.testing.assert_array_equal(other.itl_values, values)
    np.testing.assert_array_equal(other.itl_weights, weights)
    assert weights.dtype == np.int64 and (weights > 1).any()  # decode runs' step gaps are in the sample
    t = summarize(other)
    for x in (s, t):
        x["meta"].pop("wall_time_s")
    assert s == t


def test_time_weighted_blocks_is_time_weighted() -> None:
    rng = np.random.default_rng(3)
    v, d = rng.integers(0, 300, 5000).astype(np.int16), rng.random(5000)
    cuts = np.sort(rng.integers(0, 5000, 5))
    for dur in (d, np.zeros(5000)):  # no time at all: the plain mean
        def blocks(dur=dur):
            return zip(np.split(v, cuts), np.split(dur, cuts), strict=True)

        x = v.astype(np.float64)  # the whole-array reference: numpy's sums over the whole columns
        want = float((x * dur).sum() / dur.sum()) if dur.sum() > 0 else float(x.mean())
        assert stats.time_weighted_blocks(len(v), blocks) == want
    assert stats.time_weighted_blocks(0, lambda: iter([])) is None


def _gap_sample(kind: str, seed: int, least_tie: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """12,000 weighted gaps (lognormal; ``ties``: 30 values from ``least_tie`` / 100; ``dropped``: zero
    weights and NaNs; ``zeros``: some zero values) and a function giving them in six blocks."""
    rng = np.random.default_rng(seed + len(kind))
    n = 12_000
    v = rng.integers(least_tie, 30, n) * 0.01 if kind == "ties" else np.exp(rng.standard_normal(n) * 2)
    w = rng.integers(1, 30, n)
    if kind == "dropped":
        w[rng.random(n) < 0.1] = 0
        v[rng.random(n) < 0.05] = np.nan
    if kind == "zeros":
        v[rng.random(n) < 0.02] = 0.0
    cuts = np.sort(rng.integers(0, n, 5))

    def blocks():
        return zip(np.split(v, cuts), np.split(w, cuts), strict=True)

    return v, w, blocks


@pytest.mark.parametrize("kind", ["uniform", "ties", "dropped"])
def test_block_ecdf_is_the_reports_ecdf(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's ITL CDF from blocks (sim/app/stats.py ecdf_points) has _ecdf's points, thinned or
    not, with cells split down to single keys and with the default cells; spans_decades pools blocks as
    it pools arrays."""
    import sim.app.report as report
    from sim.app.report_style import spans_decades

    v, w, blocks = _gap_sample(kind, 7, least_tie=0)
    for points in (50, 2000, 100_000):
        monkeypatch.setattr(report, "_MAX_POINTS", points)
        want = report._ecdf(v, w)
        for cells in RADIX:
            _radix(monkeypatch, cells)
            x, cum_w, total = stats.ecdf_points(blocks, points)
            got = (x, stats.ecdf_fractions(cum_w, total))
            for a, b in zip(got, want, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b), (points, cells)
    keep = np.isfinite(v) & (v > 0) & (w > 0)  # the arrays' rule: max over the 1st weighted percentile
    lo = float(stats.weighted_percentiles(v[keep], w[keep], [1.0])[0])
    for ratio in (5.0, 50.0, 1e4, 1e6):
        want = bool(lo > 0 and float(v[keep].max()) / lo > ratio)
        assert spans_decades([(blocks, None)], ratio) == spans_decades([(v, w)], ratio) == want


@pytest.mark.parametrize("kind", ["uniform", "ties", "dropped", "zeros"])
def test_log_axis_from_the_cdf_points_is_spans_decades(kind: str) -> None:
    """The report judges a run's ITL axis from its CDF's points (report_style.decades_from_ecdf): where
    it decides, it is spans_decades' answer, at every ratio around the sample's own values; it leaves
    only ratios next to the 1st percentile undecided, and a sample with non-positive values to
    spans_decades."""
    from sim.app.report_style import decades_from_ecdf, spans_decades

    v, w, blocks = _gap_sample(kind, 11, least_tie=1)
    keep = np.isfinite(v) & (w > 0)
    top = float(v[keep].max())
    ratios = sorted({top / x for x in np.quantile(v[keep & (v > 0)], np.linspace(0, 1, 41))} | {1e-3, 1e9})
    ratios += [np.nextafter(r, 0.0) for r in ratios] + [np.nextafter(r, np.inf) for r in ratios]
    for points in (50, 2000, 100_000):
        pts = stats.ecdf_points(blocks, points)
        decided = [decades_from_ecdf(*pts, ratio=r) for r in ratios]
        if kind == "zeros":
            assert decided == [None] * len(ratios)
            continue
        for r, d in zip(ratios, decided, strict=True):
            assert d is None or d == spans_decades([(blocks, None)], r), (points, r)
        assert sum(d is None for d in decided) <= 9  # at most the ratios around p1 (three of each kind)
        assert decades_from_ecdf(*pts, ratio=1e-3) is True and decades_from_ecdf(*pts, ratio=1e9) is False


def test_the_summary_counts_its_gaps_in_the_mean_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result knows how many gap entries it holds without a pass (``gap_count``), so the summary's ITL
    statistics count the sample in the mean's pass and make the percentiles' first cells in the
    variance's: three passes over the gaps instead of five (four when not told the size), the same
    numbers."""
    import sim.app.rank_select as rank_select

    res = CASES["quickstart"]()
    assert res.gap_count() == sum(len(v) for v, _ in res.gap_blocks()) > 1000
    passes = []
    real = res.gap_blocks
    monkeypatch.setattr(res, "gap_blocks", lambda: (passes.append(1), real())[1])

    def count(**kw):
        passes.clear()
        got = stats.stats_ms_blocks("itl", res.gap_blocks, QS, **kw)
        return got, len(passes)

    fused, told = count(size=res.gap_count())
    plain, untold = count()
    assert plain == fused and untold == told + 1  # defaults (cells split as they need): one pass less
    monkeypatch.setattr(rank_select, "GATHER", 1 << 30)  # no cell split: counting, sums, gathering only
    assert count(size=res.gap_count()) == (fused, 3)  # the mean (counted), the variance (with the cells), the gathering
    assert count() == (fused, 4)  # not told the size: a counting pass first
