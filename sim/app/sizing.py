"""Deployment sizing: the ``max_num_seqs`` (and other engine settings) that sustain the most load under
latency SLOs, found by bracketing and bisection on the offered load, with replications.

The seeds' method (seeds/000, §1): fix the SLO first (interactive chat: P99 TTFT ≤ 1 s, P99 TPOT ≤ 50 ms),
then push load as far as the SLO allows, judging by P99, never the mean. For each candidate setting:

1. **offline run** (every request at t = 0): the most the setting can serve, μ_max (req/s). This is also
   the answer to the offline-batch goal (``goal = "throughput"``) and the top of the bracket.
2. **bracket**: try μ_max; while it meets the SLOs double it (a loose SLO; past ``MAX_OVERLOAD`` μ_max the
   finite workload drains before it can overload anything, so the capacity is reported as a lower bound),
   else halve until a load meets them (none within 2⁻¹⁰ μ_max: capacity 0).
3. **bisect** between the last passing and first failing load until they are within ``rel_tol``.

"Meets the SLOs" is decided robustly over the replications (common random numbers: the same seeds at
every load and for every candidate): for each percentile SLO (``p99_ttft_ms = 1000``: ms) the *upper*
one-sided Student-t bound (confidence ``level``) of the per-replication percentile must be under the
target; for each per-request SLO (``ttft_ms = 1000``) the *lower* one-sided bound of the attainment must
reach ``min_attainment``; and at most half of the replications may show a queue growing without bound
(``sim.app.replicate.load_stability``). With one replication the point estimates decide. Each replication's
own capacity on the loads tried gives a t-interval for the capacity itself (``capacity_ci``).

The load knob depends on the workload: ``rate`` (open loop, req/s); a trace is searched in req/s too, with
replication r replaying window r of the trace (``num_requests`` consecutive requests) rate-scaled to the
load, since a replay does not depend on the seed; sessions' ``rate`` (conversations/s; req/s = × mean
turns); or ``num_clients`` (closed loop: bisection on integers, reported as concurrency). Candidates advance in
lockstep so one batch of simulations covers every candidate's next probe (parallel with ``jobs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.app.config import RunConfig
from sim.app.intervals import upper_prediction_bound
from sim.app.replicate import DEFAULT_LEVEL, one_sided_bound, seed_list, t_interval
from sim.app.results import parse_slo
from sim.app.sizing_report import CandidateResult, Evaluation, SizingResult, Verdict
from sim.app.sweep import Task, check_key, default_jobs, run_tasks, with_params
from sim.core.errors import ConfigError

OFFLINE_SCALE = 1e12  # rate_scale that puts a whole trace at t ≈ 0
MAX_HALVINGS = 10
MIN_TOL = 1e-6  # the narrowest --tol: far past any useful answer; near 1e-16 the bracket never closes (a hang)
MAX_OVERLOAD = 4.0  # stop doubling past this multiple of the offline throughput: the run is too short
GOALS = ("slo", "throughput", "knee")
CURVE_METRICS = (
    "request_throughput", "request_goodput", "output_throughput", "median_ttft_ms", "p90_ttft_ms",
    "p99_ttft_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "p99_e2el_ms", "mean_num_waiting",
    "mean_kv_cache_usage", "num_preemptions",
)  # fmt: skip


# ---- the load knob -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadKnob:
    """Which workload key sets the load, and how a value of it converts to requests per second.

    A trace is searched in req/s directly: replication r replays window ``windows[r]`` (``start``/``end``
    options of the loader) scaled by ``x / window_rates[r]``, so every window is offered the same rate.
    """

    key: str  # "rate" | "rate_scale" | "num_clients"
    per_unit: float | None  # req/s per unit of the search variable; None: a closed loop's concurrency
    unit: str
    windows: tuple[dict[str, float], ...] = ()
    window_rates: tuple[float, ...] = ()

    @property
    def integer(self) -> bool:
        return self.key == "num_clients"

    def apply(self, cfg: RunConfig, x: float, replication: int = 0) -> RunConfig:
        wl = dict(cfg.workload)
        if self.key == "rate_scale":
            wl.pop("time_scale", None)
            if self.windows:
                wl.update(self.windows[replication])
                x = x if math.isinf(x) else x / self.window_rates[replication]
        if math.isinf(x) and self.key == "rate_scale":
            x = OFFLINE_SCALE
        wl[self.key] = int(x) if self.integer else float(x)
        return dataclasses.replace(cfg, workload=wl)

    def offline(self, cfg: RunConfig, replication: int = 0) -> RunConfig:
        return self.apply(cfg, math.inf, replication)

    def req_rate(self, x: float) -> float | None:
        return None if self.per_unit is None else x * self.per_unit


def detect_knob(cfg: RunConfig, replications: int = 1) -> LoadKnob:
    """The load knob of ``cfg``'s workload; builds the workload once where the conversion needs it."""
    wl = cfg.workload
    kind = wl.get("kind", "trace" if "trace" in wl else "open")
    if kind == "open":
        return LoadKnob("rate", 1.0, "req/s")
    if kind == "closed" or (kind == "sessions" and "num_clients" in wl):
        return LoadKnob("num_clients", None, "clients")
    if kind == "sessions":
        from sim.app.simulate import resolve
        from workloads.synthetic import build_workload

        w = build_workload({**wl, "rate": 1.0}, seed=cfg.simulation.seed,
                           max_model_len=resolve(cfg).limits.max_model_len)  # fmt: skip
        return LoadKnob("rate", float(w.mean_turns), "sessions/s")
    if kind == "trace":
        return _trace_knob(cfg, replications)
    raise ConfigError(f"workload.kind {kind!r}: sizing needs an open, closed, trace or sessions workload")


