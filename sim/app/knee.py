"""The knee of the throughput curve over ``max_num_seqs``: the seeds' "sweet spot" (seeds/002: "找到那条
吞吐曲线开始变平的那个拐点，把 batch 卡在那儿").

Definition. For settings x₁ < x₂ < ... with throughputs T, the gain per doubling between neighbours is
``(T[i+1] / T[i]) ** (1 / log2(x[i+1] / x[i])) − 1`` (so +100 % is linear scaling, 0 is flat, and settings
that are not powers of two compare fairly). The knee is the smallest x past which every step gains less
than ``gain`` (default 10 %) per doubling. The seeds add "while latency and memory keep growing": the knee
reports how much the latency (median TPOT) and the memory (mean KV-cache usage) grow from the knee to the
largest setting; when neither grows the setting has stopped binding (the KV pool or the offered load caps
the batch) and the knee says so. No knee when the last step still gains ``gain`` or more.

Used by ``servesim size --goal knee`` (offline runs, or the configured clients of a closed loop, per
``max_num_seqs``) and by ``servesim sweep`` (a ``knee`` column whenever the grid has engine.max_num_seqs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError

if TYPE_CHECKING:
    from sim.app.sizing_report import SizingResult

DEFAULT_KNEE_GAIN = 0.10
GROWS = 0.02  # a latency or memory rise of more than 2 % from the knee to the end counts as growing
SEQS_KEY = "engine.max_num_seqs"
THROUGHPUT, LATENCY, MEMORY = "output_throughput", "median_tpot_ms", "mean_kv_cache_usage"


@dataclass(frozen=True)
class Knee:
    """The knee of one curve; ``max_num_seqs`` None when the curve never flattens in the range tried."""

    max_num_seqs: int | None
    index: int | None
    gain: float
    settings: list[int]
    throughput: list[float]
    gains: list[float | None]  # per setting: gain per doubling to the next one (None for the last)
    latency_growth: float | None = None  # relative, knee -> largest setting
    memory_growth: float | None = None
    reason: str = ""
    group: dict[str, Any] = field(default_factory=dict)  # the other settings of the curve

    def to_dict(self) -> dict[str, Any]:
        from sim.app.results import to_jsonable

        return to_jsonable(self.__dict__)


def check_gain(gain: float) -> float:
    if isinstance(gain, bool) or not isinstance(gain, int | float) or not 0 < gain < 1:
        raise ConfigError(f"--knee-gain: the throughput gain per doubling must be in (0, 1), got {gain!r}; "
                          "e.g. 0.1 for 10 %")  # fmt: skip
    return float(gain)


def gains_per_doubling(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Gain per doubling between consecutive points (module doc); len(x) − 1 values."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    out = np.empty(max(len(x) - 1, 0))
    for i in range(len(out)):
        if y[i] <= 0:
            out[i] = math.inf if y[i + 1] > 0 else 0.0
        else:
            out[i] = (y[i + 1] / y[i]) ** (1.0 / math.log2(x[i + 1] / x[i])) - 1.0
    return out


def _growth(v: Sequence[float] | None, k: int) -> float | None:
    if v is None:
        return None
    a, b = float(v[k]), float(v[-1])
    return (b - a) / a if math.isfinite(a) and math.isfinite(b) and a > 0 else None


def find_knee(
    settings: Sequence[int],
    throughput: Sequence[float],
    latency: Sequence[float] | None = None,
    memory: Sequence[float] | None = None,
    gain: float = DEFAULT_KNEE_GAIN,
    group: dict[str, Any] | None = None,
) -> Knee:
    """The knee of one curve (module doc). ``settings`` distinct max_num_seqs values, any order."""
    gain = check_gain(gain)
    order = np.argsort(np.asarray(settings, dtype=float), kind="stable")
    x = [int(settings[i]) for i in order]
    if len(set(x)) != len(x) or any(v < 1 for v in x):
        raise ConfigError(f"knee: max_num_seqs values must be distinct integers >= 1, got {x}")
    t = [float(throughput[i]) for i in order]
    lat = None if latency is None else [float(latency[i]) for i in order]
    mem = None if memory is None else [float(memory[i]) for i in order]
    g = gains_per_doubling(x, t)
    gains: list[float | None] = [float(v) for v in g] + [None]
    base = dict(gain=gain, settings=x, throughput=t, gains=gains, group=dict(group or {}))
    if len(x) < 2:
        return Knee(None, None, reason="one setting: no curve", **base)
    below = g < gain
    k = next((i for i in range(len(g)) if below[i:].all()), None)
    if k is None:
        return Knee(None, None, reason=f"throughput still gains {100 * g[-1]:.0f}% per doubling at "
                                       f"max_num_seqs {x[-1]}: try larger settings", **base)  # fmt: skip
    lg, mg = _growth(lat, k), _growth(mem, k)
    grows = [v for v in (lg, mg) if v is not None and v > GROWS]
    if grows:
        parts = [f"{name} +{100 * v:.0f}%" for name, v in (("latency", lg), ("memory", mg)) if v is not None]
        reason = f"past it throughput gains < {100 * gain:.0f}% per doubling while " + ", ".join(parts)
    else:
        reason = (f"past it throughput gains < {100 * gain:.0f}% per doubling and neither latency nor memory "
                  "grows: the setting no longer binds (the KV pool or the load caps the batch)")  # fmt: skip
    return Knee(x[k], k, latency_growth=lg, memory_growth=mg, reason=reason, **base)


# ---- sizing (servesim size --goal knee) -------------------------------------------------------------------
def knee_candidates(top: int, limit: int = 10) -> list[int]:
    """Powers of two from 1 up to ``top`` (at most ``limit`` of them, the largest kept)."""
    seqs = [2**k for k in range(0, int(math.log2(max(top, 1))) + 1)]
    return seqs[-limit:]


def _point(c: Any) -> Any:
    """The evaluation a knee reads: the offline run, else the single fixed-load run (closed loop)."""
    return c.offline or (c.evaluations[0] if c.evaluations else None)


def sizing_knees(cands: Sequence[Any], gain: float) -> list[Knee]:
    """One knee per group of candidates that differ only in max_num_seqs."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cands):
        key = tuple((k, repr(v)) for k, v in c.params.items() if k != SEQS_KEY)
        groups.setdefault(key, []).append(i)
    knees = []
    for idx in groups.values():
        pts = [(cands[i].params[SEQS_KEY], _point(cands[i])) for i in idx]
        pts = [(s, e) for s, e in pts if e is not None]

        def col(m: str) -> list[float]:
            return [e.metrics.get(m, (math.nan,))[0] for _, e in pts]  # noqa: B023

        other = {k: v for k, v in cands[idx[0]].params.items() if k != SEQS_KEY}
        knees.append(find_knee([s for s, _ in pts], col(THROUGHPUT), col(LATENCY), col(MEMORY), gain, other))
    return knees


