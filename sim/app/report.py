"""Plotly figures and self-contained HTML reports for one run or several runs side by side.

Reports must open offline (a user may read one on a machine with no network), so plotly.js is inlined
once, with the first figure, and later figures reuse it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.app.results import SimResult, request_metrics, time_series

DEFAULT_COMPARE_METRICS = (
    "request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
    "p99_tpot_ms", "p99_e2el_ms", "mean_kv_cache_usage",
)  # fmt: skip
_CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E latency"))
_MAX_POINTS = 2000  # per trace; keeps reports of 100k-request runs small
_TABLE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Requests", ("num_requests", "completed", "num_rejected", "num_timed_out", "num_in_flight", "num_not_arrived",
                  "num_preemptions", "duration")),
    ("Throughput", ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                    "max_output_tokens_per_s", "max_concurrent_requests", "slo_attainment")),
    ("Latency (ms)", ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                      "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
                      "mean_queue_time_ms", "p99_queue_time_ms")),
    ("Engine", ("mean_kv_cache_usage", "max_kv_cache_usage", "mean_num_running", "mean_num_waiting",
                "max_num_waiting", "prefix_cache_hit_rate")),
)  # fmt: skip


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative fractions, thinned to at most _MAX_POINTS points."""
    v = np.sort(values[np.isfinite(values)])
    y = np.arange(1, v.size + 1) / max(v.size, 1)
    if v.size > _MAX_POINTS:
        keep = np.unique(np.linspace(0, v.size - 1, _MAX_POINTS).astype(np.int64))
        v, y = v[keep], y[keep]
    return v, y


def _span(result: SimResult) -> float:
    st = result.steps
    return float((st["start"] + st["duration"]).max()) if len(st) else 0.0


