"""How a sizing answer is presented: per-candidate table, the curve of every load tried, JSON, a text
digest and a plotly figure (the result types of :mod:`sim.app.sizing`, which does the search)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from sim.app.sizing import LoadKnob

_GOAL_TEXT = {"throughput": "maximum throughput", "knee": "the knee of the throughput curve"}
NEAR_SATURATION = 0.9  # offered load / μ_max above which a capacity is reported as near saturation


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: dict[str, dict[str, Any]]  # per SLO key: target, mean, ci_low, ci_high, bound, margin, met
    saturated_fraction: float


@dataclass
class Evaluation:
    """One load level of one candidate, over the replications."""

    x: float
    offered_rate: float | None
    verdict: Verdict
    metrics: dict[str, tuple[float, float, float]]  # metric -> (mean, ci_low, ci_high)
    offline: bool = False
    passed_each: list[bool] = field(default_factory=list)  # per replication, on its own point values

    def row(self) -> dict[str, Any]:
        r: dict[str, Any] = {"load": self.x, "offered_rate": self.offered_rate, "offline": self.offline,
                             "meets_slo": self.verdict.passed,
                             "saturated_fraction": self.verdict.saturated_fraction}  # fmt: skip
        for m, (mean, lo, hi) in self.metrics.items():
            r[m], r[f"{m}_lo"], r[f"{m}_hi"] = mean, lo, hi
        for k, c in self.verdict.checks.items():
            r[f"slo_{k}"], r[f"slo_{k}_bound"] = c["mean"], c["bound"]
        return r


@dataclass
class CandidateResult:
    params: dict[str, Any]
    evaluations: list[Evaluation] = field(default_factory=list)
    capacity: float | None = None  # knob units; 0: no load met the SLOs
    bracket: tuple[float | None, float | None] = (None, None)

    @property
    def offline(self) -> Evaluation | None:
        return next((e for e in self.evaluations if e.offline), None)

    @property
    def at_capacity(self) -> Evaluation | None:
        return next((e for e in self.evaluations if not e.offline and e.x == self.capacity), None)

    def capacity_by_replication(self) -> list[float]:
        """Each replication's own capacity on the loads the search tried: the highest tried load it
        passed below every tried load it failed. Resolution is the search's, finest near the answer."""
        pts = sorted((e for e in self.evaluations if not e.offline and e.passed_each), key=lambda e: e.x)
        if not pts:
            return []
        caps = []
        for r in range(len(pts[0].passed_each)):
            cap = 0.0
            for e in pts:
                if not e.passed_each[r]:
                    break
                cap = e.x
            caps.append(cap)
        return caps


