"""Replications: the same configuration under independent seeds, and a confidence interval per metric.

Seeds. Replication ``i`` of every configuration uses seed ``base + i`` (``seed_list``): each seed makes
its own ``SeedSequence`` and hence independent streams, and two configurations compared at the same
replication see the same arrivals and lengths (common random numbers), so their difference has less
noise than two unrelated runs (``paired_difference``).

Intervals. A metric's interval is Student's t over the replication means: mean ± t(1−α/2, n−1)·s/√n,
with s the sample standard deviation of the n replication values. It treats each replication's value
(e.g. its P99 TTFT) as one i.i.d. draw; it says nothing with n = 1 (half-width NaN).

Stability. Each run also reports whether its queue grew without bound (``load_stability``): the waiting
queue is fitted against time over the arrival window after a warm-up; a slope above ``SATURATION_SLOPE``
of the offered rate means requests pile up faster than they drain. The thresholds were set on the
quickstart scenario (4 seeds × 400 requests): growth ≤ 0.01 at 90% of the offline throughput, 0.07–0.21
at 110–130%.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from sim.app.config import RunConfig
from sim.app.results import SimResult, summarize
from sim.core.errors import ConfigError

SATURATION_SLOPE = 0.03  # queue growth, as a fraction of the offered rate, that counts as unbounded
MIN_QUEUE = 3.0  # requests: a fitted queue shorter than this at the last arrival is not a trend
WARMUP_FRACTION = 0.2  # of the arrival window, skipped before fitting the backlog trend
DEFAULT_LEVEL = 0.95

SCALAR_METRICS = (
    "duration", "completed", "failed", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")),
    "mean_queue_time_ms", "p99_queue_time_ms", "num_finished", "num_rejected", "num_timed_out", "num_in_flight",
    "num_not_arrived", "num_preemptions", "prefix_cache_hit_rate", "mean_kv_cache_usage",
    "max_kv_cache_usage", "mean_num_running", "mean_num_waiting", "max_num_waiting", "slo_attainment",
    "cost_per_hour", "cost_per_1m_output_tokens", "cost_per_1m_total_tokens", "cost_per_1m_goodput_tokens",
)  # fmt: skip
STABILITY_METRICS = ("offered_rate", "queue_growth", "final_queue", "finished_fraction", "saturated")


MAX_REPLICATIONS = 1000  # seeds per configuration (size, sweep, run --intervals): a 1e9 list is the memory


def check_replications(n: Any) -> int:
    """``--replications`` (size, sweep, run --intervals): an integer from 1 to MAX_REPLICATIONS."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPLICATIONS:
        raise ConfigError(f"--replications: got {n!r}; allowed an integer in [1, {MAX_REPLICATIONS}]")
    return n


def seed_list(base: int, n: int) -> list[int]:
    """The seeds of ``n`` replications; the same list for every configuration compared (CRN)."""
    return [int(base) + i for i in range(check_replications(n))]


