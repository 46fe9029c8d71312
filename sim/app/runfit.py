"""``servesim fit --from-run``: fit engine-level terms to real runs by bounded least squares on the replay.

Parameters (each as u = ln(θ / θ₀), θ₀ the GPU's shipped profile or the ``[frontend]`` prior, bounded):

* ``step_overhead_s``, ``per_seq_overhead_s``: the engine's per-step CPU cost (profile fields);
* ``gemm_scale`` multiplies ``eta_compute`` and ``eta_bandwidth`` (the GEMM family), ``attention_scale``
  ``eta_kv`` and ``eta_fa`` (the attention family), each kept ≤ 1 after scaling;
* client-side runs only: ``request_overhead_s`` (the input path, docs/frontend.md) and
  ``output_s_per_request`` (the output path per row of a step).

Residuals: for every (run, stage) whose clients did not give up (failed < 1 %), ln(sim / real) / 0.05 of
TTFT mean and P90, E2E mean and P90 and ITL mean (what the run measured of these), so a 5 % error costs 1;
plus one prior row per parameter, u / ln 3 (a factor of 3 away from the shipped value costs 1), which keeps
the terms the data cannot tell apart near where they started. ``scipy.optimize.least_squares`` (trf, bounds,
2-point Jacobian with 5 % steps: the replay is deterministic, so the objective is a function of θ alone, but
piecewise: scheduling decisions flip). Each replay keeps the first ``max_per_stage`` requests per stage.

Separability is reported, not assumed: from the Jacobian at the optimum, sd(u) = sqrt(diag((JᵀJ)⁻¹));
a parameter whose sd stays above 0.7 of its prior's (ln 3) is "held by the prior": these runs do not
constrain it (e.g. a constant step overhead against a GEMM efficiency when all stages decode the same shapes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from sim.app.compare import sim_stats
from sim.app.frontend import FrontendConfig
from sim.app.progress import bar
from sim.app.replay import Replay, prepare, simulate_replay, with_profile
from sim.core.errors import ConfigError
from sim.cost.hardware import get_gpu
from sim.cost.profiles import MIN_EFFICIENCY, CalibrationProfile, get_profile
from workloads.runs import RealRun

TARGETS = ("ttft_mean_ms", "ttft_p90_ms", "e2el_mean_ms", "e2el_p90_ms", "itl_mean_ms")
# Recorded at the optimum for the prediction intervals (sim/app/intervals.py), fitted or not: the tails too,
# whose errors differ from the means'.
RESIDUAL_METRICS = (*(f"{m}_{s}_ms" for m in ("ttft", "e2el") for s in ("mean", "p50", "p90", "p99")),
                    "itl_mean_ms", "tpot_mean_ms")  # fmt: skip
TOL = 0.05  # a 5 % error = one unit of residual
PRIOR_SD = math.log(3.0)
SATURATED_FAILED = 0.01


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "profile" | "scale" | "frontend"
    lo: float  # bounds on θ (scale: on the factor)
    hi: float
    fields: tuple[str, ...] = ()


PARAMS = (
    Param("step_overhead_s", "profile", 5e-6, 5e-3, ("step_overhead_s",)),
    Param("per_seq_overhead_s", "profile", 1e-8, 1e-4, ("per_seq_overhead_s",)),
    Param("gemm_scale", "scale", 0.3, 1.0, ("eta_compute", "eta_bandwidth")),
    Param("attention_scale", "scale", 0.3, 1.0, ("eta_kv", "eta_fa")),
    Param("request_overhead_s", "frontend", 1e-5, 0.05, ("request_overhead_s",)),
    Param("output_s_per_request", "frontend", 1e-7, 1e-3, ("output_s_per_request",)),
)


@dataclass
class FitResult:
    profile: CalibrationProfile
    frontend: FrontendConfig | None
    params: dict[str, dict[str, Any]]
    errors: list[dict[str, Any]]  # per run, stage, metric: real, shipped, fitted (error %)
    notes: list[str] = field(default_factory=list)
    residuals: dict[str, list[float]] = field(default_factory=dict)  # metric -> ln(sim/real) at the optimum
    wall_s: float = 0.0
    nfev: int = 0


def targets_of(run: RealRun, metrics: Sequence[str] = TARGETS) -> list[tuple[int, str]]:
    """(stage, metric) pairs the fit uses: stages whose clients did not give up, metrics they measured."""
    out = []
    for k, m in enumerate(run.measured):
        failed, done = m.get("failed", 0.0), m.get("completed", 0.0)
        if done + failed and failed / (done + failed) > SATURATED_FAILED:
            continue
        out += [(k, t) for t in metrics if m.get(t)]
    return out


def _theta0(base: CalibrationProfile, fe: FrontendConfig | None, client: bool) -> list[tuple[Param, float, float]]:
    """(param, θ₀, upper bound) for the parameters this fit can move."""
    out = []
    for p in PARAMS:
        if p.kind == "frontend":
            if not client or fe is None:
                continue
            out.append((p, getattr(fe, p.fields[0]), p.hi))
        elif p.kind == "scale":
            out.append((p, 1.0, min(1.0 / getattr(base, f) for f in p.fields)))
        else:
            out.append((p, max(getattr(base, p.fields[0]), p.lo), p.hi))
    return out


def apply_theta(base: CalibrationProfile, fe: FrontendConfig | None, spec: list[tuple[Param, float, float]],
                theta: Sequence[float]) -> tuple[CalibrationProfile, FrontendConfig | None]:  # fmt: skip
    prof_kw: dict[str, float] = {}
    fe_kw: dict[str, float] = {}
    for (p, _, _), v in zip(spec, theta, strict=True):
        if p.kind == "frontend":
            fe_kw[p.fields[0]] = float(v)
        elif p.kind == "scale":
            # an efficiency stays in the profile's range (a base at the fit's 2 % floor scaled by 0.3 is not)
            prof_kw.update({f: max(MIN_EFFICIENCY, min(1.0, getattr(base, f) * float(v))) for f in p.fields})
        else:
            prof_kw[p.fields[0]] = float(v)
    new_fe = dataclasses.replace(fe, **fe_kw) if fe is not None and fe_kw else fe
    return dataclasses.replace(base, **prof_kw), new_fe


def stage_errors(rep: Replay, targets: list[tuple[int, str]]) -> dict[tuple[int, str], float]:
    """ln(sim / real) per (stage, metric) of one replay (NaN where the simulation has no value)."""
    df, res = simulate_replay(rep)
    out = {}
    one = len(rep.run.stages) == 1
    for k in sorted({k for k, _ in targets}):
        d = df[(df["stage"] == k) & ~df["warmup"]]
        sim = sim_stats(d, (res.itl_values, res.itl_weights) if one else None, window=True)
        for kk, m in targets:
            if kk == k:
                s, r = sim.get(m, math.nan), rep.run.measured[k][m]
                out[(k, m)] = math.log(s / r) if s and s > 0 and r > 0 else math.nan
    return out


def fit_runs(runs: Sequence[RealRun], gpu: str | None, profile: str | None = None,
             overrides: Sequence[str] = (), max_per_stage: int | None = 200, max_nfev: int = 30,
             log: Callable[[str], None] = lambda m: None, progress: bool = False) -> FitResult:  # fmt: skip
    """Fit on ``runs`` (see the module doc); every replay is prepared (and bad input refused) first.
    ``progress``: a bar over the fit's evaluations (each replays every run)."""
    if not runs:
        raise ConfigError("servesim fit --from-run: give at least one run")
    reps = [prepare(r, gpu, profile, list(overrides), max_per_stage) for r in runs]
    gpus = {rep.cfg.hardware.gpu for rep in reps}
    if len(gpus) > 1:
        raise ConfigError(f"the runs were on different GPUs ({', '.join(sorted(gpus))}): fit one GPU at a time")
    base = get_profile(get_gpu(gpus.pop()), None if not profile or profile == "auto" else profile)
    client = any(r.basis == "client" for r in runs)
    fe0 = next((rep.cfg.frontend for rep in reps if rep.cfg.frontend is not None), None)
    if client and fe0 is None:
        fe0 = FrontendConfig()
    targets = [targets_of(r) for r in runs]
    notes = [f"{r.source}: stage {k} left out (clients gave up: failed {m.get('failed', 0):.0f} of "
             f"{m.get('failed', 0) + m.get('completed', 0):.0f})" for r in runs
             for k, m in enumerate(r.measured) if k not in {kk for kk, _ in targets_of(r)}]  # fmt: skip
    if not any(targets):
        raise ConfigError("no stage of these runs can be fitted (every stage had clients giving up, or no TTFT / "
                          "E2E / ITL measured)")
    spec = _theta0(base, fe0, client)
    lo = np.array([math.log(p.lo / t0) for p, t0, _ in spec])
    hi = np.array([math.log(h / t0) for p, t0, h in spec])
    hi = np.maximum(hi, lo + 1e-9)
    x0 = np.clip(np.zeros(len(spec)), lo, hi)
    keys = [(i, k, m) for i, t in enumerate(targets) for k, m in t]
    cache: dict[bytes, np.ndarray] = {}

    evals = bar(None, "fit", enabled=progress, unit="eval")

    def errors_at(u: np.ndarray) -> np.ndarray:
        key = np.round(u, 12).tobytes()
        if key not in cache:
            evals.update(1)
            prof, fe = apply_theta(base, fe0, spec, [t0 * math.exp(x) for (_, t0, _), x in zip(spec, u, strict=True)])
            errs: dict[tuple[int, int, str], float] = {}
            for i, rep in enumerate(reps):
                if not targets[i]:  # nothing to fit in this run (every stage overloaded): do not replay it
                    continue
                for (k, m), e in stage_errors(with_profile(rep, prof, fe if rep.cfg.frontend else None),
                                              targets[i]).items():  # fmt: skip
                    errs[(i, k, m)] = e
            cache[key] = np.array([errs[x] for x in keys])
        return cache[key]

    def fun(u: np.ndarray) -> np.ndarray:
        e = errors_at(u)
        e = np.where(np.isfinite(e), e, 2.0)  # a metric the replay lost (nothing finished) is a large error
        return np.concatenate([e / TOL, u / PRIOR_SD])

    t_start = time.perf_counter()
    e_before = errors_at(x0)
    log(f"shipped profile: RMS ln-error {np.sqrt(np.nanmean(e_before ** 2)):.3f} over {len(keys)} targets")
    sol = least_squares(fun, x0, bounds=(lo, hi), method="trf", diff_step=0.05, max_nfev=max_nfev, x_scale=1.0)
    e_after = errors_at(sol.x)
    evals.close()
    log(f"fitted: RMS ln-error {np.sqrt(np.nanmean(e_after ** 2)):.3f} ({sol.nfev} evaluations, "
        f"{time.perf_counter() - t_start:.0f} s)")
    theta = [t0 * math.exp(x) for (_, t0, _), x in zip(spec, sol.x, strict=True)]
    prof, fe = apply_theta(base, fe0, spec, theta)
    try:
        cov = np.linalg.pinv(sol.jac.T @ sol.jac)
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:  # pragma: no cover - pinv does not raise on finite input
        sd = np.full(len(spec), math.nan)
    params = {p.name: {"value": v, "start": t0, "lower": p.lo if p.kind != "scale" else p.lo,
                       "upper": h, "sd_log": float(s), "held_by_prior": bool(s > 0.7 * PRIOR_SD),
                       "at_bound": bool(abs(x - lb) < 1e-6 or abs(x - ub) < 1e-6)}
              for (p, t0, h), v, s, x, lb, ub in zip(spec, theta, sd, sol.x, lo, hi, strict=True)}  # fmt: skip
    errors: list[dict[str, Any]] = []
    residuals: dict[str, list[float]] = {}
    for rep, r in zip(reps, runs, strict=True):  # one more replay per run: every metric's residual at the optimum
        t_all = targets_of(r, RESIDUAL_METRICS)
        if t_all:
            for (_, m), e in stage_errors(with_profile(rep, prof, fe if rep.cfg.frontend else None), t_all).items():
                if np.isfinite(e):
                    residuals.setdefault(m, []).append(float(e))
    for j, (i, k, m) in enumerate(keys):
        real = runs[i].measured[k][m]
        errors.append({"run": str(runs[i].source), "stage": k, "metric": m, "real": real,
                       "shipped_error_pct": 100 * (math.exp(e_before[j]) - 1) if np.isfinite(e_before[j]) else None,
                       "fitted_error_pct": 100 * (math.exp(e_after[j]) - 1) if np.isfinite(e_after[j]) else None})
    return FitResult(prof, fe, params, errors, notes, residuals, time.perf_counter() - t_start, int(sol.nfev))


