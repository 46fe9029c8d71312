"""What the report figures share: one colour per series (the same in every subplot and figure), titles that
say which deployment ran (model, GPU, preset, workload), and when a latency axis needs a log scale."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from plotly.colors import qualitative

from sim.app.stats import clean_blocks, count_blocks, weighted_percentiles_blocks

RUN_PALETTE: tuple[str, ...] = tuple(qualitative.Plotly)
# Timeline series keep their colour across subplots and across runs.
SERIES_COLORS = {
    "KV usage": "#1f77b4",
    "cached, reusable (% of pool)": "#17becf",
    "swapped to CPU (% of pool)": "#7f7f7f",
    "running": "#2ca02c",
    "waiting": "#d62728",
    "prompt tok/s": "#9467bd",
    "generation tok/s": "#ff7f0e",
}
SLO_COLOR = "#d62728"
LOG_SPAN = 30.0  # max / p1 of a latency above which its axis is logarithmic (about 1.5 decades)


def run_colors(names: Iterable[str]) -> dict[str, str]:
    """A colour per run name, in order: the same run is the same colour in every panel."""
    return {n: RUN_PALETTE[i % len(RUN_PALETTE)] for i, n in enumerate(names)}


def spans_decades(samples: Iterable[tuple[np.ndarray, np.ndarray | None]], ratio: float = LOG_SPAN) -> bool:
    """True when the pooled positive values' maximum is over ``ratio`` times their 1st percentile
    (``samples``: (values, counts or None) pairs, or (a callable giving (values, counts) blocks, None)):
    on a linear axis the bulk would be squashed against the left edge (a fast policy's TTFT next to a
    queueing one's, decode gaps next to a prefill stall). Pooled a block at a time."""
    parts = list(samples)

    def positive() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for v, w in parts:
            for bv, bw in (v() if callable(v) else [(v, w)]):
                bv = np.asarray(bv, dtype=float)
                bw = np.ones(bv.size, dtype=np.int64) if bw is None else np.asarray(bw, dtype=np.int64)
                keep = np.isfinite(bv) & (bv > 0) & (bw > 0)
                yield bv[keep], bw[keep]

    # one pass for the count, the weight and the range (each pass reads every block), handed on
    kept, total, span = count_blocks(clean_blocks(positive))
    if kept < 2 or span is None:
        return False
    lo = float(weighted_percentiles_blocks(positive, [1.0], total, span)[0])
    return bool(lo > 0 and span[1] / lo > ratio)


def decades_from_ecdf(values: np.ndarray, cum_w: np.ndarray, total: int, ratio: float = LOG_SPAN) -> bool | None:
    """``spans_decades`` of one sample from its ECDF points (stats.ecdf_points: values at entry ranks from
    the first to the last, with the cumulated weight through each), or None where they cannot tell. The
    1st weighted percentile interpolates between the entries at two weight ranks, each found between
    the ECDF points around it; a big run's inter-token gaps need no further pass unless ``ratio`` times
    that value falls between those points."""
    if len(values) < 2:  # one point may stand for several entries: spans_decades counts them
        return None
    if not values[0] > 0:  # the sample is not all positive: spans_decades reads the positive part only
        return None
    h = (total - 1) * 0.01  # weighted_percentiles' virtual index, its two weight ranks
    lo_rank = int(np.floor(h))
    i = int(np.searchsorted(cum_w, lo_rank, side="right"))  # the first point past the lower rank's entry
    j = int(np.searchsorted(cum_w, min(lo_rank + 1, total - 1), side="right"))
    least, most = float(values[max(i - 1, 0)]), float(values[min(j, len(values) - 1)])
    top = float(values[-1])
    if top / most > ratio:  # the percentile is at most ``most``, so top over it is at least this
        return True
    if top / least <= ratio:
        return False
    return None


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def workload_label(wl: Mapping[str, Any]) -> str:
    """A few words for a ``[workload]`` table: its kind, load and size."""
    if not wl:
        return "default workload"
    kind = wl.get("kind", "trace" if "trace" in wl else "open")
    if kind == "trace" or "trace" in wl:
        text = f"trace {Path(str(wl.get('trace', '?'))).name}"
        if wl.get("rate_scale"):
            text += f" x{_num(wl['rate_scale'])} rate"
    elif kind == "closed":
        text = f"closed loop, {_num(wl.get('num_clients', '?'))} clients"
    elif kind == "sessions":
        text = f"sessions at {_num(wl.get('rate', '?'))}/s"
    elif "streams" in wl:
        text = "mixed streams"
    else:
        text = f"{wl.get('arrival', 'poisson')} {_num(wl.get('rate', '?'))} req/s"
    if wl.get("num_requests"):
        text += f", {_num(wl['num_requests'])} requests"
    return text


def run_label(config: Mapping[str, Any] | None, meta: Mapping[str, Any] | None = None, gpu: bool = True) -> str:
    """"model dtype · GPU TP=n · preset · workload" from a run's config and meta (a cluster too);
    ``gpu=False`` leaves the card out (a search over cards). One part per fact, so that several runs'
    labels can be reduced to what they share (common_label)."""
    cfg, meta = dict(config or {}), dict(meta or {})
    model_tab = cfg.get("model") or {}
    model = str(meta.get("model") or model_tab.get("name") or "model ?")
    if model_tab.get("dtype") and model_tab["dtype"] != "auto":
        model += f" {model_tab['dtype']}"
    hw = cfg.get("hardware") or {}
    gpus = sorted({str(r.get("gpu")) for r in meta.get("replicas") or [] if r.get("gpu")})
    card = " + ".join(gpus) if gpus else str(meta.get("gpu") or hw.get("gpu") or "GPU ?")
    tp = hw.get("tensor_parallel_size") or 1
    if tp and int(tp) > 1:
        card += f" TP={int(tp)}"
    eng = cfg.get("engine") or {}
    preset = str(eng.get("preset") or eng.get("policy") or "vllm")
    parts = [model, card, preset] if gpu else [model, preset]
    reps = meta.get("replicas")
    if isinstance(reps, list) and len(reps) > 1:
        parts.append(f"{len(reps)} replicas, router {meta.get('router', '?')}")
    wl = dict(cfg.get("workload") or {})
    n = (cfg.get("simulation") or {}).get("num_requests")
    if n:  # [simulation] num_requests caps the workload's
        wl["num_requests"] = n
    parts.append(workload_label(wl))
    return " · ".join(parts)


def common_label(labels: Iterable[str]) -> str:
    """The parts of several runs' labels that they all share (the deployment of a load sweep, say)."""
    split = [lab.split(" · ") for lab in labels]
    if not split:
        return ""
    return " · ".join(p for p in split[0] if all(p in s for s in split[1:]))