def _trace_knob(cfg: RunConfig, replications: int) -> LoadKnob:
    """Consecutive windows of ``num_requests`` requests (default: the trace split evenly), one per
    replication: a trace is one sample path, so its windows stand in for independent seeds."""
    from sim.app.simulate import resolve
    from workloads.synthetic import build_workload

    wl = cfg.workload
    n = cfg.simulation.num_requests if cfg.simulation.num_requests is not None else wl.get("num_requests")
    base = {k: v for k, v in wl.items() if k not in ("time_scale", "rate_scale", "num_requests")}
    w = build_workload(base, seed=cfg.simulation.seed, max_model_len=resolve(cfg).limits.max_model_len)
    times = np.sort(np.array([s.arrival_time for s in w.specs], dtype=float))
    per = int(n) if n is not None else len(times) // replications
    if per < 2 or per * replications > len(times):
        raise ConfigError(
            f"workload.trace: {len(times)} requests cannot make {replications} windows of "
            f"{per} requests (lower num_requests or --replications)"
        )
    offset = float(wl.get("start", 0.0) or 0.0)
    windows, rates = [], []
    for r in range(replications):
        t = times[r * per : (r + 1) * per]
        if t[-1] <= t[0]:
            raise ConfigError(
                f"workload.trace: window {r} has all its arrivals at one instant; no rate to scale"
            )
        end = times[(r + 1) * per] if (r + 1) * per < len(times) else np.nextafter(t[-1], np.inf)
        windows.append({"start": offset + float(t[0]), "end": offset + float(end), "num_requests": per})
        rates.append((per - 1) / float(t[-1] - t[0]))
    return LoadKnob("rate_scale", 1.0, "req/s", tuple(windows), tuple(rates))


