"""Real vs simulated, per stage and overall: the numbers behind ``servesim compare``.

Metric names are ``<metric>_<stat>_ms`` (``ttft_mean_ms``, ``e2el_p99_ms``, ``itl_mean_ms``) plus
``request_throughput``, ``output_throughput``, ``completed`` and ``failed``; ``error_pct`` = 100 × (sim /
real − 1), signed (negative: the simulator is faster / lower). Only metrics the run measured are compared.
Simulated values use the same definitions as the real ones (workloads/runs/model.py): TTFT / E2E over the
successful requests, TPOT over those with more than one output token, ITL over the engine's inter-token gaps
(percentiles for single-stage runs; a stage's mean is the token-weighted mean gap), throughput = successes
(and their output tokens) / (last finish − first send) of the stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.app.replay import Replay, prepare, simulate_replay
from sim.app.results import SimResult, time_series
from sim.app.stats import weighted_percentiles
from workloads.runs import LATENCIES, STATS, RealRun, latency_stats, metric_name
from workloads.runs.model import stats_from_requests

SERIES = ("running", "waiting", "kv_cache_pct")


def sim_stats(df: pd.DataFrame, itl: tuple[np.ndarray, np.ndarray] | None = None,
              window: bool = False) -> dict[str, float]:  # fmt: skip
    """The simulated counterparts of a stage's (or the run's) real metrics; ``df`` from simulate_replay.
    ``window``: a capped stage, whose throughput is the completion rate while it was sending (the first N
    requests of a long stage; successes / (last finish − first send) would count its drain-out as idle)."""
    ok = df[df["ok"]]
    out = stats_from_requests(ok.assign(output_len=ok["num_output_tokens"]))
    out.update(latency_stats("queue_time", ok["queue_time"].to_numpy(float)))  # engine-side, always
    if itl is not None and itl[0].size:
        v, w = itl
        qs = weighted_percentiles(v, w, [50, 90, 99])
        out.update({"itl_mean_ms": 1e3 * float(np.average(v, weights=w)),
                    **{metric_name("itl", s): 1e3 * float(q) for s, q in zip(("p50", "p90", "p99"), qs, strict=True)}})
    out["completed"] = float(len(ok))
    out["failed"] = float(df["failed"].sum())
    if len(ok):
        fin = ok["send"] + ok["e2el"]
        span = float(fin.max() - df["send"].min())
        if window and len(df) > 1:
            t0, t1 = float(df["send"].min()), float(df["send"].max())
            inside = ((fin >= t0) & (fin <= t1)).to_numpy()
            if inside.sum() > 1 and t1 > t0:
                first = float(fin[inside].min())
                span = t1 - first
                ok = ok[inside][(fin[inside] > first).to_numpy()]
        if span > 0:
            out["request_throughput"] = len(ok) / span
            out["output_throughput"] = float(ok["num_output_tokens"].sum()) / span
    return out


def weighted_overall(df: pd.DataFrame, run: RealRun, per_stage: list[dict[str, float]]) -> dict[str, float]:
    """The run-wide simulated metrics of a capped replay: each simulated request of stage k stands for
    round(n_real_k / n_sim_k) real ones (so stages weigh as in the real run), throughput = all real requests
    over the time the stages would take at their simulated throughputs. Counts are left out."""
    ok = df[df["ok"]]
    n_sim = df.groupby("stage").size()
    w = ok["stage"].map(lambda k: max(1, round(run.stages[k].num_requests / max(int(n_sim.get(k, 1)), 1))))
    out: dict[str, float] = {}
    out_len = ok["num_output_tokens"].to_numpy(float)
    cols = {"ttft": ok["ttft"], "e2el": ok["e2el"], "tpot": ok["tpot"]}
    for m, col in cols.items():
        v, ww = col.to_numpy(float), w.to_numpy(np.int64)
        keep = np.isfinite(v)
        if keep.any():
            qs = weighted_percentiles(v[keep], ww[keep], [50, 90, 99])
            out[metric_name(m, "mean")] = 1e3 * float(np.average(v[keep], weights=ww[keep]))
            out.update({metric_name(m, s): 1e3 * float(q) for s, q in zip(("p50", "p90", "p99"), qs, strict=True)})
    k = out_len > 1
    span = (ok["e2el"] - ok["ttft"]).to_numpy(float)[k]
    fin = np.isfinite(span)
    if fin.any():
        ww = w.to_numpy(float)[k][fin]
        out["itl_mean_ms"] = 1e3 * float((span[fin] * ww).sum() / ((out_len[k][fin] - 1) * ww).sum())
    time = sum(run.stages[i].num_requests / st["request_throughput"] for i, st in enumerate(per_stage)
               if st.get("request_throughput"))  # fmt: skip
    if time > 0:
        out["request_throughput"] = sum(st.num_requests for st in run.stages) / time
        tok = sum(run.stages[i].num_requests * st["output_throughput"] / st["request_throughput"]
                  for i, st in enumerate(per_stage) if st.get("request_throughput"))  # fmt: skip
        out["output_throughput"] = tok / time
    return out


def compare_metrics(real: dict[str, float], sim: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """{name: {real, sim, error_pct}} for every metric both sides have, in a stable order."""
    order = [metric_name(m, s) for m in (*LATENCIES, "queue_time") for s in STATS] + ["request_throughput",
                                                                                     "output_throughput",
                                                                      "completed", "failed"]  # fmt: skip
    out: dict[str, dict[str, float | None]] = {}
    for k in order:
        if k in real and k in sim:
            r, s = float(real[k]), float(sim[k])
            err = 100.0 * (s / r - 1.0) if r and math.isfinite(r) and math.isfinite(s) else None
            out[k] = {"real": r, "sim": s, "error_pct": err}
    return out


def series_table(real: pd.DataFrame, sim: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per gauge both have: means, MAE and correlation on the real ticks (sim value = its latest tick ≤ t)."""
    out: dict[str, dict[str, float]] = {}
    if real is None or sim is None or sim.empty:
        return out
    st = sim.sort_values("t")
    idx = np.searchsorted(st["t"].to_numpy(float), real["t"].to_numpy(float) + 1e-9, side="right") - 1
    for col in SERIES:
        if col not in real.columns or col not in st.columns:
            continue
        a = real[col].to_numpy(float)
        b = np.where(idx >= 0, st[col].to_numpy(float)[np.maximum(idx, 0)], 0.0)
        ok = np.isfinite(a)
        a, b = a[ok], b[ok]
        if not a.size:
            continue
        corr = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else None
        out[col] = {"real_mean": float(a.mean()), "sim_mean": float(b.mean()), "mae": float(np.abs(a - b).mean()),
                    "corr": corr}  # fmt: skip
    return out