def evaluate(runs: Sequence[RealRun], gpu: str | None, profile: str | None, overrides: Sequence[str] = (),
             max_per_stage: int | None = 200) -> list[dict[str, Any]]:  # fmt: skip
    """Held-out errors: (run, stage, metric, real, sim error %) of ``runs`` replayed with ``profile``."""
    out = []
    for r in runs:
        rep = prepare(r, gpu, profile, list(overrides), max_per_stage)
        t = [(k, m) for k, mm in enumerate(r.measured) for m in TARGETS if mm.get(m)]
        for (k, m), e in stage_errors(rep, t).items():
            out.append({"run": str(r.source), "stage": k, "metric": m, "real": r.measured[k][m],
                        "error_pct": 100 * (math.exp(e) - 1) if np.isfinite(e) else None,
                        "saturated": (k, m) not in set(targets_of(r))})  # fmt: skip
    return out


def fitted_profile(res: FitResult, runs: Sequence[RealRun], command: str, max_per_stage: int | None) -> CalibrationProfile:
    """The profile JSON ``fit --from-run`` writes: what it was fitted on, the fitted front end and the
    calibration residuals the prediction intervals use (sim/app/intervals.py)."""
    meta = dict(res.profile.metadata or {})
    meta.update({
        "fitted_from_runs": [{"source": str(r.source), "format": r.format, "stages": len(r.stages),
                              "stages_fitted": sorted({k for k, _ in targets_of(r)}), "model": r.model}
                             for r in runs],
        "fit_command": command, "fit_method": "scipy.optimize.least_squares (trf, bounds) on the replay; "
                                              "sim/app/runfit.py",
        "fit_max_per_stage": max_per_stage, "fit_params": res.params, "fit_notes": res.notes,
        "calibration": {"residuals_log": res.residuals, "targets": list(RESIDUAL_METRICS),
                        "what": "ln(sim / real) per (run, stage) at the fitted values"},
        "base_profile": {"gpu": res.profile.gpu, "description": res.profile.description},
    })  # fmt: skip
    if res.frontend is not None:
        meta["frontend"] = {k: v for k, v in dataclasses.asdict(res.frontend).items() if k != "enabled"}
    names = ", ".join(r.name for r in runs)
    return dataclasses.replace(res.profile, source="fitted", metadata=meta,
                               description=f"{res.profile.gpu}: engine terms fitted to real runs ({names}) by "
                                           f"servesim fit --from-run, from: {res.profile.description[:200]}")
