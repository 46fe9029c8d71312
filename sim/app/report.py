"""Plotly figures and HTML reports for one run or several runs side by side.

Reports must open offline (a user may read one on a machine with no network) and a folder of them must
stay small: plotly.js is written once per output directory and loaded by every page under it
(sim/app/plotlyjs.py; ``cdn`` and ``inline`` are the alternatives). Figures carry the deployment in their
titles, give quantities of different magnitude their own axes, put latency CDFs on a log axis when they
span decades, draw the SLOs, and keep one colour per series across subplots (sim/app/report_style.py).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.app.plotlyjs import PlotlyJS, as_plotlyjs
from sim.app.report_style import (
    SERIES_COLORS,
    SLO_COLOR,
    common_label,
    decades_from_ecdf,
    run_colors,
    run_label,
    spans_decades,
)
from sim.app.results import SimResult, parse_slo, request_metrics, time_series
from sim.app.stats import ecdf_fractions, ecdf_points
from sim.core.errors import ConfigError

DEFAULT_COMPARE_METRICS = (
    "request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
    "p99_tpot_ms", "p99_e2el_ms", "mean_kv_cache_usage",
)  # fmt: skip
_CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))
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


def _f32(x: Any) -> np.ndarray:
    """Plot data as float32: plotly ships numpy arrays base64-encoded, so this halves a report's data."""
    return np.asarray(x, dtype=np.float32)


def _ecdf(values: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative fractions (``weights``: counts of each value, as the engine's
    compressed ITL gaps), thinned to at most _MAX_POINTS points."""
    values = np.asarray(values, dtype=float)
    w = np.ones(values.size) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(values) & (w > 0)
    order = np.argsort(values[keep], kind="stable")
    v, cw = values[keep][order], np.cumsum(w[keep][order])
    y = cw / cw[-1] if cw.size else cw
    if v.size > _MAX_POINTS:
        idx = np.unique(np.linspace(0, v.size - 1, _MAX_POINTS).astype(np.int64))
        v, y = v[idx], y[idx]
    return v, y


def _span(result: SimResult) -> float:
    st = result.step_columns(("start", "duration"))
    return float((st["start"] + st["duration"]).max()) if len(st["start"]) else 0.0


def label(result: SimResult) -> str:
    """The deployment a result comes from, for titles: model, GPU, preset, workload."""
    return run_label(result.config, result.meta)


def _kv_breakdown(result: SimResult) -> list[tuple[str, pd.Series]]:
    """Cached-but-free and swapped-out KV as % of the GPU pool, per step (one replica only): the usage
    line counts neither, since vLLM reports cached unreferenced blocks as free."""
    # the stored columns (counts maybe narrower than the frame's: the shares below are float)
    steps = pd.DataFrame(result.step_columns(("replica", "start", "num_cached_blocks", "num_swapped_blocks")),
                         copy=False)  # fmt: skip
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


def _line(x: Any, y: Any, name: str, **kw: Any) -> go.Scatter:
    return go.Scatter(x=_f32(x), y=_f32(y), name=name, legendgroup=name, line={"color": SERIES_COLORS[name]}, **kw)


def fig_timeline(result: SimResult, title: str | None = None, series: pd.DataFrame | None = None) -> go.Figure:
    """KV usage, running/waiting, prompt and generation throughput over simulated time: one shared x
    axis, a y axis each (prompt tok/s runs in the thousands, generation in the hundreds). ``series``: the
    run's ``time_series(result)`` (1 s ticks, replicas summed), when the caller has it: the throughputs
    are drawn from it then, as given."""
    span = _span(result)
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        subplot_titles=("KV cache (% of GPU blocks)", "Requests", "Prompt throughput (tokens/s)",
                                        "Generation throughput (tokens/s)"))  # fmt: skip
    if span > 0:
        state = time_series(result, interval=span / _MAX_POINTS * 2)
        interval = 1.0 if span >= 20 else span / 20
        tp = series if series is not None and interval == 1.0 else time_series(result, interval=interval)
        fig.add_trace(_line(state["t"], state["kv_cache_pct"], "KV usage", line_shape="hv"), 1, 1)
        for name, y in _kv_breakdown(result):
            fig.add_trace(_line(y.index, y.to_numpy(), name, line_shape="hv"), 1, 1)
        fig.add_trace(_line(state["t"], state["running"], "running", line_shape="hv"), 2, 1)
        fig.add_trace(_line(state["t"], state["waiting"], "waiting", line_shape="hv"), 2, 1)
        fig.add_trace(_line(tp["t"], tp["prompt_throughput"], "prompt tok/s"), 3, 1)
        fig.add_trace(_line(tp["t"], tp["gen_throughput"], "generation tok/s"), 4, 1)
    fig.update_xaxes(title_text="simulated time (s)", row=4, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_layout(height=820, hovermode="x unified",
                      title=title or f"Engine timeline: {label(result)}")  # fmt: skip
    return fig


def _latency_samples(res: SimResult) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Per metric, the finished requests' values in ms (ITL: the engine's gaps with their counts)."""
    df = request_metrics(res.requests)
    fin = df[df["status"] == "finished"]
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        m: (fin[f"{m}_s"].to_numpy(float) * 1000.0, None) for m in ("ttft", "tpot", "e2el")
    }
    out["itl"] = (GapsMs(res), None)  # a block at a time: a big run has ~4·10^7 gaps
    return out