@dataclass
class Comparison:
    """Everything ``servesim compare`` prints or writes."""

    replay: Replay
    sim: pd.DataFrame
    result: SimResult
    stages: list[dict[str, Any]]
    overall: dict[str, dict[str, float | None]]
    timeseries: dict[str, dict[str, float]] = field(default_factory=dict)
    sim_timeseries: pd.DataFrame | None = None

    def to_dict(self) -> dict[str, Any]:
        run = self.replay.run
        return {"run": run.describe(), "settings": self.replay.settings, "clocks": run.clocks,
                "stages": self.stages, "overall": self.overall, "timeseries": self.timeseries}


def compare(run: RealRun, gpu: str | None = None, profile: str | None = None, overrides: list[str] | None = None,
            max_per_stage: int | None = None, rep: Replay | None = None, progress: bool = False) -> Comparison:  # fmt: skip
    """Replay ``run`` and set it against what was measured (see the module doc); ``progress``: a bar."""
    rep = rep or prepare(run, gpu, profile, overrides, max_per_stage)
    df, res = simulate_replay(rep, progress)
    one = len(run.stages) == 1
    itl = (res.itl_values, res.itl_weights) if one else None
    stages, per_stage = [], []
    capped = rep.settings["max_per_stage"] is not None and len(df) < len(run.specs)
    for k, st in enumerate(run.stages):
        d = df[(df["stage"] == k) & ~df["warmup"]]
        sim = sim_stats(d, itl, window=len(d) < st.num_requests)
        if len(d) < st.num_requests:  # a capped stage: its counts are not comparable
            sim = {m: v for m, v in sim.items() if m not in ("completed", "failed")}
        per_stage.append(sim)
        stages.append({"stage": k, "rate": st.rate, "duration_s": st.duration_s, "n_real": st.num_requests,
                       "n_sim": int(len(d)), "metrics": compare_metrics(run.measured[k], sim)})  # fmt: skip
    scored = df[~df["warmup"]]
    whole = weighted_overall(scored, run, per_stage) if capped and len(run.stages) > 1 else \
        {m: v for m, v in sim_stats(scored, (res.itl_values, res.itl_weights), window=capped).items()
         if not capped or m not in ("completed", "failed")}
    overall = compare_metrics(run.overall or run.measured[0], whole)
    sim_ts = time_series(res, 1.0) if run.timeseries is not None else None
    ts = series_table(run.timeseries, sim_ts) if sim_ts is not None else {}
    return Comparison(rep, df, res, stages, overall, ts, sim_ts)


