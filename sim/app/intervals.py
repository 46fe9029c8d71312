"""Prediction intervals: where the *real* value of a summary figure should fall, not just the simulated mean.

Two sources of uncertainty, combined on the log scale (docs/intervals.md has the derivation):

* replication spread: n replications (seeds) give ln values y₁…yₙ, mean ȳ, sd s_rep (the workload's own
  randomness: arrivals, lengths, prompt assignment);
* calibration: the profile's residuals e₁…e_K = ln(sim / real) on the real runs it was fitted to
  (``metadata.calibration.residuals_log``, written by ``servesim fit --from-run``): the exact metric's (P99
  TTFT's own) when there are at least three, else pooled per family (TTFT, E2E, ITL/TPOT); mean b, sd s_cal.

The predicted real value is exp(ȳ − b) and its interval exp(ȳ − b ± t·σ) with σ² = s_rep²(1 + 1/n) +
s_cal²(1 + 1/K) (a new run's own noise plus the uncertainty of the replication mean; a new run's calibration
error plus the uncertainty of b) and t the Student quantile at the Welch–Satterthwaite degrees of freedom.
A family without residuals (throughput, or a profile not fitted on runs) gets the replication term only, and
says so (``calibrated: false``).

``upper_prediction_bound`` is the one-sided version an SLO check uses ("the real P99 TTFT is below this with
probability ``level``"): ``servesim size`` can judge SLOs on it (hook: sim/app/sizing.py ``judge`` calls
``one_sided_bound(vals, level)``; with ``upper_prediction_bound(vals, calibration_residuals(profile, key), level)``
instead, a candidate passes only if the calibrated bound meets the target).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from sim.core.errors import ConfigError
from sim.cost.profiles import CalibrationProfile

DEFAULT_LEVEL = 0.90
FAMILIES = {"ttft": "ttft", "e2el": "e2el", "itl": "itl", "tpot": "itl"}  # TPOT ≈ the mean ITL per request


def family(key: str) -> str | None:
    """'ttft_p99_ms', 'mean_ttft_ms', 'ttft_p99' (an SLO key) -> 'ttft'; throughputs -> None."""
    for part in key.split("_"):
        if part in FAMILIES:
            return FAMILIES[part]
    return None


_STAT_WORDS = {"mean": "mean", "median": "p50", "p50": "p50", "p90": "p90", "p99": "p99"}
MIN_EXACT = 3  # residuals of the exact metric needed before they are used alone


def metric_key(key: str) -> str | None:
    """'p99_ttft_ms' (summary), 'ttft_p99' (SLO), 'ttft_p99_ms' -> 'ttft_p99_ms' (the runs' spelling)."""
    parts = key.removesuffix("_ms").split("_")
    fam = next((p for p in parts if p in FAMILIES), None)
    stat = next((_STAT_WORDS[p] for p in parts if p in _STAT_WORDS), None)
    return f"{fam}_{stat}_ms" if fam and stat else None


def calibration_residuals(profile: CalibrationProfile | None, key: str) -> np.ndarray:
    """The profile's ln(sim / real) residuals for ``key``: the exact metric's when there are at least
    MIN_EXACT of them (tails err differently from means), else pooled over its family (empty when none)."""
    fam = family(key)
    cal = ((profile.metadata or {}).get("calibration") or {}).get("residuals_log") if profile else None
    if fam is None or not isinstance(cal, Mapping):
        return np.zeros(0)
    exact = np.asarray(cal.get(metric_key(key) or "", []), float)
    exact = exact[np.isfinite(exact)]
    if exact.size >= MIN_EXACT:
        return exact
    vals = [v for m, vs in cal.items() if family(m) == fam for v in vs]
    a = np.asarray(vals, float)
    return a[np.isfinite(a)]


def _terms(values: Iterable[float], residuals: Sequence[float]) -> tuple[float, float, float, float, int, int]:
    """(ȳ, b, σ, dof, n, K) on the log scale (see the module doc)."""
    y = np.log([v for v in values if v is not None and np.isfinite(v) and v > 0])
    e = np.asarray(residuals, float)
    e = e[np.isfinite(e)]
    n, k = len(y), len(e)
    if n == 0:
        return math.nan, 0.0, math.nan, math.nan, 0, k
    s_rep = float(y.std(ddof=1)) if n > 1 else 0.0
    b = float(e.mean()) if k else 0.0
    s_cal = float(e.std(ddof=1)) if k > 1 else (abs(b) if k == 1 else 0.0)
    v_rep = s_rep**2 * (1 + 1 / n)
    v_cal = s_cal**2 * (1 + 1 / k) if k else 0.0
    var = v_rep + v_cal
    parts = [(v_rep, n - 1), (v_cal, k - 1 if k > 1 else 1)]
    denom = sum(v**2 / d for v, d in parts if v > 0 and d > 0)
    dof = var**2 / denom if denom > 0 else math.inf
    return float(y.mean()), b, math.sqrt(var), dof, n, k


def prediction_interval(values: Iterable[float], residuals: Sequence[float] = (),
                        level: float = DEFAULT_LEVEL) -> dict[str, Any]:  # fmt: skip
    """The two-sided ``level`` interval of the real value (module doc): center, low, high and its terms."""
    if not 0 < level < 1:
        raise ConfigError(f"interval level must be in (0, 1), got {level}")
    vals = list(values)
    ybar, b, sigma, dof, n, k = _terms(vals, residuals)
    out = {"sim_mean": float(np.mean([v for v in vals if v is not None and np.isfinite(v)])) if n else math.nan,
           "n_replications": n, "n_calibration": k, "calibrated": k > 0, "bias_log": b, "sigma_log": sigma,
           "level": level}  # fmt: skip
    if n == 0:
        return {**out, "center": math.nan, "low": math.nan, "high": math.nan}
    center = math.exp(ybar - b)
    if not sigma > 0:  # one replication and no residuals: nothing to say about the spread
        return {**out, "center": center, "low": math.nan if n < 2 and k == 0 else center,
                "high": math.nan if n < 2 and k == 0 else center}  # fmt: skip
    t = float(stats.t.ppf(0.5 + level / 2, dof)) if math.isfinite(dof) else float(stats.norm.ppf(0.5 + level / 2))
    return {**out, "center": center, "low": _exp(ybar - b - t * sigma), "high": _exp(ybar - b + t * sigma)}


def _exp(x: float) -> float:
    """exp, inf past a float's range: a high level on two replications (t of thousands) gives an interval
    that is honestly unbounded, not an OverflowError after the runs."""
    return math.exp(x) if x < 709.0 else math.inf


def upper_prediction_bound(values: Iterable[float], residuals: Sequence[float] = (),
                           level: float = DEFAULT_LEVEL) -> float:  # fmt: skip
    """One-sided: the real value is below this with probability ``level`` (for SLO checks)."""
    ybar, b, sigma, dof, n, _ = _terms(values, residuals)
    if n == 0:
        return math.nan
    if not sigma > 0:
        return math.exp(ybar - b)
    t = float(stats.t.ppf(level, dof)) if math.isfinite(dof) else float(stats.norm.ppf(level))
    return _exp(ybar - b + t * sigma)


SUMMARY_KEYS = (
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")),
    "request_throughput", "output_throughput",
)  # fmt: skip


def interval_table(rows: pd.DataFrame, profile: CalibrationProfile | None, level: float = DEFAULT_LEVEL,
                   keys: Sequence[str] = SUMMARY_KEYS) -> pd.DataFrame:  # fmt: skip
    """One row per summary key: simulated mean, predicted real value and its interval (``rows``: one row per
    replication, sim/app/replicate.py)."""
    out = []
    for key in keys:
        if key not in rows.columns:
            continue
        res = calibration_residuals(profile, key)
        pi = prediction_interval(pd.to_numeric(rows[key], errors="coerce").tolist(), res, level)
        out.append({"metric": key, **pi})
    return pd.DataFrame(out)


def coverage_study(runs: Sequence[Path], profiles: Sequence[Path], gpu: str, max_per_stage: int | None,
                   seeds: Sequence[int] = (0, 1, 2), level: float = DEFAULT_LEVEL) -> list[str]:  # fmt: skip
    """Leave-one-run-out coverage: run i is replayed (``seeds``: the importer's seed draws the prompt order /
    Poisson gaps) with the profile fitted without it; how often does its real value fall inside the interval?
    Markdown lines for bench/fit_folds.py."""
    from sim.app.compare import sim_stats
    from sim.app.replay import prepare, simulate_replay
    from sim.app.runfit import targets_of
    from workloads.runs import RUN_FORMATS, sniff_run

    keys = ("ttft_mean_ms", "ttft_p90_ms", "ttft_p99_ms", "e2el_mean_ms", "e2el_p90_ms", "e2el_p99_ms", "itl_mean_ms")
    rows = []
    for path, prof_path in zip(runs, profiles, strict=True):
        prof = CalibrationProfile.load(prof_path)
        fmt = sniff_run(path)
        sims: dict[tuple[int, str], list[float]] = {}
        run = None
        for seed in seeds:
            run = RUN_FORMATS[fmt](path, seed=seed)
            rep = prepare(run, gpu, str(prof_path), [], max_per_stage, seed=seed)
            df, res = simulate_replay(rep)
            for k in range(len(run.stages)):
                st = sim_stats(df[(df["stage"] == k) & ~df["warmup"]], None, window=True)
                for m in keys:
                    sims.setdefault((k, m), []).append(st.get(m, math.nan))
        fitted = {k for k, _ in targets_of(run)}
        for (k, m), vals in sims.items():
            real = run.measured[k].get(m)
            if real is None or k not in fitted:
                continue
            for label, resid in (("replication + calibration", calibration_residuals(prof, m)),
                                 ("replication only", ())):  # fmt: skip
                pi = prediction_interval(vals, resid, level)
                inside = bool(pi["low"] <= real <= pi["high"]) if np.isfinite(pi["low"]) else False
                rows.append({"run": Path(path).name, "stage": k, "metric": m, "real": real, "kind": label,
                             "low": pi["low"], "high": pi["high"], "center": pi["center"], "inside": inside})
    df = pd.DataFrame(rows)
    md = ["## Coverage of the 90 % prediction interval (leave one run out)", "",
          f"Each run replayed with seeds {list(seeds)} (prompt order) using the profile fitted on the other three "
          "(its calibration residuals); stages whose clients gave up are left out. Inside = the real value lies "
          "in [low, high].", "", "| interval | checks | inside | coverage | median width (% of real) |",
          "|---|---|---|---|---|"]  # fmt: skip
    for kind, g in df.groupby("kind", sort=False):
        width = float(np.nanmedian(100 * (g["high"] - g["low"]) / g["real"]))
        md.append(f"| {kind} | {len(g)} | {int(g['inside'].sum())} | {100 * g['inside'].mean():.0f} % | {width:.1f} |")
    md += ["", "| run | stage | metric | real | predicted | 90 % interval | inside |", "|---|---|---|---|---|---|---|"]
    for r in df[df["kind"] == "replication + calibration"].itertuples():
        md.append(f"| {r.run} | {r.stage} | {r.metric} | {r.real:.1f} | {r.center:.1f} | [{r.low:.1f}, {r.high:.1f}] | "
                  f"{'yes' if r.inside else 'no'} |")
    return md
