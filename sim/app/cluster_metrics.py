"""Cluster results: per-replica and per-class rows on top of the cluster-wide summary, the load-balance
figure, text tables and output files. Pure pandas/plotly over a SimResult whose rows carry a replica.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.app.outputs import write_outputs
from sim.app.plotlyjs import PlotlyJS, as_plotlyjs, write_figure
from sim.app.results import SimResult, request_metrics, summarize, time_series, to_jsonable

REPLICA_COLUMNS = (
    "replica",
    "name",
    "pool",
    "role",
    "gpu",
    "tensor_parallel_size",
    "num_gpu_blocks",
    "requests_served",
    "num_rejected",
    "num_in_flight",
    "utilization",
    "mean_num_running",
    "mean_kv_cache_usage",
    "max_kv_cache_usage",
    "num_preemptions",
    "prefix_cache_hit_rate",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
)
COMPARE_KEYS = (
    "num_gpus",
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "request_goodput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "mean_kv_cache_usage",
    "prefix_cache_hit_rate",
    "num_preemptions",
    "load_imbalance",
    "cost_per_hour",
    "cost_per_1m_output_tokens",
    "cost_per_1m_goodput_tokens",
)


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) * 1000.0 if x.size else None


def replica_rows(result: SimResult) -> pd.DataFrame:
    """One row per replica: requests served, utilisation (busy fraction of the run), KV usage over the
    run (idle time counts as empty), preemptions, prefix hit rate, output tokens/s and latencies of the
    requests it answered (for P/D: the decode replica answers, so its TTFT includes prefill + transfer)."""
    meta = result.meta.get("replicas") or [{"replica": 0, "name": "r0"}]
    df = request_metrics(result.requests)
    steps = result.steps
    arrived = df.loc[df["status"] != "not_arrived", "arrival_time"]
    t0 = float(arrived.min()) if len(arrived) else 0.0
    t1 = float((steps["start"] + steps["duration"]).max()) if len(steps) else t0
    span = max(t1 - t0, 1e-12)
    rows = []
    for m in meta:
        i = m["replica"]
        mine = df[df["replica"] == i]
        if m.get("role") == "prefill" and "prefill_replica" in df:  # its work: the prompts it computed
            mine = df[(df["prefill_replica"] == i) & (df["replica"] == i)]
        fin = mine[mine["status"] == "finished"]
        st = steps[steps["replica"] == i]
        dur = st["duration"].to_numpy(float)
        pc = m.get("prefix_cache") or {}
        rows.append(
            {
                "replica": i,
                "name": m.get("name"),
                "pool": m.get("pool"),
                "role": m.get("role"),
                "gpu": m.get("gpu"),
                "tensor_parallel_size": m.get("tensor_parallel_size"),
                "num_gpu_blocks": m.get("num_gpu_blocks"),
                "requests_served": len(fin) if m.get("role") != "prefill" else int(m.get("num_prefilled", 0)),
                "num_rejected": int((mine["status"] == "rejected").sum()),
                "num_in_flight": int((mine["status"] == "in_flight").sum()),
                "utilization": float(dur.sum() / span),
                "mean_num_running": float((st["num_running"].to_numpy(float) * dur).sum() / span),
                "mean_kv_cache_usage": float((st["kv_usage"].to_numpy(float) * dur).sum() / span),
                "max_kv_cache_usage": float(st["kv_usage"].max()) if len(st) else 0.0,
                "num_preemptions": int(m.get("num_preemptions", st["num_preempted"].sum())),
                "prefix_cache_hit_rate": pc["hits"] / pc["queries"] if pc.get("queries") else None,
                "output_throughput": float(fin["num_output_tokens"].sum() / span),
                "median_ttft_ms": _pct(fin["ttft_s"].to_numpy(float), 50),
                "p99_ttft_ms": _pct(fin["ttft_s"].to_numpy(float), 99),
                "median_tpot_ms": _pct(fin["tpot_s"].to_numpy(float), 50),
                "p99_tpot_ms": _pct(fin["tpot_s"].to_numpy(float), 99),
            }
        )
    return pd.DataFrame(rows, columns=list(REPLICA_COLUMNS))


def class_rows(result: SimResult, by: str = "priority", threshold: int | None = None) -> pd.DataFrame:
    """Latency per request class: a requests column (``priority``, ``pool``) or, with ``threshold``,
    ``short``/``long`` by prompt + output tokens -- what a latency queue or a long pool buys each class."""
    df = request_metrics(result.requests)
    if threshold is not None:
        by = "length_class"
        df[by] = np.where(df["prompt_len"] + df["output_len"] > threshold, "long", "short")
    rows = []
    for key, g in df.groupby(by, sort=True):
        fin = g[g["status"] == "finished"]
        rows.append(
            {
                by: key,
                "num_requests": len(g),
                "completed": len(fin),
                "num_rejected": int((g["status"] == "rejected").sum()),
                "mean_prompt_len": float(g["prompt_len"].mean()),
                "median_ttft_ms": _pct(fin["ttft_s"].to_numpy(float), 50),
                "p99_ttft_ms": _pct(fin["ttft_s"].to_numpy(float), 99),
                "median_tpot_ms": _pct(fin["tpot_s"].to_numpy(float), 50),
                "p99_tpot_ms": _pct(fin["tpot_s"].to_numpy(float), 99),
                "p99_e2el_ms": _pct(fin["e2el_s"].to_numpy(float), 99),
            }
        )
    return pd.DataFrame(rows)


def load_imbalance(result: SimResult, interval: float = 1.0) -> float | None:
    """How unevenly the router spreads work: at each tick, (max − min) / mean of running + waiting over
    the replicas of one pool and role (P/D and pool deployments are uneven by design across groups),
    averaged over the ticks where the group holds any request, then over groups weighted by size.
    0 = perfectly even; None with no group of two or more replicas."""
    meta = result.meta.get("replicas") or []
    groups: dict[tuple[str, str], list[int]] = {}
    for m in meta:
        groups.setdefault((m.get("pool"), m.get("role")), []).append(m["replica"])
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups or result.steps.empty:
        return None
    ts = time_series(result, interval=interval, by_replica=True)
    ts["load"] = (ts["running"] + ts["waiting"]).astype(float)
    wide = ts.pivot_table(index="t", columns="replica", values="load", fill_value=0.0)
    total, weight = 0.0, 0
    for members in groups.values():
        arr = np.stack(
            [wide[i].to_numpy(float) if i in wide else np.zeros(len(wide)) for i in members], axis=1
        )
        mean = arr.mean(axis=1)
        keep = mean > 0
        if keep.any():
            total += len(members) * float(((arr.max(axis=1) - arr.min(axis=1))[keep] / mean[keep]).mean())
            weight += len(members)
    return total / weight if weight else None


def summarize_cluster(
    result: SimResult, slo: Mapping[str, float] | None = None, percentiles: Sequence[float] = (50, 90, 95, 99)
) -> dict[str, Any]:
    """The cluster's summary (vLLM keys, all replicas together) plus ``replicas``, ``classes`` and
    ``gateway`` entries and the number of GPUs used."""
    s = summarize(result, slo, percentiles)
    meta = result.meta
    s["num_replicas"] = meta.get("num_replicas", 1)
    s["num_gpus"] = meta.get("num_gpus", 1)
    s["router"] = meta.get("router")
    s["load_imbalance"] = load_imbalance(result)
    s["replicas"] = to_jsonable(replica_rows(result).to_dict(orient="records"))
    s["classes"] = to_jsonable(class_rows(result).to_dict(orient="records"))
    req = result.requests
    gw = req[(req["replica"] == -1) & (req["status"] == "rejected")]
    s["gateway"] = {
        "num_rejected": len(gw),
        "rejection_reasons": {str(k): int(v) for k, v in gw["finish_reason"].value_counts().items()},
        "max_queue_len": meta.get("max_gateway_queue"),
        "poll_interval_s": (meta.get("gateway") or {}).get("poll_interval_s"),
    }
    if meta.get("disagg"):
        x = req["kv_transfer_s"].to_numpy(float) if "kv_transfer_s" in req else np.array([])
        s["disagg"] = {
            **meta["disagg"],
            "mean_kv_transfer_ms": _mean_ms(x),
            "p99_kv_transfer_ms": _pct(x, 99),
        }
    return to_jsonable(s)


def _mean_ms(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(x.mean()) * 1000.0 if x.size else None


# ---- figures --------------------------------------------------------------------------------------------
def fig_load_balance(result: SimResult, interval: float | None = None) -> go.Figure:
    """Each replica's running + waiting requests over time, their spread, and requests served each."""
    st = result.steps
    span = float((st["start"] + st["duration"]).max()) if len(st) else 0.0
    fig = make_subplots(
        rows=3,
        cols=1,
        vertical_spacing=0.09,
        row_heights=[0.45, 0.25, 0.3],
        subplot_titles=(
            "Requests in each replica (running + waiting)",
            "Spread: max − min across replicas",
            "Requests served",
        ),
    )
    names = {m["replica"]: m.get("name", str(m["replica"])) for m in result.meta.get("replicas") or []}
    if span > 0:
        step = interval or max(span / 400.0, 1e-3)
        ts = time_series(result, interval=step, by_replica=True)
        ts["load"] = ts["running"] + ts["waiting"]
        for rep, g in ts.groupby("replica"):
            fig.add_trace(
                go.Scatter(
                    x=g["t"],
                    y=g["load"],
                    name=names.get(rep, str(rep)),
                    line_shape="hv",
                    legendgroup=str(rep),
                ),
                1,
                1,
            )
        wide = ts.pivot_table(index="t", columns="replica", values="load", fill_value=0.0)
        fig.add_trace(
            go.Scatter(
                x=wide.index,
                y=wide.max(axis=1) - wide.min(axis=1),
                name="spread",
                line={"color": "black"},
                showlegend=False,
            ),
            2,
            1,
        )
    rows = replica_rows(result)
    fig.add_trace(
        go.Bar(
            x=[names.get(i, str(i)) for i in rows["replica"]],
            y=rows["requests_served"],
            showlegend=False,
            text=rows["requests_served"],
            textposition="auto",
        ),
        3,
        1,
    )
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_layout(height=720, title="Load balance across replicas", hovermode="x unified")
    return fig