class GapsMs:
    """A result's inter-token gaps in ms with their counts, as blocks (SimResult.gap_blocks): what
    ``_ecdf`` and ``spans_decades`` read without the whole sample or its sorted copy in memory."""

    def __init__(self, res: SimResult) -> None:
        self.res = res

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return ((v * 1000.0, w) for v, w in self.res.gap_blocks())


def _slo_marks(fig: go.Figure, slo: Mapping[str, float] | None, logs: dict[str, bool]) -> None:
    """Per-request SLOs as a dashed vertical line; percentile SLOs as a cross at (target, q): the CDF
    must pass above and left of it."""
    try:
        limits, pct = parse_slo(slo)
    except ConfigError:  # an invalid SLO was refused before the run; draw nothing rather than fail here
        return
    cols = {m: i for i, (m, _) in enumerate(_CDF_METRICS, start=1)}
    for metric, limit_s in limits.items():
        x = limit_s * 1000.0
        if metric in cols and (x > 0 or not logs[metric]):
            fig.add_trace(go.Scatter(x=[x, x], y=[0, 1.02], mode="lines", name=f"{metric} <= {x:g} ms per request",
                                     line={"color": SLO_COLOR, "dash": "dash", "width": 1.5},
                                     legendgroup="slo"), 1, cols[metric])  # fmt: skip
    for key, (metric, q, target) in pct.items():
        if metric in cols and (target > 0 or not logs[metric]):
            fig.add_trace(go.Scatter(x=[target, target], y=[0, q / 100.0], mode="lines+markers",
                                     name=f"{key} <= {target:g} (SLO)", legendgroup="slo",
                                     marker={"symbol": "x", "size": [0, 12], "color": SLO_COLOR},
                                     line={"color": SLO_COLOR, "dash": "dot", "width": 1.5}), 1, cols[metric])  # fmt: skip


def fig_latency_cdf(result: SimResult | Mapping[str, SimResult], slo: Mapping[str, float] | None = None,
                    title: str | None = None) -> go.Figure:  # fmt: skip
    """Empirical CDFs of TTFT, TPOT, ITL and E2E latency (ms) of finished requests; several runs overlay,
    one colour per run in every panel. A panel whose values span decades gets a log axis; ``slo``
    (``[slo]`` keys, ms) is drawn on the panels it concerns."""
    runs = {"run": result} if isinstance(result, SimResult) else dict(result)
    colors = run_colors(runs)
    samples = {name: _latency_samples(res) for name, res in runs.items()}
    curves = {name: {m: _curve(*per[m]) for m, _ in _CDF_METRICS} for name, per in samples.items()}
    logs = {m: _log_axis([s[m] for s in samples.values()], [c[m] for c in curves.values()]) for m, _ in _CDF_METRICS}
    fig = make_subplots(rows=1, cols=len(_CDF_METRICS),
                        subplot_titles=[f"{t} (ms{', log' if logs[m] else ''})" for m, t in _CDF_METRICS])  # fmt: skip
    for name, per in curves.items():
        for col, (metric, _) in enumerate(_CDF_METRICS, start=1):
            x, y = per[metric][:2]
            fig.add_trace(go.Scatter(x=_f32(x), y=_f32(y), name=name, legendgroup=name, showlegend=col == 1,
                                     line={"color": colors[name]}), 1, col)  # fmt: skip
    _slo_marks(fig, slo, logs)
    for col, (metric, _) in enumerate(_CDF_METRICS, start=1):
        if logs[metric]:
            fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests", row=1, col=1)
    default = "Latency CDFs (finished requests)" + ("" if len(runs) > 1 else f": {label(next(iter(runs.values())))}")
    fig.update_layout(height=420, title=title or default, legend={"orientation": "h", "y": -0.2})
    return fig