@dataclass
class SizingResult:
    knob: LoadKnob
    slo: dict[str, float]
    goal: str
    candidates: list[CandidateResult]
    recommended: int | None
    replications: int
    level: float
    num_simulations: int
    wall_time_s: float
    notes: list[str] = field(default_factory=list)
    knees: list[Any] = field(default_factory=list)  # goal "knee": sim.app.knee.Knee per curve
    knee_gain: float = 0.1
    label: str = ""  # the deployment searched (model, GPU, preset, workload), for titles

    # ---- tables ----
    def table(self) -> pd.DataFrame:
        """One row per candidate: its settings, capacity, throughput at capacity (CI), offline throughput;
        for the knee goal its gain per doubling and whether it is the knee."""
        from sim.app.knee import knee_rows

        knees = knee_rows(self) if self.knees else {}
        rows = []
        for i, c in enumerate(self.candidates):
            r: dict[str, Any] = {**c.params}
            cap = c.at_capacity
            off = c.offline
            if self.goal == "slo":
                r["capacity"] = c.capacity
                r["capacity_req_s"] = self.knob.req_rate(c.capacity) if c.capacity is not None else None
                ci = _cap_ci(self, c) or {}
                r["capacity_lo"], r["capacity_hi"] = ci.get("ci_low"), ci.get("ci_high")
                for m in ("request_throughput", "request_goodput", "p99_ttft_ms", "p99_tpot_ms"):
                    mean, lo, hi = cap.metrics.get(m, (None,) * 3) if cap else (None,) * 3
                    r[m], r[f"{m}_lo"], r[f"{m}_hi"] = mean, lo, hi
                r["min_margin"] = _min_margin(cap)
                r["load_fraction"] = _load_fraction(self.knob, c)
            if self.goal == "knee" and off is None and c.evaluations:  # a closed loop's one fixed-load run
                for m in ("request_throughput", "output_throughput", "median_tpot_ms", "mean_kv_cache_usage"):
                    r[m] = c.evaluations[0].metrics.get(m, (None,))[0]
            if off:
                for m in ("request_throughput", "output_throughput"):
                    mean, lo, hi = off.metrics.get(m, (None,) * 3)
                    r[f"offline_{m}"], r[f"offline_{m}_lo"], r[f"offline_{m}_hi"] = mean, lo, hi
            if off and self.goal == "knee":
                for m in ("median_tpot_ms", "mean_kv_cache_usage"):
                    r[f"offline_{m}"] = off.metrics.get(m, (None,))[0]
            r.update(knees.get(i, {}))
            r["recommended"] = i == self.recommended
            rows.append(r)
        return pd.DataFrame(rows)

    def curve(self) -> pd.DataFrame:
        """Every load level tried, per candidate, sorted by load: the curve behind the answer."""
        rows = [{**c.params, **e.row()} for c in self.candidates for e in c.evaluations]
        df = pd.DataFrame(rows)
        keys = list(self.candidates[0].params) if self.candidates else []
        return df.sort_values([*keys, "offline", "load"], kind="stable").reset_index(drop=True)

    def to_dict(self) -> dict[str, Any]:
        from sim.app.results import to_jsonable

        rec = self.candidates[self.recommended] if self.recommended is not None else None
        out: dict[str, Any] = {
            "goal": self.goal,
            "slo": self.slo,
            "load_knob": {
                "key": f"workload.{self.knob.key}",
                "unit": self.knob.unit,
                "req_per_s_per_unit": self.knob.per_unit,
            },  # fmt: skip
            "replications": self.replications,
            "confidence_level": self.level,
            "interval": "Student t over replications (mean ± t·s/√n)",
            "num_simulations": self.num_simulations,
            "wall_time_s": self.wall_time_s,
            "recommendation": None,
            "candidates": self.table().to_dict("records"),
            "notes": self.notes,
            "curve": self.curve().to_dict("records"),
        }
        if self.goal == "knee":
            out["knee_gain"] = self.knee_gain
            out["knees"] = [k.to_dict() for k in self.knees]
        if rec is not None:
            cap, off = rec.at_capacity, rec.offline
            out["recommendation"] = {
                "settings": rec.params,
                "capacity": rec.capacity,
                "capacity_req_s": self.knob.req_rate(rec.capacity) if rec.capacity is not None else None,
                "bracket": list(rec.bracket),
                "capacity_by_replication": rec.capacity_by_replication(),  # in the knob's unit
                "capacity_ci": _cap_ci(self, rec),
                "throughput_req_s": _ci(cap, "request_throughput") if cap else _ci(off, "request_throughput"),
                "goodput_req_s": _ci(cap, "request_goodput") if cap else None,
                "output_throughput_tok_s": _ci(cap or off, "output_throughput"),
                "slo_checks": cap.verdict.checks if cap else None,
                "min_margin": _min_margin(cap),
                "load_fraction": _load_fraction(self.knob, rec),
                "near_saturation": rec.bracket[1] is not None
                and (_load_fraction(self.knob, rec) or 0) >= NEAR_SATURATION,
            }
        return to_jsonable(out)

    def format(self) -> str:
        d = self.to_dict()
        lines = [
            f"sizing for {_GOAL_TEXT.get(self.goal) or 'the SLOs ' + _fmt_slo(self.slo)}: "
            f"{len(self.candidates)} candidates, {self.replications} replications each, "
            f"{self.num_simulations} simulations in {self.wall_time_s:.1f} s",
            *(f"note: {n}" for n in self.notes),
        ]
        tab = self.table()
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            cols = [c for c in tab.columns if not c.endswith(("_lo", "_hi")) and tab[c].notna().any()]
            lines.append(tab[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        rec = d["recommendation"]
        if self.goal == "knee":
            from sim.app.knee import format_knees

            lines += format_knees(self)
        if rec is None:
            lines.append("no knee in the settings tried" if self.goal == "knee" else
                         "no candidate meets the SLOs at any load tried")  # fmt: skip
            return "\n".join(lines)
        s = ", ".join(f"{k}={v}" for k, v in rec["settings"].items())
        lines.append(f"recommended: {s}")
        if self.goal == "slo":
            tp = rec["throughput_req_s"]
            caps = ", ".join(_fmt_num(x) for x in rec["capacity_by_replication"])
            lines.append(
                f"capacity: {_fmt_num(rec['capacity_req_s'] if self.knob.unit == 'req/s' else rec['capacity'])} "
                f"{'req/s offered' if self.knob.unit == 'req/s' else self.knob.unit}; measured throughput "
                f"{_fmt_ci(tp)} req/s ({100 * self.level:.10g}% t-interval over {self.replications} "
                f"{'trace windows' if self.knob.windows else 'seeds'})"
            )
            lines.append(
                f"  each replication alone (on the loads tried): {caps}; {100 * self.level:.10g}% t-interval "
                f"{_fmt_ci(rec['capacity_ci'])}"
            )
            for k, c in (rec["slo_checks"] or {}).items():
                side = "lower" if k == "attainment" else "upper"
                lines.append(
                    f"  {k}: {_fmt_num(c['mean'])} [{_fmt_num(c['ci_low'])}, {_fmt_num(c['ci_high'])}], one-sided "
                    f"{side} bound {_fmt_num(c['bound'])} vs target {_fmt_num(c['target'])}, "
                    f"margin {_fmt_pct(c['margin'])}"
                )
            if rec["near_saturation"]:
                lines.append(
                    f"  near saturation: the capacity is {100 * rec['load_fraction']:.0f}% of the offline "
                    "throughput; little headroom for bursts"
                )
        else:
            at = "offline" if self.knob.per_unit else f"at {rec['capacity']:.0f} clients"
            lines.append(f"throughput {at}: {_fmt_ci(rec['output_throughput_tok_s'])} output tok/s")
        return "\n".join(lines)

    def figure(self):
        if self.goal == "knee":
            from sim.app.knee import knee_figure

            return knee_figure(self)
        return sizing_figure(self)


def _cap_ci(res: SizingResult, c: CandidateResult) -> dict[str, float] | None:
    """t-interval of the per-replication capacities, in the knob's unit (req/s, sessions/s or clients)."""
    from sim.app.replicate import t_interval

    caps = c.capacity_by_replication()
    if not caps:
        return None
    mean, lo, hi = t_interval(caps, res.level)
    return {"mean": mean, "ci_low": lo, "ci_high": hi}


def _ci(e: Evaluation | None, m: str) -> dict[str, float] | None:
    if e is None or m not in e.metrics:
        return None
    mean, lo, hi = e.metrics[m]
    return {"mean": mean, "ci_low": lo, "ci_high": hi}


def _min_margin(e: Evaluation | None) -> float | None:
    if e is None:
        return None
    ms = [c["margin"] for c in e.verdict.checks.values() if c.get("margin") is not None]
    return min(ms) if ms else None


def _load_fraction(knob: LoadKnob, c: CandidateResult) -> float | None:
    off = c.offline
    if off is None or c.capacity is None or knob.per_unit is None:
        return None
    top = off.metrics.get("request_throughput", (math.nan,))[0]
    return knob.req_rate(c.capacity) / top if top and top > 0 else None


def _fmt_num(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


def _fmt_pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:+.0f}%"


def _fmt_ci(ci: Mapping[str, Any] | None) -> str:
    if not ci:
        return "-"
    if ci.get("ci_low") is None or not math.isfinite(ci.get("ci_low") or math.nan):
        return _fmt_num(ci["mean"])
    return f"{_fmt_num(ci['mean'])} [{_fmt_num(ci['ci_low'])}, {_fmt_num(ci['ci_high'])}]"


def _fmt_slo(slo: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())


def sizing_figure(res: SizingResult):
    """Capacity per candidate (with the throughput CI), then P99 TTFT, P99 TPOT and throughput against
    offered load for every candidate (one colour per candidate in every panel), the SLOs dashed: the
    percentile targets (``p99_ttft_ms``) and, dotted, the per-request limits (``ttft_ms``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.app.report_style import SLO_COLOR, run_colors

    tab = res.table()
    names = [", ".join(f"{k.split('.')[-1]}={v}" for k, v in c.params.items()) for c in res.candidates]
    colors = run_colors(names)
    xlabel = "offered load (req/s)" if res.knob.per_unit else "concurrent clients"
    fig = make_subplots(
        rows=2, cols=2, vertical_spacing=0.14,
        subplot_titles=("capacity under the SLOs" if res.goal == "slo" else "offline throughput",
                        "P99 TTFT (ms, log)", "P99 TPOT (ms)", "throughput (req/s)"),
    )  # fmt: skip
    if res.goal == "slo":
        y = tab["request_throughput"].to_numpy(float)
        err = dict(type="data", symmetric=False, array=tab["request_throughput_hi"] - y,
                   arrayminus=y - tab["request_throughput_lo"])  # fmt: skip
    else:
        y = tab["offline_output_throughput"].to_numpy(float)
        err = dict(type="data", symmetric=False, array=tab["offline_output_throughput_hi"] - y,
                   arrayminus=y - tab["offline_output_throughput_lo"])  # fmt: skip
    fig.add_trace(go.Bar(x=names, y=y, error_y=err, marker_color=[colors[n] for n in names], showlegend=False,
                         marker_line_width=[4 if r else 0 for r in tab["recommended"]], marker_line_color="black",
                         text=["recommended" if r else "" for r in tab["recommended"]], textposition="outside"),
                  1, 1)  # fmt: skip
    fig.update_yaxes(title_text="req/s at capacity" if res.goal == "slo" else "output tok/s", row=1, col=1)
    for name, c in zip(names, res.candidates, strict=True):
        pts = [e for e in c.evaluations if not e.offline]
        if not pts:
            continue
        pts.sort(key=lambda e: e.x)
        xs = [e.offered_rate if res.knob.per_unit else e.x for e in pts]
        for (r, col), m in zip(((1, 2), (2, 1), (2, 2)), ("p99_ttft_ms", "p99_tpot_ms", "request_throughput"),
                               strict=True):  # fmt: skip
            ys = [e.metrics.get(m, (None,))[0] for e in pts]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, legendgroup=name,
                                     line={"color": colors[name]}, showlegend=(r, col) == (1, 2)), r, col)  # fmt: skip
    for key, (r, col), axis, log in (("ttft", (1, 2), 2, True), ("tpot", (2, 1), 3, False)):
        for slo_key, dash in ((f"p99_{key}_ms", "dash"), (f"{key}_ms", "dot")):
            target = res.slo.get(slo_key)
            if target is not None and float(target) > 0:
                fig.add_hline(y=float(target), line_dash=dash, line_color=SLO_COLOR, row=r, col=col)
                # an annotation on a log axis is placed by log10 of its value
                fig.add_annotation(x=0.01, xref=f"x{axis} domain", yref=f"y{axis}", showarrow=False,
                                   y=math.log10(float(target)) if log else float(target), yshift=8, xanchor="left",
                                   text=f"{slo_key} {float(target):g}", font={"color": SLO_COLOR})  # fmt: skip
    for r, col in ((1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(title_text=xlabel, row=r, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    what = f" for {_fmt_slo(res.slo)}" if res.slo else ""
    fig.update_layout(height=750, title=f"servesim size{what}" + (f"<br><sup>{res.label}</sup>" if res.label else ""))
    return fig