def _kv_breakdown(result: SimResult) -> list[tuple[str, pd.Series]]:
    """Cached-but-free and swapped-out KV as % of the GPU pool, per step (one replica only): the usage
    line counts neither, since vLLM reports cached unreferenced blocks as free."""
    steps = result.steps
    usable = (result.meta.get("num_gpu_blocks") or 0) - 1
    if usable <= 0 or steps.empty or steps["replica"].nunique() != 1:
        return []
    stride = max(1, len(steps) // _MAX_POINTS)
    s = steps.iloc[::stride].set_index("start")
    out = []
    for col, name in (("num_cached_blocks", "cached, reusable (% of pool)"),
                      ("num_swapped_blocks", "swapped to CPU (% of pool)")):  # fmt: skip
        if col in s and s[col].any():
            out.append((name, 100.0 * s[col] / usable))
    return out


def fig_timeline(result: SimResult) -> go.Figure:
    """KV usage, running/waiting and token throughput over simulated time, one shared x axis."""
    span = _span(result)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("KV cache (% of GPU blocks)", "Requests", "Throughput (tokens/s)"))  # fmt: skip
    if span > 0:
        state = time_series(result, interval=span / _MAX_POINTS * 2)
        tp = time_series(result, interval=1.0 if span >= 20 else span / 20)
        fig.add_trace(
            go.Scatter(x=state["t"], y=state["kv_cache_pct"], name="KV usage", line_shape="hv"), 1, 1
        )
        for name, y in _kv_breakdown(result):
            fig.add_trace(go.Scatter(x=y.index, y=y.to_numpy(), name=name, line_shape="hv"), 1, 1)
        fig.add_trace(go.Scatter(x=state["t"], y=state["running"], name="running", line_shape="hv"), 2, 1)
        fig.add_trace(go.Scatter(x=state["t"], y=state["waiting"], name="waiting", line_shape="hv"), 2, 1)
        fig.add_trace(go.Scatter(x=tp["t"], y=tp["prompt_throughput"], name="prompt tok/s"), 3, 1)
        fig.add_trace(go.Scatter(x=tp["t"], y=tp["gen_throughput"], name="generation tok/s"), 3, 1)
    fig.update_xaxes(title_text="simulated time (s)", row=3, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_layout(height=650, title="Engine timeline", hovermode="x unified")
    return fig


def fig_latency_cdf(result: SimResult | Mapping[str, SimResult]) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and E2E latency (ms) of finished requests; several runs overlay."""
    runs = {"run": result} if isinstance(result, SimResult) else dict(result)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{t} (ms)" for _, t in _CDF_METRICS])
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
    for i, (name, res) in enumerate(runs.items()):
        df = request_metrics(res.requests)
        fin = df[df["status"] == "finished"]
        for col, (metric, _) in enumerate(_CDF_METRICS, start=1):
            x, y = _ecdf(fin[metric].to_numpy(float) * 1000.0)
            fig.add_trace(go.Scatter(x=x, y=y, name=name, legendgroup=name, showlegend=col == 1,
                                     line={"color": palette[i % len(palette)]}), 1, col)  # fmt: skip
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests", row=1, col=1)
    fig.update_layout(height=380, title="Latency CDFs (finished requests)", showlegend=len(runs) > 1)
    return fig


def fig_compare(summaries: Mapping[str, Mapping[str, Any]],
                metrics: Sequence[str] = DEFAULT_COMPARE_METRICS) -> go.Figure:  # fmt: skip
    """One bar panel per metric (each has its own scale), one bar per named run; missing values are gaps."""
    names = list(summaries)
    ncols = min(4, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / ncols))
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=list(metrics))
    for i, metric in enumerate(metrics):
        ys = [summaries[n].get(metric) for n in names]
        fig.add_trace(go.Bar(x=names, y=ys, name=metric, showlegend=False,
                             text=[_fmt(y) for y in ys], textposition="auto"),
                      row=i // ncols + 1, col=i % ncols + 1)  # fmt: skip
    fig.update_layout(height=320 * nrows, title="Runs compared")
    return fig


# ---- HTML -----------------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _summary_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    names = list(summaries)
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = []
    for group, keys in _TABLE_GROUPS:
        rows.append(f'<tr class="group"><td colspan="{len(names) + 1}">{html.escape(group)}</td></tr>')
        for k in keys:
            if not any(k in s for s in summaries.values()):
                continue
            cells = "".join(f"<td>{html.escape(_fmt(summaries[n].get(k)))}</td>" for n in names)
            rows.append(f"<tr><th>{html.escape(k)}</th>{cells}</tr>")
    return f"<table><tr><th>metric</th>{head}</tr>{''.join(rows)}</table>"


def _details(summary: Mapping[str, Any]) -> str:
    parts = []
    if summary.get("rejection_reasons"):
        items = "".join(
            f"<li>{html.escape(str(r))}: {c}</li>" for r, c in summary["rejection_reasons"].items()
        )
        parts.append(f"<h3>Rejected requests</h3><ul>{items}</ul>")
    if summary.get("slo_checks"):
        items = "".join(
            f"<li>{html.escape(k)}: target {_fmt(c['target'])} s, value {_fmt(c['value'])} s, "
            f"{'met' if c['met'] else '<b>not met</b>'}</li>"
            for k, c in summary["slo_checks"].items()
        )
        parts.append(f"<h3>Percentile SLOs</h3><ul>{items}</ul>")
    if summary.get("slo"):
        parts.append(f"<p>Per-request SLO: <code>{html.escape(json.dumps(summary['slo']))}</code></p>")
    cfg = {k: summary.get(k) for k in ("config", "meta", "horizon")}
    parts.append("<details><summary>Configuration and metadata</summary><pre>"
                 f"{html.escape(json.dumps(cfg, indent=2, default=str))}</pre></details>")  # fmt: skip
    return "".join(parts)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child{text-align:left}tr.group td{background:#eee;text-align:left;font-weight:bold}
pre{background:#f6f6f6;padding:1em;overflow:auto;max-height:30em}"""


def _page(title: str, body: list[str], figures: Sequence[go.Figure]) -> str:
    divs = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            + "".join(body) + "".join(f"<div>{d}</div>" for d in divs) + "</body></html>\n")  # fmt: skip


def write_report(result: SimResult, path: str | Path, summary: Mapping[str, Any],
                 title: str = "servesim run") -> Path:  # fmt: skip
    """One self-contained HTML file: summary table, details, timeline and latency CDFs."""
    body = ["<h2>Summary</h2>", _summary_table({"this run": summary}), _details(summary)]
    page = _page(title, body, [fig_timeline(result), fig_latency_cdf(result)])
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


def write_comparison_report(runs: Mapping[str, tuple[SimResult, Mapping[str, Any]]], path: str | Path,
                            title: str, intro_html: str = "",
                            metrics: Sequence[str] = DEFAULT_COMPARE_METRICS) -> Path:  # fmt: skip
    """Several named runs side by side: one table, bar panels, overlaid CDFs, then each run's timeline.

    ``intro_html`` is trusted HTML written by the caller (the demo's explanation); it is not escaped.
    """
    summaries = {name: s for name, (_, s) in runs.items()}
    figs: list[go.Figure] = [
        fig_compare(summaries, metrics),
        fig_latency_cdf({n: r for n, (r, _) in runs.items()}),
    ]
    for name, (res, _) in runs.items():
        f = fig_timeline(res)
        f.update_layout(title=f"Engine timeline: {name}")
        figs.append(f)
    body = [intro_html, "<h2>Summary</h2>", _summary_table(summaries)]
    page = _page(title, body, figs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