def _fmt(v: float | None, name: str) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    if name.endswith("_ms"):
        return f"{v:.1f}" if abs(v) < 1e4 else f"{v:.0f}"
    return f"{v:.0f}" if name in ("completed", "failed") else f"{v:.2f}"


def format_table(metrics: dict[str, dict[str, float | None]]) -> list[str]:
    lines = [f"  {'metric':22s} {'real':>12s} {'sim':>12s} {'error':>9s}"]
    for k, m in metrics.items():
        err = "-" if m["error_pct"] is None else f"{m['error_pct']:+.1f} %"
        lines.append(f"  {k:22s} {_fmt(m['real'], k):>12s} {_fmt(m['sim'], k):>12s} {err:>9s}")
    return lines


def format_comparison(c: Comparison) -> str:
    run, s = c.replay.run, c.replay.settings
    eng = s["engine"]
    lines = [f"run {run.source} ({run.format}, {run.basis}-side latencies; arrivals {run.arrivals})",
             f"replayed: {s['model']} on {s['gpu']} (profile {s['profile_path']}, {s['profile']}), "
             f"{s['num_gpu_blocks']} KV blocks, max_num_seqs {s['max_num_seqs']}, async_scheduling "
             f"{eng.get('async_scheduling')}, frontend {'on' if s['frontend'] else 'off'}, {s['num_requests']} "
             f"requests" + (f" (first {s['max_per_stage']} per stage)" if s["max_per_stage"] else "")]
    for note in run.notes:
        lines.append(f"note: {note}")
    for st in c.stages:
        if len(c.stages) > 1:
            rate = "-" if st["rate"] is None else f"{st['rate']:g} req/s"
            lines += ["", f"stage {st['stage']} ({rate}, {st['n_real']} real / {st['n_sim']} simulated requests)"]
            lines += format_table(st["metrics"])
    lines += ["", "overall"] + format_table(c.overall)
    scored = c.sim[~c.sim["warmup"]] if "warmup" in c.sim else c.sim
    if len(scored) and "ok" in scored and not scored["ok"].any():  # else an empty table, unexplained
        lines.append(f"note: none of the {len(scored)} simulated requests finished (all failed or timed out, e.g. "
                     "by workload.client_timeout_s): no simulated latencies to compare")
    if c.timeseries:
        lines += ["", f"  {'series':14s} {'real mean':>10s} {'sim mean':>10s} {'MAE':>8s} {'corr':>6s}"]
        for k, v in c.timeseries.items():
            corr = "-" if v["corr"] is None else f"{v['corr']:.3f}"
            lines.append(f"  {k:14s} {v['real_mean']:10.1f} {v['sim_mean']:10.1f} {v['mae']:8.1f} {corr:>6s}")
    return "\n".join(lines)