# ---- SLO checks ----------------------------------------------------------------------------------
def judge(
    rows: pd.DataFrame,
    slo: Mapping[str, float],
    level: float = DEFAULT_LEVEL,
    min_attainment: float = 0.99,
    calibration: Callable[[str], Sequence[float]] | None = None,
) -> Verdict:
    """Robust SLO decision over the replications ``rows`` (module doc). ``calibration``: a percentile
    SLO's calibration residuals (sim/app/intervals.py); given, the bound is the upper prediction bound of
    the *real* value (replication spread + calibration error), not the t-bound of the simulated one."""
    per_request, pct = parse_slo(slo)
    checks: dict[str, dict[str, Any]] = {}
    ok = True
    for key, (_, _, target) in pct.items():
        col = rows.get(f"slo_{key}")
        vals = [] if col is None else list(col)
        missing = any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals) or not vals
        mean, lo, hi = t_interval(vals, level) if not missing else (math.nan,) * 3
        if missing:
            bound = math.nan
        elif calibration is not None:
            bound = upper_prediction_bound(vals, calibration(key), level)
        else:
            bound = one_sided_bound(vals, level)
        met = (not missing) and bound <= target
        checks[key] = {"target": target, "mean": mean, "ci_low": lo, "ci_high": hi, "bound": bound,
                       "margin": (target - bound) / target if target > 0 and math.isfinite(bound) else None,
                       "met": bool(met)}  # fmt: skip
        ok &= met
    if per_request:
        vals = [v for v in rows.get("slo_attainment", []) if v is not None]
        mean, lo, hi = t_interval(vals, level)
        bound = one_sided_bound(vals, level, upper=False)
        met = bool(vals) and bound >= min_attainment
        checks["attainment"] = {"target": min_attainment, "mean": mean, "ci_low": lo, "ci_high": hi,
                                "bound": bound, "margin": bound - min_attainment if vals else None,
                                "met": bool(met)}  # fmt: skip
        ok &= met
    sat = float(np.mean([bool(v) for v in rows["saturated"]])) if "saturated" in rows else 0.0
    ok &= sat <= 0.5
    return Verdict(bool(ok), checks, sat)


# ---- the search ----------------------------------------------------------------------------------
@dataclass
class Search:
    """Bracket-then-bisect state for one candidate; ``next_load`` None means done."""

    knob: LoadKnob
    rel_tol: float
    goal: str
    phase: str = "offline"
    lo: float | None = None  # highest load that met the SLOs
    hi: float | None = None  # lowest load that did not
    top: float | None = None  # offline capacity in knob units
    halvings: int = 0
    x0: float = 8.0  # closed loop: first concurrency tried

    def next_load(self) -> float | None:
        if self.phase == "offline":
            return math.inf
        if self.phase == "once":  # one run at the configured load (the knee of a closed loop)
            return self.x0
        if self.phase == "done":
            return None
        if self.lo is None:
            if self.hi is None:
                return self.x0 if self.knob.integer else self.top
            nxt = self.hi / 2
            if self.knob.integer:
                nxt = math.floor(nxt)
                return None if nxt < 1 else nxt
            return nxt
        if self.hi is None:
            return self.lo * 2
        if self.knob.integer:
            if self.hi - self.lo <= max(1, math.floor(self.rel_tol * self.lo)):
                return None
            return (self.lo + self.hi) // 2
        if (self.hi - self.lo) <= self.rel_tol * self.hi:
            return None
        return (self.lo + self.hi) / 2

    def record(self, x: float, passed: bool, offline_throughput: float | None = None) -> None:
        if self.phase == "once":
            self.lo, self.phase = x, "done"
            return
        if self.phase == "offline":
            if self.goal in ("throughput", "knee"):
                self.phase = "done"
                return
            if offline_throughput is None or not offline_throughput > 0:
                self.phase = "done"  # nothing finished even with unlimited time to queue
                return
            self.top = offline_throughput / self.knob.per_unit if self.knob.per_unit else None
            self.phase = "search"
            return
        if passed:
            self.lo = x
        else:
            self.hi = x
            if self.lo is None:
                self.halvings += 1
        if self.lo is None and self.halvings > MAX_HALVINGS:
            self.phase = "done"
        ceiling = self.top * MAX_OVERLOAD if self.top else 2**MAX_HALVINGS
        if self.lo is not None and self.hi is None and self.lo >= ceiling:
            self.phase = "done"  # the SLO never binds: a finite workload drains before it can overload
        if self.next_load() is None:
            self.phase = "done"


