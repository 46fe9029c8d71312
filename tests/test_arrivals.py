"""Arrival processes: vLLM-bench semantics, moments against the CLT, reproducibility, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from sim.core.errors import ConfigError
from workloads.gen.arrivals import ArrivalConfig, constant, gamma, make_arrivals, poisson

N = 20_000
Z = 4.0  # tolerance in standard errors: a seeded test, but the bound must hold for any seed w.p. ~1 - 6e-5


def gaps_of(times: np.ndarray) -> np.ndarray:
    """Gaps counting the first one from t = 0, as vLLM's delays do."""
    return np.diff(np.concatenate([[0.0], times]))


def cv_standard_error(shape: float, n: int) -> float:
    """Delta-method standard error of the sample CV (std/mean) of n Gamma(shape) draws.

    Gamma(k, 1): mean k, variance k, third central moment 2k, fourth 3k² + 6k. ĉ = sqrt(s²)/m, so
    Var ĉ ≈ g' Σ g / n with g = (∂/∂m, ∂/∂s²) = (−σ/m², 1/(2σm)), Σ = [[σ², μ3], [μ3, μ4 − σ⁴]].
    (For k = 1 this is exactly 1/n.)
    """
    m, var, mu3, mu4 = shape, shape, 2 * shape, 3 * shape**2 + 6 * shape
    sd = math.sqrt(var)
    gm, gs = -sd / m**2, 1 / (2 * sd * m)
    return math.sqrt((gm * gm * var + 2 * gm * gs * mu3 + gs * gs * (mu4 - var**2)) / n)


def test_poisson_gaps_mean_cv_and_shape():
    rate = 5.0
    t = poisson(rate, N, np.random.default_rng(1), rescale=False)
    g = gaps_of(t)
    assert np.all(g > 0) and np.all(np.diff(t) >= 0)
    # Mean gap 1/rate; exponential std = mean, so the standard error of the mean is (1/rate)/sqrt(N).
    assert abs(g.mean() - 1 / rate) < Z * (1 / rate) / math.sqrt(N)
    assert abs(g.std(ddof=1) / g.mean() - 1.0) < Z * cv_standard_error(1.0, N)
    # And the whole shape, not only two moments.
    assert stats.kstest(g, "expon", args=(0, 1 / rate)).pvalue > 1e-3


@pytest.mark.parametrize("b", [0.25, 0.5, 2.0, 4.0])
@pytest.mark.parametrize("rescale", [False, True])
def test_gamma_cv_is_one_over_sqrt_burstiness(b, rescale):
    rate = 3.0
    g = gaps_of(gamma(rate, N, np.random.default_rng(7), b, rescale=rescale))
    cv = g.std(ddof=1) / g.mean()
    # Rescaling makes the gaps a scaled Dirichlet: CV² = (N−1)/(N·b+1), which differs from 1/b by O(1/N).
    expected = math.sqrt((N - 1) / (N * b + 1)) if rescale else 1 / math.sqrt(b)
    assert abs(cv - expected) < Z * cv_standard_error(b, N)
    assert abs(g.mean() - 1 / rate) < Z * (1 / rate) / math.sqrt(b * N)


@pytest.mark.parametrize("b", [0.3, 1.0, 5.0])
def test_rescale_puts_last_arrival_at_n_over_rate(b):
    # engines.md §6 item 12: for fixed N and rate the last arrival is at exactly N/rate.
    for n, rate in [(1, 2.0), (10, 0.7), (1000, 12.5)]:
        t = gamma(rate, n, np.random.default_rng(n), b)
        assert t[-1] == n / rate
        assert np.all(np.diff(t) >= 0)
        assert t[0] > 0  # the first request also waits its own gap (vLLM sleeps before sending it)
        assert gaps_of(t).mean() == pytest.approx(1 / rate, rel=1e-12)


def test_rescale_only_scales_the_plain_process():
    raw = poisson(2.0, 50, np.random.default_rng(3), rescale=False)
    scaled = poisson(2.0, 50, np.random.default_rng(3))
    np.testing.assert_allclose(scaled, raw * (25.0 / raw[-1]), rtol=1e-12)


def test_infinite_rate_sends_everything_at_zero_and_infinite_burstiness_is_constant():
    rng = np.random.default_rng(0)
    assert np.array_equal(poisson(math.inf, 5, rng), np.zeros(5))
    assert np.array_equal(make_arrivals("constant", math.inf, 3, rng), np.zeros(3))
    np.testing.assert_allclose(gamma(4.0, 8, rng, math.inf), constant(4.0, 8))


def test_constant_spacing():
    t = constant(4.0, 5)
    np.testing.assert_allclose(t, [0.25, 0.5, 0.75, 1.0, 1.25])
    assert len(constant(1.0, 0)) == 0


def test_changing_rate_scales_times_exactly():
    # Common random numbers across a rate sweep: same seed, times ∝ 1/rate.
    for b in (1.0, 0.5):
        for rescale in (True, False):
            t1 = gamma(1.0, 200, np.random.default_rng(11), b, rescale=rescale)
            t8 = gamma(8.0, 200, np.random.default_rng(11), b, rescale=rescale)
            np.testing.assert_allclose(t8, t1 / 8.0, rtol=1e-12)


def test_seeds_are_reproducible_and_distinct():
    a = gamma(2.0, 100, np.random.default_rng(5), 0.5)
    b = gamma(2.0, 100, np.random.default_rng(5), 0.5)
    c = gamma(2.0, 100, np.random.default_rng(6), 0.5)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_make_arrivals_and_config_match_the_functions():
    assert np.array_equal(
        make_arrivals("gamma", 3.0, 40, np.random.default_rng(2), burstiness=0.4),
        gamma(3.0, 40, np.random.default_rng(2), 0.4),
    )
    assert np.array_equal(
        make_arrivals("poisson", 3.0, 40, np.random.default_rng(2)),
        poisson(3.0, 40, np.random.default_rng(2)),
    )
    assert np.array_equal(make_arrivals("constant", 3.0, 4, np.random.default_rng(2)), constant(3.0, 4))
    cfg = ArrivalConfig("gamma", 3.0, 0.4, rescale=False)
    assert np.array_equal(
        cfg.sample(40, np.random.default_rng(2)), gamma(3.0, 40, np.random.default_rng(2), 0.4, rescale=False)
    )
    assert len(poisson(1.0, 0, np.random.default_rng(0))) == 0
    with pytest.raises(AttributeError):
        cfg.rate = 4.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda r: poisson(0.0, 5, r), "rate"),
        (lambda r: poisson(-1.0, 5, r), "rate"),
        (lambda r: poisson(math.nan, 5, r), "rate"),
        (lambda r: poisson("fast", 5, r), "rate"),
        (lambda r: constant(0.0, 5), "rate"),
        (lambda r: poisson(1.0, -1, r), "n"),
        (lambda r: poisson(1.0, 2.5, r), "n"),
        (lambda r: gamma(1.0, 5, r, 0.0), "burstiness"),
        (lambda r: gamma(1.0, 5, r, -2.0), "burstiness"),
        (lambda r: gamma(1.0, 5, r, math.nan), "burstiness"),
        (lambda r: make_arrivals("poisson", 1.0, 5, r, burstiness=2.0), "burstiness"),
        (lambda r: make_arrivals("weibull", 1.0, 5, r), "kind"),
    ],
)
def test_bad_arguments_raise_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError, match=field):
        call(np.random.default_rng(0))
