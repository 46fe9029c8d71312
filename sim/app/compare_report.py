"""The HTML report of ``servesim compare --out DIR``: real and simulated distributions and time series overlaid.

Self-contained (plotly.js inlined once, as sim/app/report.py does), so it opens offline. Distributions are
ECDFs where the run has per-request latencies, else the run's mean / P50 / P90 / P99 next to the simulated
ones; error bars per metric and stage; the gauges over time where the run logged them.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.app.compare import SERIES, Comparison, format_comparison
from sim.app.report import _ecdf
from sim.app.results import to_jsonable
from workloads.runs import STATS, metric_name

REAL, SIM = "#1f77b4", "#d62728"
_DIST = (("ttft", "TTFT (s)"), ("tpot", "TPOT (s)"), ("e2el", "E2E latency (s)"))


def fig_distributions(c: Comparison) -> go.Figure:
    run = c.replay.run
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in _DIST])
    for j, (m, title) in enumerate(_DIST, 1):
        sim = c.sim.loc[c.sim["ok"], m].to_numpy(float)
        real = run.requests[m].to_numpy(float) if run.requests is not None and m in run.requests else None
        if real is not None and np.isfinite(real).any():
            for vals, name, color in ((real, "real", REAL), (sim, "simulated", SIM)):
                x, y = _ecdf(vals)
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{name} {m}", line={"color": color},
                                         legendgroup=name, showlegend=j == 1), row=1, col=j)  # fmt: skip
        else:  # aggregates only: the run's stats beside the simulated ones
            r = [run.overall.get(metric_name(m, s)) for s in STATS]
            s_ = [c.overall.get(metric_name(m, s), {}).get("sim") for s in STATS]
            fig.add_trace(go.Bar(x=list(STATS), y=[None if v is None else v / 1e3 for v in r], name="real",
                                 marker_color=REAL, legendgroup="real", showlegend=j == 1), row=1, col=j)
            fig.add_trace(go.Bar(x=list(STATS), y=[None if v is None else v / 1e3 for v in s_], name="simulated",
                                 marker_color=SIM, legendgroup="simulated", showlegend=j == 1), row=1, col=j)
        fig.update_xaxes(title_text=title, row=1, col=j)
    fig.update_layout(title="Latency distributions: real vs simulated", height=420, barmode="group")
    return fig


def fig_errors(c: Comparison) -> go.Figure:
    fig = go.Figure()
    rows = [(f"stage {st['stage']}", st["metrics"]) for st in c.stages] if len(c.stages) > 1 else []
    for label, metrics in [*rows, ("overall", c.overall)]:
        keys = [k for k, v in metrics.items() if v["error_pct"] is not None]
        fig.add_trace(go.Bar(x=keys, y=[metrics[k]["error_pct"] for k in keys], name=label))
    fig.update_layout(title="Signed error, sim / real − 1 (%)", barmode="group", height=420, yaxis_title="%")
    return fig


def fig_series(c: Comparison) -> go.Figure | None:
    real, sim = c.replay.run.timeseries, c.sim_timeseries
    cols = [x for x in SERIES if real is not None and x in real.columns]
    if not cols or sim is None:
        return None
    fig = make_subplots(rows=len(cols), cols=1, shared_xaxes=True, subplot_titles=cols)
    for i, col in enumerate(cols, 1):
        fig.add_trace(go.Scatter(x=real["t"], y=real[col], name="real", line={"color": REAL}, legendgroup="real",
                                 showlegend=i == 1), row=i, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=sim["t"], y=sim[col], name="simulated", line={"color": SIM},
                                 legendgroup="simulated", showlegend=i == 1), row=i, col=1)  # fmt: skip
    fig.update_layout(title="Engine gauges over time", height=260 * len(cols))
    fig.update_xaxes(title_text="t (s)", row=len(cols), col=1)
    return fig


def write_report(c: Comparison, out_dir: str | Path) -> dict[str, Path]:
    """``report.html`` and ``comparison.json`` in ``out_dir`` (created)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = [f for f in (fig_distributions(c), fig_errors(c), fig_series(c)) if f is not None]
    divs = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    run = c.replay.run
    meaning = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in run.meaning.items())
    body = (f"<h1>servesim compare: {html.escape(run.name)}</h1><pre>{html.escape(format_comparison(c))}</pre>"
            f"<h2>What the run measured</h2><ul>{meaning}</ul>" + "".join(divs))
    paths = {"report": out / "report.html", "json": out / "comparison.json"}
    paths["report"].write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>servesim compare</title>"
                               f"</head><body>{body}</body></html>")
    paths["json"].write_text(json.dumps(to_jsonable(c.to_dict()), indent=2) + "\n")
    return paths
