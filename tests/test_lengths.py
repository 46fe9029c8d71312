"""Length distributions: means and bounds against the CLT, clipping, empirical sampling, config errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sim.core.errors import ConfigError
from workloads.gen.lengths import LengthDist, clip_to_context, load_csv_column

N = 50_000
Z = 4.0  # standard errors


def dist(**cfg) -> LengthDist:
    return LengthDist.from_config(cfg, "prompt")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed_and_bare_int():
    x = dist(dist="fixed", value=128).sample(10, rng())
    assert x.dtype == np.int64 and np.all(x == 128)
    assert LengthDist.from_config(77).sample(3, rng()).tolist() == [77, 77, 77]


def test_uniform_is_inclusive_with_the_right_mean():
    lo, hi = 10, 20
    x = dist(dist="uniform", low=lo, high=hi).sample(N, rng(1))
    assert x.min() == lo and x.max() == hi  # both endpoints occur (P(miss) ≈ 11·(10/11)^N ≈ 0)
    sd = math.sqrt(((hi - lo + 1) ** 2 - 1) / 12)  # discrete uniform
    assert abs(x.mean() - (lo + hi) / 2) < Z * sd / math.sqrt(N)


def test_normal_mean_std_and_rounding():
    d = dist(dist="normal", mean=500, std=50)
    x = d.sample(N, rng(2))
    assert x.dtype == np.int64
    assert abs(x.mean() - 500) < Z * 50 / math.sqrt(N)
    # Rounding adds variance 1/12; sd of the sample sd of a normal is σ/sqrt(2N).
    assert abs(x.std(ddof=1) - math.sqrt(50**2 + 1 / 12)) < Z * 50 / math.sqrt(2 * N)


def test_normal_is_clipped_at_one_by_default():
    x = dist(dist="normal", mean=2, std=10).sample(N, rng(3))
    assert x.min() == 1
    assert (x == 1).mean() > 0.4  # P(round(N(2,10)) <= 1) ≈ 0.48: clipping really happened


def test_lognormal_by_mean_and_std_of_the_length():
    mean, std = 1000.0, 400.0
    x = dist(dist="lognormal", mean=mean, std=std).sample(N, rng(4))
    assert abs(x.mean() - mean) < Z * std / math.sqrt(N)
    # Sample sd: Var(s²) ≈ (μ4 − σ⁴)/N with the lognormal's kurtosis; sd(s) ≈ sd(s²)/(2σ).
    w = 1 + (std / mean) ** 2
    kurt = w**4 + 2 * w**3 + 3 * w**2 - 3  # μ4/σ⁴
    assert abs(x.std(ddof=1) - std) < Z * std * math.sqrt((kurt - 1) / N) / 2


def test_lognormal_by_mu_sigma():
    mu, sigma = 7.0, 0.5
    d = dist(dist="lognormal", mu=mu, sigma=sigma)
    assert d.lognormal_params() == (mu, sigma)
    x = d.sample(N, rng(5))
    # log of the rounded length: rounding moves log x by at most 0.5/x, i.e. < 0.01 for x > 50.
    assert abs(np.log(x).mean() - mu) < Z * sigma / math.sqrt(N) + 1e-3
    assert abs(np.median(x) - math.exp(mu)) < 0.02 * math.exp(mu)


def test_lognormal_moment_conversion_round_trips():
    mu, sigma = dist(dist="lognormal", mean=300, std=150).lognormal_params()
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(300)
    assert math.sqrt((math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2)) == pytest.approx(150)


def test_min_max_clipping():
    x = dist(dist="lognormal", mean=1000, std=800, min=200, max=1500).sample(N, rng(6))
    assert x.min() == 200 and x.max() == 1500  # both bounds bind for this spread
    y = dist(dist="uniform", low=1, high=100, max=50).sample(1000, rng(6))
    assert y.max() == 50


def test_empirical_from_values_resamples_with_replacement():
    vals = [10, 20, 20, 40]
    x = dist(dist="empirical", values=vals).sample(N, rng(7))
    assert set(np.unique(x)) == {10, 20, 40}
    for v, p in [(10, 0.25), (20, 0.5), (40, 0.25)]:
        assert abs((x == v).mean() - p) < Z * math.sqrt(p * (1 - p) / N)
    big = dist(dist="empirical", values=[5, 6]).sample(10, rng(7))
    assert len(big) == 10  # more draws than values: replacement


def test_empirical_values_are_frozen_copies():
    src = np.array([3.0, 4.0])
    d = LengthDist("empirical", values=src)
    src[0] = 1000
    assert d.values.tolist() == [3, 4]
    with pytest.raises(ValueError):
        d.values[0] = 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.dist = "fixed"  # type: ignore[misc]


def test_empirical_from_csv(tmp_path):
    p = tmp_path / "lens.csv"
    p.write_text("ContextTokens,GeneratedTokens\n100,5\n300,0\n200,7\n")
    d = LengthDist.from_config(
        {"dist": "empirical", "csv": "lens.csv", "column": "GeneratedTokens"}, "output", tmp_path
    )
    x = d.sample(1000, rng(8))
    assert set(np.unique(x)) == {1, 5, 7}  # 0 is clipped to min 1
    # some values past max are clipped; all of them past it is refused (the file named)
    assert LengthDist("empirical", values=np.array([10, 90]), max_len=50).sample(200, rng(1)).max() == 50
    with pytest.raises(ConfigError, match=r"values of .*lens\.csv:ContextTokens \[100, 300\] is outside"):
        LengthDist.from_config({"dist": "empirical", "csv": "lens.csv", "column": "ContextTokens", "max": 50},
                               "prompt", tmp_path)
    assert load_csv_column(p, "ContextTokens").tolist() == [100, 300, 200]
    with pytest.raises(ConfigError, match=r"output\.column.*'Nope'.*ContextTokens, GeneratedTokens"):
        LengthDist.from_config({"dist": "empirical", "csv": str(p), "column": "Nope"}, "output")
    bad = tmp_path / "bad.csv"
    bad.write_text("n\n5\nabc\n")
    with pytest.raises(ConfigError, match=r"row 3.*'abc'"):
        LengthDist.from_config({"dist": "empirical", "csv": str(bad), "column": "n"})
    with pytest.raises(ConfigError, match="no such file"):
        LengthDist.from_config({"dist": "empirical", "csv": str(tmp_path / "missing.csv"), "column": "n"})


def test_same_generator_state_same_lengths():
    d = dist(dist="lognormal", mean=800, std=300)
    assert np.array_equal(d.sample(100, rng(9)), d.sample(100, rng(9)))
    assert not np.array_equal(d.sample(100, rng(9)), d.sample(100, rng(10)))


@pytest.mark.parametrize(
    "cfg, match",
    [
        (
            {"dist": "lognormal", "mean": 1, "std": 1, "meen": 3},
            r"prompt: unknown key 'meen'; allowed keys: dist, max",
        ),
        ({"dist": "zipf"}, r"prompt\.dist.*zipf"),
        ({"value": 3}, r"prompt\.dist"),
        ({"dist": "fixed", "value": 0}, r"prompt\.value.*>= 1"),
        ({"dist": "fixed", "value": 2.5}, r"prompt\.value.*integer"),
        ({"dist": "fixed", "value": True}, r"prompt\.value.*integer"),
        ({"dist": "fixed"}, r"prompt\.value: required"),
        ({"dist": "uniform", "low": 5, "high": 4}, r"prompt\.high.*>= 5"),
        ({"dist": "normal", "mean": 5, "std": -1}, r"prompt\.std"),
        ({"dist": "normal", "mean": "big", "std": 1}, r"prompt\.mean.*number"),
        ({"dist": "normal", "mean": math.nan, "std": 1}, r"prompt\.mean.*finite"),
        ({"dist": "lognormal", "mean": 100, "std": 10, "mu": 3, "sigma": 1}, r"prompt: lognormal.*not both"),
        ({"dist": "lognormal", "mean": 100}, r"prompt\.std: required"),
        ({"dist": "lognormal", "mu": 3}, r"prompt\.sigma: required"),
        ({"dist": "lognormal", "mean": 0, "std": 10}, r"prompt\.mean.*> 0"),
        ({"dist": "fixed", "value": 5, "min": 0}, r"prompt\.min"),
        ({"dist": "fixed", "value": 5, "min": 10, "max": 9}, r"prompt\.max.*>= 10"),
        ({"dist": "empirical"}, r"prompt: empirical needs exactly one"),
        ({"dist": "empirical", "values": []}, r"prompt: .*no values"),
        ({"dist": "empirical", "values": [1, "x"]}, r"prompt\.values\[1\]"),
        ({"dist": "empirical", "csv": "a.csv"}, r"prompt\.column: required"),
        # every length outside [min, max]: all clipped to one bound, a fixed length in disguise
        ({"dist": "empirical", "values": [5000, 6000], "max": 4000}, r"values \[5000, 6000\] is outside.*clipped to 4000"),
        ({"dist": "uniform", "low": 10, "high": 20, "min": 30}, r"low\.\.high \[10, 20\] is outside min 30.*clipped to 30"),
        ({"dist": "uniform", "low": 10, "high": 20, "max": 5}, r"clipped to 5"),
    ],
)
def test_config_errors_name_the_field(cfg, match):
    with pytest.raises(ConfigError, match=match):
        LengthDist.from_config(cfg, "prompt")


def test_non_table_config_is_rejected():
    with pytest.raises(ConfigError, match="prompt: expected a table"):
        LengthDist.from_config("lognormal", "prompt")


def test_clip_to_context():
    p, o, changed = clip_to_context(np.array([10, 100, 4000, 5000]), np.array([10, 4000, 10, 10]), 4096)
    assert p.tolist() == [10, 100, 4000, 4095]
    assert o.tolist() == [10, 3996, 10, 1]
    assert changed.tolist() == [False, True, False, True]
    assert np.all(p + o <= 4096)
    with pytest.raises(ConfigError, match="max_model_len"):
        clip_to_context(np.array([5]), np.array([5]), 1)