def knee_index(cands: Sequence[Any], knees: Sequence[Knee]) -> int | None:
    """The candidate to recommend: the knee with the most throughput across groups."""
    best, best_tp = None, -math.inf
    for k in knees:
        if k.max_num_seqs is None:
            continue
        i = next(j for j, c in enumerate(cands) if c.params[SEQS_KEY] == k.max_num_seqs
                 and all(c.params.get(a) == b for a, b in k.group.items()))  # fmt: skip
        if k.throughput[k.index] > best_tp:
            best, best_tp = i, k.throughput[k.index]
    return best


def knee_rows(res: SizingResult) -> dict[int, dict[str, Any]]:
    """Per candidate index: its gain per doubling to the next setting and whether it is its curve's knee."""
    out: dict[int, dict[str, Any]] = {}
    for k in res.knees:
        for j, c in enumerate(res.candidates):
            if all(c.params.get(a) == b for a, b in k.group.items()) and c.params[SEQS_KEY] in k.settings:
                pos = k.settings.index(c.params[SEQS_KEY])
                out[j] = {"gain_per_doubling": k.gains[pos], "knee": k.max_num_seqs == c.params[SEQS_KEY]}
    return out


def format_knees(res: SizingResult) -> list[str]:
    lines = []
    for k in res.knees:
        where = ", ".join(f"{a.split('.')[-1]}={b}" for a, b in k.group.items())
        head = f"knee{' (' + where + ')' if where else ''}: "
        lines.append(head + (f"max_num_seqs={k.max_num_seqs}; {k.reason}" if k.max_num_seqs else k.reason))
    return lines