# ---- candidates ----------------------------------------------------------------------------------
def default_max_num_seqs(cfg: RunConfig, limit: int = 6) -> list[int]:
    """Powers of two from 8 up to twice the KV concurrency for the workload's mean context (the
    seeds' "budget ÷ per-request KV" rule, seeds/000 §3), at most ``limit`` of them (the largest kept)."""
    from sim.app.simulate import resolve
    from workloads.synthetic import build_workload

    setup = resolve(cfg)
    try:
        wl = dict(cfg.workload)
        if cfg.simulation.num_requests is not None:
            wl["num_requests"] = cfg.simulation.num_requests
        w = build_workload(wl, seed=cfg.simulation.seed, max_model_len=setup.limits.max_model_len)
        if hasattr(w, "specs"):
            ctx = float(np.mean([s.prompt_len + s.output_len for s in w.specs]))
        else:
            ctx = float(np.mean(np.asarray(w.prompt_lens) + np.asarray(w.output_lens)))
    except (AttributeError, TypeError, ValueError):
        ctx = float(setup.limits.max_model_len) / 2
    conc = setup.limits.num_gpu_blocks * setup.limits.block_size / max(ctx, 1.0)
    top = min(512, 2 ** math.ceil(math.log2(max(2 * conc, 8))))
    seqs = [2**k for k in range(0 if limit > 6 else 3, int(math.log2(top)) + 1)]  # a knee curve starts at 1
    return seqs[-limit:]


def candidate_grid(
    cfg: RunConfig, max_num_seqs: Sequence[int] | None, vary: Mapping[str, Sequence[Any]] | None,
    limit: int = 6,
) -> list[dict[str, Any]]:
    """Every combination of the engine settings to compare (``max_num_seqs`` first)."""
    if max_num_seqs is not None and (isinstance(max_num_seqs, str | bytes | Mapping)
                                     or not hasattr(max_num_seqs, "__iter__")):
        raise ConfigError(f"max_num_seqs: expected a list of integers (e.g. [8, 16, 32]) or None, got "
                          f"{type(max_num_seqs).__name__}")
    # a range or a numpy array too; numpy's integers as the ints they are
    seqs = [s.item() if type(s).__module__ == "numpy" else s for s in max_num_seqs or ()] if not isinstance(
        max_num_seqs, np.ndarray) else max_num_seqs.tolist()
    if not seqs:
        seqs = default_max_num_seqs(cfg, limit=limit)
    for s in seqs:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ConfigError(f"--max-num-seqs: expected integers >= 1, got {s!r}")
    axes: dict[str, Sequence[Any]] = {"engine.max_num_seqs": seqs}
    for key, values in (vary or {}).items():
        parts = check_key(key, "--vary")
        if parts[0] not in ("engine", "model", "hardware"):
            raise ConfigError(f"--vary {key}: only engine, model or hardware settings can be searched")
        if key == "engine.max_num_seqs":  # the search's own axis (vary's keys are distinct already)
            vals = ",".join(map(str, values))
            raise ConfigError(f"--vary {key}={vals}: the search's own axis; allowed: --max-num-seqs {vals}")
        if key in axes:
            raise ConfigError(f"--vary {key}: given twice")
        axes[key] = list(values)
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(axes[k] for k in keys))]