def t_interval(values: Iterable[float], level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of the Student-t interval over finite ``values``; NaN bounds when n < 2."""
    if not 0 < level < 1:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


def one_sided_bound(values: Iterable[float], level: float = DEFAULT_LEVEL, upper: bool = True) -> float:
    """The one-sided Student-t bound mean ± t(level, n−1)·s/√n: "the true mean is below this with
    confidence ``level``" (the question an SLO asks); the mean itself when n < 2, NaN when empty."""
    if not 0 < level < 1:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan
    if v.size < 2:
        return float(v.mean())
    half = float(stats.t.ppf(level, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return float(v.mean()) + (half if upper else -half)


def load_stability(result: SimResult, slope: float = SATURATION_SLOPE) -> dict[str, Any]:
    """Does the queue grow without bound? (see module doc).

    The waiting count (the scheduler's queue, sampled from the steps) is fitted against time over the
    arrival window after a warm-up. ``queue_growth`` is the fitted slope over the offered rate: ≈0 for a
    stable queue, ≈1 − capacity/offered once overloaded. Saturated: growth above ``slope`` and a fitted
    queue of at least ``MIN_QUEUE`` at the last arrival (a few queued requests are not a trend). The
    arrived − finished backlog would be the textbook measure, but it includes the running batch, whose
    size swings with output lengths; the waiting queue stays near 0 until the engine is full.
    A closed loop's queue is bounded by its clients, so it never saturates.
    """
    df = result.requests
    arrived = df[df["status"] != "not_arrived"]
    fin = df["status"] == "finished"
    out: dict[str, Any] = {
        "offered_rate": None,
        "queue_growth": None,
        "final_queue": None,
        "finished_fraction": float(fin.sum() / len(arrived)) if len(arrived) else None,
        "saturated": False,
    }
    steps = result.steps
    if len(arrived) < 4 or steps.empty:
        return out
    t_arr = np.sort(arrived["arrival_time"].to_numpy(float))
    t0, t1 = float(t_arr[0]), float(t_arr[-1])
    span = t1 - t0
    if span <= 0:  # everything at once (offline batch): no arrival process to keep up with
        return out
    rate = (len(t_arr) - 1) / span
    grid = np.linspace(t0 + WARMUP_FRACTION * span, t1, 64)
    waiting = np.zeros(grid.size)
    for _, s in steps.groupby("replica", sort=False):
        s = s.sort_values("start", kind="stable")
        idx = np.searchsorted(s["start"].to_numpy(float), grid, side="right") - 1
        waiting += np.where(idx >= 0, s["num_waiting"].to_numpy(float)[np.maximum(idx, 0)], 0.0)
    fit = np.polyfit(grid, waiting, 1)
    growth = float(fit[0]) / rate
    final = float(np.polyval(fit, t1))
    saturated = growth > slope and final >= MIN_QUEUE
    # A run cut by the horizon before finishing most of what arrived did not keep up either.
    if result.horizon is not None and out["finished_fraction"] is not None:
        saturated = saturated or out["finished_fraction"] < 0.9
    out.update(offered_rate=rate, queue_growth=growth, final_queue=final, saturated=bool(saturated))
    return out


def flatten(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar metrics of a summary, plus one ``slo_<key>`` (value) and ``slo_<key>_met`` per
    percentile SLO check, as one flat row."""
    row: dict[str, Any] = {k: summary.get(k) for k in SCALAR_METRICS}
    for key, check in (summary.get("slo_checks") or {}).items():
        row[f"slo_{key}"] = check.get("value")
        row[f"slo_{key}_met"] = bool(check.get("met"))
    return row


def run_one(cfg: RunConfig, seed: int, slo: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One replication: simulate ``cfg`` under ``seed``; its flat metrics, stability and wall time.

    Module-level and fed plain data, so a process pool or Ray can ship it."""
    from sim.app.simulate import simulate  # lazy: keeps this module importable in light workers

    t0 = time.perf_counter()
    cfg = dataclasses.replace(cfg, simulation=dataclasses.replace(cfg.simulation, seed=int(seed)))
    result = simulate(cfg)
    slo = dict(cfg.slo) if slo is None else dict(slo)
    summary = summarize(result, slo=slo or None)
    row = {"seed": int(seed), **flatten(summary), **load_stability(result)}
    row["wall_time_s"] = time.perf_counter() - t0
    return row


def interval_table(
    rows: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    by: Sequence[str] = (),
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Per group of ``by`` columns and per metric: n, mean, std, ci_low, ci_high (Student t, ``level``).

    Booleans (e.g. ``saturated``) become fractions. One row per (group, metric)."""
    if metrics is None:
        metrics = [c for c in rows.columns if c not in (*by, "seed", "replication") and _numeric(rows[c])]
    missing = [m for m in metrics if m not in rows.columns]
    if missing:
        raise ConfigError(f"unknown metric(s) {missing}; available: {', '.join(map(str, rows.columns))}")
    out = []
    groups = rows.groupby(list(by), sort=False, dropna=False) if by else [((), rows)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            col = g[m].map(lambda v: float(v) if isinstance(v, bool | int | float) else v)  # bools → 0/1
            vals = pd.to_numeric(col, errors="coerce").to_numpy(float)
            vals = vals[np.isfinite(vals)]
            mean, lo, hi = t_interval(vals, level)
            out.append(
                {
                    **dict(zip(by, key, strict=True)),
                    "metric": m,
                    "n": int(vals.size),
                    "mean": mean,
                    "std": float(vals.std(ddof=1)) if vals.size > 1 else math.nan,
                    "ci_low": lo,
                    "ci_high": hi,
                    "level": level,
                }
            )
    return pd.DataFrame(out)


def _numeric(col: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)


def paired_difference(
    a: pd.DataFrame, b: pd.DataFrame, metric: str, level: float = DEFAULT_LEVEL
) -> tuple[float, float, float]:
    """(mean, low, high) of ``b − a`` paired by seed: the CRN payoff (the shared noise cancels)."""
    m = a[["seed", metric]].merge(b[["seed", metric]], on="seed", suffixes=("_a", "_b"))
    if m.empty:
        raise ConfigError("paired_difference: the two runs share no seeds (use the same seed list)")
    return t_interval((m[f"{metric}_b"] - m[f"{metric}_a"]).astype(float), level)


def replicate(
    cfg: RunConfig,
    n: int,
    *,
    slo: Mapping[str, float] | None = None,
    jobs: int = 1,
    progress: bool = False,
) -> pd.DataFrame:
    """``n`` replications of one configuration (seeds ``seed_list(cfg.simulation.seed, n)``), one row each."""
    from sim.app.sweep import Task, run_tasks

    tasks = [
        Task(key=(i,), cfg=cfg, seed=s, slo=slo) for i, s in enumerate(seed_list(cfg.simulation.seed, n))
    ]
    rows = run_tasks(tasks, jobs=jobs, progress=progress, label="replications")
    df = pd.DataFrame(rows)
    df.insert(0, "replication", range(len(df)))
    return df
