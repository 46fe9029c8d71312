"""How a card search is presented: the ranked table (cheapest deployment that carries the target first),
JSON, a text digest and a plotly figure of capacity against cost (sim/app/card_search.py does the search)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from sim.app.card_search import DeploymentResult
from sim.app.cost_metrics import per_million
from sim.app.sizing_report import Evaluation, _fmt_num, _min_margin


def _metric(e: Evaluation | None, m: str) -> float | None:
    if e is None or m not in e.metrics:
        return None
    v = e.metrics[m][0]
    return v if math.isfinite(v) else None


@dataclass
class CardSearchResult:
    cfg: Any
    knob: Any
    slo: dict[str, float]
    goal: str
    target: float
    target_unit: str  # "req/s" | "clients"
    results: list[DeploymentResult]
    replications: int
    level: float
    num_simulations: int
    wall_time_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def currency(self) -> str:
        return self.results[0].price.currency if self.results else "USD"

    def _row(self, r: DeploymentResult) -> dict[str, Any]:
        d, c = r.deployment, r.chosen
        at = (c.offline if self.goal == "throughput" else c.at_capacity) if c else None
        unit_tps = _metric(at, "output_throughput")
        chk = r.target_check.evaluations[0] if r.target_check and r.target_check.evaluations else None
        dep_tps = None if chk is None or r.units is None else (_metric(chk, "output_throughput") or 0) * r.units
        cap = None
        if c is not None:
            cap = (_metric(c.offline, "request_throughput") if self.goal == "throughput"
                   else (self.knob.req_rate(c.capacity) if self.knob.per_unit else c.capacity))  # fmt: skip
        ci = _cap_ci(self, r)
        return {
            "deployment": d.label, "gpu": d.gpu, "dtype": d.dtype, "kv_cache_dtype": d.kv_cache_dtype,
            "tensor_parallel_size": d.tp, "instances_per_gpu": d.instances, "fits": r.fits, "kernel": r.kernel,
            "kv_tokens_per_instance": r.kv_tokens,
            "max_num_seqs": c.params.get("engine.max_num_seqs") if c else None,
            f"capacity_{self.target_unit}": cap, "capacity_lo": ci[0], "capacity_hi": ci[1],
            "units": r.units, "gpus": r.gpus,
            "gpus_lo": None if r.units_range[0] is None else r.units_range[0] * d.tp,
            "gpus_hi": None if r.units_range[1] is None else r.units_range[1] * d.tp,
            "price_per_gpu_hour": r.price.per_hour, "cost_per_hour": r.cost_per_hour,
            "cost_per_month": None if r.cost_per_hour is None else r.cost_per_hour * _hpm(self),
            "output_tok_s_at_capacity": unit_tps,
            "cost_per_1m_output_at_capacity": per_million(d.tp * r.price.per_hour, unit_tps),
            "cost_per_1m_output_at_target": per_million(r.cost_per_hour, dep_tps),
            "meets_slo_at_target": None if chk is None else chk.verdict.passed,
            "slo_margin_at_target": _min_margin(chk),
            "slo_checks_at_target": None if chk is None else chk.verdict.checks,
            "reason": r.reason or None, "price_source": r.price.source, "price_date": r.price.date,
        }  # fmt: skip

    def table(self) -> pd.DataFrame:
        """One row per deployment, ranked: those that carry the target, cheapest per hour first."""
        rows = [self._row(r) for r in self.results]
        df = pd.DataFrame(rows)
        if df.empty:
            return df
        inf = math.inf
        df["_k"] = [(r["gpus"] is None, r["meets_slo_at_target"] is False,
                     r["cost_per_hour"] if r["cost_per_hour"] is not None else inf,
                     r["cost_per_1m_output_at_capacity"] or inf) for r in rows]  # fmt: skip
        df = df.sort_values("_k", kind="stable").drop(columns="_k").reset_index(drop=True)
        df.insert(0, "rank", [i + 1 if pd.notna(g) else None for i, g in enumerate(df["gpus"])])
        for col in ("rank", "max_num_seqs", "units", "gpus", "gpus_lo", "gpus_hi", "kv_tokens_per_instance"):
            df[col] = df[col].astype("Int64")  # counts stay integers next to the missing ones
        return df

    @property
    def best(self) -> dict[str, Any] | None:
        tab = self.table()
        if tab.empty or pd.isna(tab["gpus"].iloc[0]):
            return None
        return {k: (None if v is pd.NA else v) for k, v in tab.iloc[0].to_dict().items()}

    def to_dict(self) -> dict[str, Any]:
        from sim.app.results import to_jsonable

        return to_jsonable({
            "goal": self.goal, "slo": self.slo, "target": self.target, "target_unit": self.target_unit,
            "currency": self.currency, "replications": self.replications, "confidence_level": self.level,
            "num_simulations": self.num_simulations, "wall_time_s": self.wall_time_s, "notes": self.notes,
            "best": self.best, "deployments": self.table().to_dict("records"),
            "curves": {r.deployment.label: [{**c.params, **e.row()} for c in r.candidates for e in c.evaluations]
                       for r in self.results if r.candidates},
        })  # fmt: skip

    def format(self) -> str:
        what = "the SLOs " + ", ".join(f"{k} <= {v:g}" for k, v in self.slo.items()) if self.goal == "slo" \
            else "offline throughput"
        lines = [f"card search for {_fmt_num(self.target)} {self.target_unit} under {what}: {len(self.results)} "
                 f"deployments, {self.replications} replications, {self.num_simulations} simulations in "
                 f"{self.wall_time_s:.1f} s; costs in {self.currency}", *(f"note: {n}" for n in self.notes)]  # fmt: skip
        tab = self.table()
        cols = ["rank", "deployment", "max_num_seqs", f"capacity_{self.target_unit}", "gpus", "gpus_lo", "gpus_hi",
                "price_per_gpu_hour", "cost_per_hour", "cost_per_month", "cost_per_1m_output_at_capacity",
                "slo_margin_at_target", "reason"]  # fmt: skip
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
            lines.append(tab[[c for c in cols if c in tab]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        b = self.best
        if b is None:
            lines.append("no deployment carries the target: every candidate misses the memory or the SLOs")
        else:
            margin = b["slo_margin_at_target"]
            lines.append(
                f"cheapest: {b['deployment']} with max_num_seqs={b['max_num_seqs']}: {b['gpus']} GPU(s) "
                f"({100 * self.level:.10g}% interval [{b['gpus_lo'] or '-'}, {b['gpus_hi'] or 'unbounded'}]), "
                f"{b['cost_per_hour']:.4g} {self.currency}/h "
                f"({b['cost_per_month']:.0f}/month), {_fmt_num(b['cost_per_1m_output_at_capacity'])} per 1M output "
                f"tokens at capacity" + ("" if margin is None else f", SLO margin at the target {100 * margin:+.0f}%")
            )  # fmt: skip
        return "\n".join(lines)

    def figure(self):
        """Capacity per GPU (with its interval) against the price per GPU-hour, and the cost of carrying the
        target per deployment (ranked)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        tab = self.table()
        ok = tab[tab["gpus"].notna()] if not tab.empty else tab
        capcol = f"capacity_{self.target_unit}"
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
            f"capacity per GPU ({self.target_unit}) vs price", f"cost of {_fmt_num(self.target)} {self.target_unit}"))  # fmt: skip
        if not ok.empty:
            per_gpu = ok[capcol] / ok["tensor_parallel_size"]
            tp = ok["tensor_parallel_size"]  # (the pooled capacity can sit outside the per-replication interval)
            err = dict(type="data", symmetric=False, array=(ok["capacity_hi"] / tp - per_gpu).clip(lower=0),
                       arrayminus=(per_gpu - ok["capacity_lo"] / tp).clip(lower=0))  # fmt: skip
            fig.add_trace(go.Scatter(x=per_gpu, y=ok["price_per_gpu_hour"], mode="markers+text", text=ok["deployment"],
                                     textposition="top center", error_x=err, showlegend=False), 1, 1)  # fmt: skip
            fig.add_trace(go.Bar(x=ok["deployment"], y=ok["cost_per_hour"], text=ok["gpus"].astype(int).astype(str)
                                 + " GPU", showlegend=False,
                                 marker_color=["#2ca02c"] + ["#1f77b4"] * (len(ok) - 1)), 1, 2)  # fmt: skip
        fig.update_xaxes(title_text=f"{self.target_unit} per GPU under the SLOs", row=1, col=1)
        fig.update_yaxes(title_text=f"{self.currency} per GPU-hour", row=1, col=1)
        fig.update_yaxes(title_text=f"{self.currency} per hour", row=1, col=2)
        from sim.app.report_style import run_label

        what = run_label(self.cfg.to_dict(), gpu=False) if hasattr(self.cfg, "to_dict") else ""
        fig.update_layout(height=600, title="servesim size --gpus: which card, how many, at what cost"
                          + (f"<br><sup>{what}</sup>" if what else ""))  # fmt: skip
        return fig


def _hpm(res: CardSearchResult) -> float:
    cost = getattr(res.cfg, "cost", None)
    return cost.hours_per_month if cost is not None else 730.0


def _cap_ci(res: CardSearchResult, r: DeploymentResult) -> tuple[float | None, float | None]:
    from sim.app.card_search import _capacity_ci

    if r.chosen is None:
        return None, None
    _, lo, hi = _capacity_ci(r, res.knob, res.goal, res.level)
    return (lo if math.isfinite(lo) else None), (hi if math.isfinite(hi) else None)