# ---- driver --------------------------------------------------------------------------------------
def size(
    cfg: RunConfig,
    slo: Mapping[str, float] | None = None,
    *,
    max_num_seqs: Sequence[int] | None = None,
    vary: Mapping[str, Sequence[Any]] | None = None,
    goal: str = "slo",
    replications: int = 3,
    level: float = DEFAULT_LEVEL,
    rel_tol: float = 0.05,
    min_attainment: float = 0.99,
    jobs: int | None = 1,
    progress: bool = False,
    knee_gain: float = 0.1,
    calibration: Callable[[str], Sequence[float]] | None = None,
) -> SizingResult:
    """Search every candidate setting for its capacity under ``slo`` (default: the config's [slo]);
    recommend the one with the highest capacity (ties within ``rel_tol``: the smallest max_num_seqs, the
    one that leaves memory for the length tail). ``goal="throughput"``: the offline runs only, ranked by
    output tokens/s (the offline-batch goal: no latency SLO). ``goal="knee"``: the same runs (a closed
    loop: one run at its clients) over max_num_seqs from 1, and the knee of that curve (sim/app/knee.py,
    ``knee_gain`` per doubling). ``jobs``: processes (None: every CPU). ``calibration``: judge the SLOs on
    prediction intervals of the real value (see ``judge``)."""
    from sim.app.knee import check_gain, knee_index, sizing_knees

    t0 = time.perf_counter()
    check_gain(knee_gain)
    slo = dict(cfg.slo if slo is None else slo)
    knob, seeds, notes = prepare(cfg, slo, goal, rel_tol, replications)
    limit = 10 if goal == "knee" else 6
    cands = [CandidateResult(p) for p in candidate_grid(cfg, max_num_seqs, vary, limit=limit)]
    cfgs = [with_params(cfg, c.params) for c in cands]
    nsim = run_searches(cands, cfgs, knob, seeds, slo, goal=goal, rel_tol=rel_tol, level=level,
                        min_attainment=min_attainment, jobs=jobs, progress=progress, calibration=calibration,
                        fixed_loads=[cfg.workload.get("num_clients")] * len(cands)
                        if goal == "knee" and knob.per_unit is None else None)  # fmt: skip
    notes += capacity_notes(cands, knob, goal)
    rec = recommend(cands, goal, rel_tol)
    knees = sizing_knees(cands, knee_gain) if goal == "knee" else []
    if goal == "knee":
        rec = knee_index(cands, knees)
    from sim.app.report_style import run_label

    return SizingResult(knob, slo, goal, cands, rec, len(seeds), level, nsim, time.perf_counter() - t0,
                        notes=notes, knees=knees, knee_gain=knee_gain, label=run_label(cfg.to_dict()))  # fmt: skip


def prepare(
    cfg: RunConfig, slo: Mapping[str, float], goal: str, rel_tol: float, replications: int
) -> tuple[LoadKnob, list[int], list[str]]:
    """Check the search's inputs before any simulation; its load knob, seeds and first notes."""
    if goal not in GOALS:
        raise ConfigError(f"--goal {goal!r}: expected one of {', '.join(GOALS)}")
    if not (isinstance(rel_tol, int | float) and MIN_TOL <= rel_tol < 1):
        raise ConfigError(f"--tol: out of range, got {rel_tol}; allowed {MIN_TOL:g} <= value < 1")
    parse_slo(slo)  # bad keys/values fail before any simulation
    if goal == "slo" and not slo:
        raise ConfigError("no SLO: give --slo NAME:MS (e.g. p99_ttft:1000) or [slo] in the config, "
                          "or --goal throughput")  # fmt: skip
    seeds = seed_list(cfg.simulation.seed, replications)
    knob = detect_knob(cfg, replications)
    notes: list[str] = []
    if knob.windows:
        w0, w1 = knob.windows[0], knob.windows[-1]
        notes.append(
            f"trace replay: replication r replays window r of {w0['num_requests']} consecutive requests "
            f"(t = {w0['start']:.0f}..{w1['end']:.0f} s of the trace), each rate-scaled to the offered load"
        )
    if goal == "throughput" and knob.per_unit is None:
        raise ConfigError("--goal throughput needs an open-loop, trace or open sessions workload")
    if knob.unit == "sessions/s":
        notes.append(
            f"sessions: the load is conversations started per second; req/s = x {knob.per_unit:.2f} mean turns "
            "is the long-run rate, reached only when the run is long compared with one conversation"
        )
    return knob, seeds, notes