# ---- text -----------------------------------------------------------------------------------------------
def _f(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def format_cluster_summary(summary: Mapping[str, Any]) -> str:
    lines = [
        f"{summary.get('num_replicas')} replicas on {summary.get('num_gpus')} GPU(s), router "
        f"{summary.get('router')}: {summary.get('completed')}/{summary.get('num_requests')} finished, "
        f"{summary.get('num_rejected')} rejected ({summary['gateway']['num_rejected']} at the gateway), "
        f"{summary.get('num_in_flight')} in flight",
        f"throughput {_f(summary.get('request_throughput'), 2)} req/s, "
        f"{_f(summary.get('output_throughput'), 0)} output tok/s; load imbalance "
        f"{_f(summary.get('load_imbalance'), 2)}",
    ]
    for m in ("ttft", "tpot", "itl", "e2el"):
        lines.append(
            f"{m.upper():5s} ms: p50 {_f(summary.get(f'median_{m}_ms'))}  p90 "
            f"{_f(summary.get(f'p90_{m}_ms'))}  p99 {_f(summary.get(f'p99_{m}_ms'))}"
        )
    if summary.get("cost_per_hour") is not None:  # sim/app/cost_metrics.py
        lines.append(f"cost {_f(summary['cost_per_hour'], 2)} {summary.get('cost_currency')}/h; per 1M output tokens "
                     f"{_f(summary.get('cost_per_1m_output_tokens'), 3)}, per 1M goodput "
                     f"{_f(summary.get('cost_per_1m_goodput_tokens'), 3)}")  # fmt: skip
    if summary.get("disagg"):
        d = summary["disagg"]
        lines.append(
            f"P/D {d['num_prefill']}:{d['num_decode']}, KV transfer mean "
            f"{_f(d.get('mean_kv_transfer_ms'), 2)} ms p99 {_f(d.get('p99_kv_transfer_ms'), 2)} ms"
        )
    head = ("replica", "pool", "role", "served", "util", "kv", "preempt", "hit", "p50 ttft", "p50 tpot")
    lines.append("  ".join(f"{h:>9s}" for h in head))
    for r in summary.get("replicas", []):
        cells = (
            r["name"],
            r["pool"],
            r["role"],
            r["requests_served"],
            _f(r["utilization"], 2),
            _f(r["mean_kv_cache_usage"], 2),
            r["num_preemptions"],
            _f(r["prefix_cache_hit_rate"], 2),
            _f(r["median_ttft_ms"]),
            _f(r["median_tpot_ms"]),
        )
        lines.append("  ".join(f"{str(c):>9s}" for c in cells))
    return "\n".join(lines)


def compare_table(
    summaries: Mapping[str, Mapping[str, Any]], keys: Sequence[str] = COMPARE_KEYS
) -> pd.DataFrame:
    """Variants side by side: one column per variant, one row per metric."""
    return pd.DataFrame({name: [s.get(k) for k in keys] for name, s in summaries.items()}, index=list(keys))


def write_cluster_outputs(
    result: SimResult, out_dir: str | Path, summary: Mapping[str, Any], title: str = "servesim cluster run",
    plotlyjs: PlotlyJS | str | None = None, step_trace: bool = True,
) -> dict[str, Path]:
    """write_outputs' files plus replicas.csv, timeseries_by_replica.csv and load_balance.html; the pages
    share one plotly.min.js in ``out_dir`` (or the folder ``plotlyjs`` names)."""
    out = Path(out_dir)
    js = as_plotlyjs(plotlyjs).rooted(out)
    paths = write_outputs(result, out, summary=dict(summary), title=title, plotlyjs=js, step_trace=step_trace)
    paths["replicas"] = out / "replicas.csv"
    replica_rows(result).to_csv(paths["replicas"], index=False)
    paths["timeseries_by_replica"] = out / "timeseries_by_replica.csv"
    time_series(result, by_replica=True).to_csv(paths["timeseries_by_replica"], index=False)
    paths["load_balance"] = out / "load_balance.html"
    write_figure(fig_load_balance(result), paths["load_balance"], js)
    return paths


def write_comparison(
    runs: Mapping[str, tuple[SimResult, Mapping[str, Any]]], out_dir: str | Path, title: str,
    plotlyjs: PlotlyJS | str | None = None, step_trace: bool = True,
) -> dict[str, Path]:
    """Each variant's files in its own folder, plus comparison.html and comparison.json at the top; one
    plotly.min.js at the top serves every page."""
    from sim.app.report import write_comparison_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = as_plotlyjs(plotlyjs).rooted(out)
    paths: dict[str, Path] = {}
    for name, (res, summ) in runs.items():
        write_cluster_outputs(res, out / name, summ, title=f"{title}: {name}", plotlyjs=js, step_trace=step_trace)
    paths["comparison"] = write_comparison_report(
        runs,
        out / "comparison.html",
        title,
        metrics=(
            "request_throughput",
            "output_throughput",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_tpot_ms",
            "p99_tpot_ms",
            "p99_e2el_ms",
            "mean_kv_cache_usage",
        ),
        plotlyjs=js,
    )
    paths["comparison_json"] = out / "comparison.json"
    table = compare_table({n: s for n, (_, s) in runs.items()})
    paths["comparison_json"].write_text(
        json.dumps(to_jsonable(table.to_dict()), indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    return paths
