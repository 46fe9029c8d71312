"""Replications: seeds (common random numbers), Student-t intervals, stability, flat rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sim.app.config import config_from_dict
from sim.app.replicate import (
    interval_table,
    load_stability,
    paired_difference,
    replicate,
    run_one,
    seed_list,
    t_interval,
)
from sim.app.simulate import simulate
from sim.core.errors import ConfigError

# Constant 20 ms steps, 4 slots, 100-token prompts (one prefill step) and 50-token outputs: a slot
# serves one request per ~51 steps ≈ 1.02 s, so capacity ≈ 4 / 1.02 ≈ 3.9 req/s.
RAW = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "24GB"},
    "engine": {"max_model_len": 4096, "overhead_gib": 1.5, "cost_model": "constant",
               "constant_step_s": 0.02, "max_num_seqs": 4},
    "workload": {"rate": 2.0, "num_requests": 200, "prompt": {"dist": "fixed", "value": 100},
                 "output": {"dist": "fixed", "value": 50}},
    "slo": {"p99_ttft_ms": 500, "ttft_ms": 200},
}  # fmt: skip


def cfg_at(rate: float, **engine):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in RAW.items()}
    raw["workload"] = {**RAW["workload"], "rate": rate}
    raw["engine"] = {**RAW["engine"], **engine}
    return config_from_dict(raw)


def test_t_interval_is_students_t():
    x = [1.0, 2.0, 4.0, 7.0]
    mean, lo, hi = t_interval(x, 0.9)
    ref = stats.t.interval(0.9, df=3, loc=np.mean(x), scale=stats.sem(x))
    assert mean == pytest.approx(3.5) and (lo, hi) == pytest.approx(ref)
    m1, lo1, hi1 = t_interval([5.0])
    assert m1 == 5.0 and math.isnan(lo1) and math.isnan(hi1)
    assert all(math.isnan(v) for v in t_interval([]))
    assert t_interval([1.0, None, float("nan"), 3.0])[0] == 2.0
    with pytest.raises(ConfigError, match="confidence level"):
        t_interval(x, 1.5)


def test_t_interval_covers_the_mean_at_its_level_even_for_three_replications():
    # a z-interval would cover only ~80% with n = 3; the t-interval keeps 95%
    rng = np.random.default_rng(0)
    samples = rng.normal(10.0, 3.0, size=(4000, 3))
    hits = 0
    for row in samples:
        _, lo, hi = t_interval(row, 0.95)
        hits += lo <= 10.0 <= hi
    assert 0.93 < hits / len(samples) < 0.97


def test_seed_list_is_the_same_for_every_configuration():
    assert seed_list(7, 3) == [7, 8, 9]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="replications"):
            seed_list(0, bad)


def test_replications_are_independent_and_reproducible():
    df = replicate(cfg_at(2.0), 3)
    assert list(df["seed"]) == [0, 1, 2] and list(df["replication"]) == [0, 1, 2]
    assert df["mean_ttft_ms"].nunique() == 3  # different seeds, different arrivals
    again = run_one(cfg_at(2.0), 1)
    assert again["mean_ttft_ms"] == df.loc[1, "mean_ttft_ms"]
    # percentile SLO checks and attainment come along as flat columns
    assert {"slo_p99_ttft_ms", "slo_p99_ttft_ms_met", "slo_attainment", "saturated", "wall_time_s"} <= set(
        df.columns
    )


def test_stability_flags_only_the_overloaded_queue():
    ok = load_stability(simulate(cfg_at(2.0)))
    over = load_stability(simulate(cfg_at(8.0)))
    assert not ok["saturated"] and abs(ok["queue_growth"]) < 0.03
    assert over["saturated"] and over["queue_growth"] > 0.3  # ≈ 1 − 3.9/8
    assert over["offered_rate"] == pytest.approx(8.0, rel=0.05)
    offline = load_stability(simulate(cfg_at(math.inf)))
    assert not offline["saturated"] and offline["queue_growth"] is None


def test_interval_table_and_paired_difference():
    rows = pd.DataFrame({"seed": [0, 1, 2, 0, 1, 2], "cfg": ["a"] * 3 + ["b"] * 3,
                         "x": [1.0, 2.0, 3.0, 1.5, 2.5, 3.5], "flag": [True, False, False, True, True, True]})  # fmt: skip
    tab = interval_table(rows, ["x", "flag"], by=["cfg"])
    a = tab[(tab["cfg"] == "a") & (tab["metric"] == "x")].iloc[0]
    assert a["n"] == 3 and a["mean"] == 2.0 and a["ci_low"] < 2.0 < a["ci_high"]
    assert tab[(tab["cfg"] == "b") & (tab["metric"] == "flag")]["mean"].iloc[0] == 1.0
    mean, lo, hi = paired_difference(rows[rows.cfg == "a"], rows[rows.cfg == "b"], "x")
    # a constant shift: with CRN the paired interval has zero width, the unpaired one would not
    assert mean == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="unknown metric"):
        interval_table(rows, ["nope"])