def _curve(values: Any, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """A metric's drawn CDF (x, y) and, for a run's gaps read as blocks, its points with their integer
    cumulated weights and total (``decades_from_ecdf`` reads them)."""
    if not isinstance(values, GapsMs):
        return (*_ecdf(values, weights), None)
    x, cum_w, total = ecdf_points(values, _MAX_POINTS)
    return x, ecdf_fractions(cum_w, total), (x, cum_w, total)


def _log_axis(samples: list[tuple[Any, np.ndarray | None]], curves: list[tuple]) -> bool:
    """``spans_decades`` of the pooled samples; one run's gaps are first judged from their CDF's points,
    which settle it unless the ratio falls between two of them (a big run's gaps: passes spared)."""
    if len(curves) == 1 and curves[0][2] is not None:
        decided = decades_from_ecdf(*curves[0][2])
        if decided is not None:
            return decided
    return spans_decades(samples)


def fig_compare(summaries: Mapping[str, Mapping[str, Any]], metrics: Sequence[str] = DEFAULT_COMPARE_METRICS,
                title: str = "Runs compared", slo: Mapping[str, float] | None = None) -> go.Figure:  # fmt: skip
    """One bar panel per metric (each has its own scale), one bar per named run in the run's colour (the
    same as in the CDFs); missing values are gaps. A percentile SLO on a shown metric (``p99_ttft_ms``)
    is a dashed line on its panel."""
    names = list(summaries)
    colors = run_colors(names)
    ncols = min(4, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / ncols))
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=list(metrics))
    for i, metric in enumerate(metrics):
        ys = [summaries[n].get(metric) for n in names]
        fig.add_trace(go.Bar(x=names, y=ys, name=metric, showlegend=False, marker_color=[colors[n] for n in names],
                             text=[_fmt(y) for y in ys], textposition="auto"),
                      row=i // ncols + 1, col=i % ncols + 1)  # fmt: skip
        if slo and metric in slo:
            fig.add_hline(y=float(slo[metric]), line_dash="dash", line_color=SLO_COLOR, annotation_text="SLO",
                          row=i // ncols + 1, col=i % ncols + 1)  # fmt: skip
    fig.update_layout(height=320 * nrows, title=title)
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
            f"<li>{html.escape(k)}: target {_fmt(c['target'])} ms, value {_fmt(c['value'])} ms, "
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


def _page(title: str, body: list[str], figures: Sequence[go.Figure], path: Path, plotlyjs: PlotlyJS) -> str:
    divs = [f.to_html(full_html=False, include_plotlyjs=False) for f in figures]
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"{plotlyjs.script_tag(path)}<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            + "".join(body) + "".join(f"<div>{d}</div>" for d in divs) + "</body></html>\n")  # fmt: skip


def write_report(result: SimResult, path: str | Path, summary: Mapping[str, Any], title: str = "servesim run",
                 plotlyjs: PlotlyJS | str | None = None, series: pd.DataFrame | None = None) -> Path:  # fmt: skip
    """One HTML file: summary table, details, timeline and latency CDFs (with the run's SLOs). plotly.js
    as ``plotlyjs`` says (default: one plotly.min.js beside it, sim/app/plotlyjs.py); ``series``: the
    run's 1 s ``time_series`` when the caller has it (timeseries.csv's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"{title}: {label(result)}"
    body = ["<h2>Summary</h2>", _summary_table({"this run": summary}), _details(summary)]
    figs = [fig_timeline(result, series=series), fig_latency_cdf(result, slo=summary.get("slo"))]
    path.write_text(_page(title, body, figs, path, as_plotlyjs(plotlyjs)), encoding="utf-8")
    return path


def write_comparison_report(runs: Mapping[str, tuple[SimResult, Mapping[str, Any]]], path: str | Path,
                            title: str, intro_html: str = "", metrics: Sequence[str] = DEFAULT_COMPARE_METRICS,
                            plotlyjs: PlotlyJS | str | None = None) -> Path:  # fmt: skip
    """Several named runs side by side: one table, bar panels, overlaid CDFs, then each run's timeline.

    ``intro_html`` is trusted HTML written by the caller (the demo's explanation); it is not escaped.
    Titles gain what the runs' deployments share; the SLO lines are drawn when the runs' SLOs agree.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    summaries = {name: s for name, (_, s) in runs.items()}
    shared = common_label(label(r) for r, _ in runs.values())
    common = f" ({shared})" if shared else ""
    slos = [json.dumps(s.get("slo"), sort_keys=True) for s in summaries.values()]
    slo = next(iter(summaries.values())).get("slo") if summaries and len(set(slos)) == 1 else None
    figs: list[go.Figure] = [
        fig_compare(summaries, metrics, title=f"Runs compared{common}", slo=slo),
        fig_latency_cdf({n: r for n, (r, _) in runs.items()}, slo=slo,
                        title=f"Latency CDFs (finished requests){common}"),
    ]
    title += common
    figs += [fig_timeline(res, title=f"Engine timeline: {name} ({label(res)})") for name, (res, _) in runs.items()]
    body = [intro_html, "<h2>Summary</h2>", _summary_table(summaries)]
    path.write_text(_page(title, body, figs, path, as_plotlyjs(plotlyjs)), encoding="utf-8")
    return path