def knee_figure(res: SizingResult):
    """Throughput, median TPOT and KV-cache usage against max_num_seqs (log2 axis), knees marked."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.app.report_style import run_colors

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("output throughput (tok/s)", "median TPOT (ms)", "mean KV-cache usage"))  # fmt: skip
    names = [", ".join(f"{a.split('.')[-1]}={b}" for a, b in k.group.items()) or "curve" for k in res.knees]
    colors = run_colors(names)  # one colour per curve in every panel
    for name, k in zip(names, res.knees, strict=True):
        idx = [j for j, c in enumerate(res.candidates) if all(c.params.get(a) == b for a, b in k.group.items())]
        idx.sort(key=lambda j: res.candidates[j].params[SEQS_KEY])
        xs = [res.candidates[j].params[SEQS_KEY] for j in idx]
        for row, m in ((1, THROUGHPUT), (2, LATENCY), (3, MEMORY)):
            ys = [(_point(res.candidates[j]).metrics.get(m, (None,))[0] if _point(res.candidates[j]) else None)
                  for j in idx]  # fmt: skip
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, legendgroup=name,
                                     line={"color": colors[name]}, showlegend=row == 1), row, 1)  # fmt: skip
        if k.max_num_seqs is not None:
            fig.add_vline(x=k.max_num_seqs, line_dash="dash", line_color=colors[name])
            # an annotation on a log axis is placed by log10 of its value
            fig.add_annotation(x=math.log10(k.max_num_seqs), y=k.throughput[k.index], text=f"knee {k.max_num_seqs}",
                               showarrow=True, row=1, col=1)  # fmt: skip
    fig.update_xaxes(type="log", dtick=math.log10(2))  # every row: the shared axes must agree
    fig.update_xaxes(title_text="max_num_seqs", row=3, col=1)
    what = f": {res.label}" if getattr(res, "label", "") else ""
    fig.update_layout(height=800, title=f"servesim size --goal knee{what}: gain per doubling < {100 * res.knee_gain:.0f}%")
    return fig


# ---- sweeps ----------------------------------------------------------------------------------------------
def sweep_knees(df: pd.DataFrame, grid_keys: Sequence[str], gain: float = DEFAULT_KNEE_GAIN) -> pd.DataFrame:
    """Per sweep point: ``gain_per_doubling`` and ``knee`` (True at its curve's knee), curves being the
    points that differ only in engine.max_num_seqs (means over the replications). Empty without that axis."""
    if SEQS_KEY not in grid_keys:
        return pd.DataFrame(columns=["point", "gain_per_doubling", "knee"])
    ok = df[df["error"].isna()] if "error" in df.columns else df
    others = [k for k in grid_keys if k != SEQS_KEY]
    cols = [c for c in (THROUGHPUT, LATENCY, MEMORY) if c in ok.columns]
    means = ok.groupby(["point", SEQS_KEY, *others], dropna=False)[cols].mean().reset_index()
    rows = []
    for _, g in (means.groupby(others, dropna=False) if others else [((), means)]):
        lat, mem = (list(g[c]) if c in g else None for c in (LATENCY, MEMORY))
        k = find_knee(list(g[SEQS_KEY]), list(g[THROUGHPUT]), lat, mem, gain)
        for p, s in zip(g["point"], g[SEQS_KEY], strict=True):
            pos = k.settings.index(int(s))
            rows.append({"point": p, "gain_per_doubling": k.gains[pos], "knee": k.max_num_seqs == int(s)})
    return pd.DataFrame(rows)