def run_searches(
    cands: Sequence[CandidateResult],
    cfgs: Sequence[RunConfig],
    knob: LoadKnob,
    seeds: Sequence[int],
    slo: Mapping[str, float],
    *,
    goal: str = "slo",
    rel_tol: float = 0.05,
    level: float = DEFAULT_LEVEL,
    min_attainment: float = 0.99,
    jobs: int | None = 1,
    progress: bool = False,
    runners: Sequence[Any] | None = None,
    fixed_loads: Sequence[float] | None = None,
    calibration: Callable[[str], Sequence[float]] | None = None,
) -> int:
    """Search every candidate (its config ``cfgs[i]``, run by ``runners[i]``: None = one engine) in
    lockstep; fills each candidate's evaluations, bracket and capacity. Returns the simulations run.
    ``fixed_loads``: no search, one evaluation of candidate i at load ``fixed_loads[i]`` (knob units)."""
    searches = [Search(knob, rel_tol, goal) for _ in cands]
    for i, srch in enumerate(searches):
        if knob.per_unit is None:
            srch.phase = "search"
        if fixed_loads is not None:
            srch.phase, srch.x0 = "once", float(fixed_loads[i])
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        nsim = _search(cands, cfgs, searches, knob, seeds, slo, level, min_attainment, pool, progress, runners,
                       calibration)
    finally:
        if pool is not None:
            pool.shutdown()
    for c, srch in zip(cands, searches, strict=True):
        c.bracket = (srch.lo, srch.hi)
        c.capacity = srch.lo if srch.lo is not None else (0.0 if goal == "slo" else None)
    return nsim


def capacity_notes(cands: Sequence[CandidateResult], knob: LoadKnob, goal: str) -> list[str]:
    """A note per candidate whose capacity is only a lower bound (the SLO never bound)."""
    return [
        f"{_fmt_params(c.params)} still meets the SLOs at the highest load tried ({c.bracket[0]:.4g} {knob.unit}): "
        "the workload is too small to overload it, so its capacity is a lower bound (add requests)"
        for c in cands
        if goal == "slo" and c.bracket[0] is not None and c.bracket[1] is None
    ]


def _search(cands, cfgs, searches, knob, seeds, slo, level, min_attainment, pool, progress, runners=None,
            calibration=None) -> int:
    """Advance every candidate's search in lockstep until all are done; returns the simulations run."""
    nsim = 0
    while True:
        todo = [(i, s.next_load()) for i, s in enumerate(searches) if s.phase != "done"]
        todo = [(i, x) for i, x in todo if x is not None]
        if not todo:
            break
        tasks = []
        for i, x in todo:
            run = runners[i] if runners else None
            tasks += [Task((i, x, r), knob.apply(cfgs[i], x, r), s, slo, run) for r, s in enumerate(seeds)]
        rows = run_tasks(tasks, jobs=1, pool=pool, progress=progress, label=f"size: {len(todo)} loads")
        nsim += len(tasks)
        for j, (i, x) in enumerate(todo):
            chunk = pd.DataFrame(rows[j * len(seeds) : (j + 1) * len(seeds)])
            if "error" in chunk.columns and chunk["error"].notna().any():
                raise ConfigError(f"candidate {cands[i].params}: {chunk['error'].dropna().iloc[0]}")
            verdict = judge(chunk, slo, level, min_attainment, calibration)
            metrics = {m: t_interval(chunk[m], level) for m in CURVE_METRICS if m in chunk}
            offline = math.isinf(x)
            each = [judge(chunk.iloc[[r]], slo, level, min_attainment, calibration).passed
                    for r in range(len(chunk))]
            cands[i].evaluations.append(
                Evaluation(x, None if offline else knob.req_rate(x), verdict, metrics, offline, each)
            )
            top = metrics.get("request_throughput", (None,))[0] if offline else None
            searches[i].record(x, verdict.passed, top)
    return nsim


def _fmt_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in params.items())


def recommend(cands: Sequence[CandidateResult], goal: str, rel_tol: float) -> int | None:
    if goal == "knee":
        return None  # sim/app/knee.py picks it
    if goal == "throughput":
        vals = [c.offline.metrics["output_throughput"][0] if c.offline else -1.0 for c in cands]
    else:
        vals = [c.capacity or 0.0 for c in cands]
    if not cands or max(vals) <= 0:
        return None
    best = max(vals)
    near = [i for i, v in enumerate(vals) if v >= best * (1 - rel_tol)]
    return min(near, key=lambda i: (cands[i].params.get("engine.max_num_seqs", 0), -vals[i]))
