"""The one table every microbenchmark source is turned into, so the fitter reads a single format.

A *sample* is one timed operator call on one GPU: ``op`` says which term of the cost model it measures,
the shape columns say what it computed (per GPU, i.e. after tensor-parallel splitting), ``time_s`` how long
it took. Columns that do not apply to an op are NaN. The same table, written as CSV with a ``meta.json``
beside it, is what ``servesim calibrate`` produces (``samples.csv``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError

# Operators and the cost-model term each one calibrates (sim/cost/costmodel.py).
OPS: dict[str, str] = {
    "gemm": "linear layers and LM head: smooth roofline (eta_compute, eta_bandwidth, roofline_p, t0_gemm_s)",
    "attn_decode": "decode attention per layer (attn_t0_s, eta_kv, attn_per_seq_s, attn_ctx_pad_tokens)",
    "attn_prefill": "prefill attention per layer (eta_fa, prefill_kv_floor, prefill_kv_sat_tokens)",
    "attn_mixed": "one prefill chunk plus decodes in one kernel (mixed_decode_gqa_reread)",
    "elementwise_layer": "norms, RoPE, SiLU·mul of one layer (eta_elementwise, layer_fixed_s)",
    "elementwise_step": "embedding + final norm, once per step (eta_elementwise, step_elementwise_fixed_s)",
    "sampler": "sampler vs sequences (sampler_t0_s, sampler_bytes_per_elem)",
    "copy": "device memory copy (diagnostic: achievable bandwidth)",
    "allreduce": "tensor-parallel all-reduce (allreduce_latency_s, allreduce_bw_eff)",
    "step_overhead": "CPU cost of one scheduling step (step_overhead_s, per_seq_overhead_s)",
}

# Shape columns (all per GPU). m: tokens (GEMM rows, elementwise tokens) or sequences (sampler, overhead).
SHAPE_COLUMNS = (
    "m",
    "k",
    "n",
    "n_decode",
    "kv_decode",
    "chunk",
    "kv_prefill",
    "nh",
    "nkv",
    "hd",
    "hidden",
    "inter",
    "vocab",
    "nbytes",
    "tp",
    "w_bytes",
    "a_bytes",
    "kv_bytes",
)
COLUMNS = ("op", "name", "file", "time_s", *SHAPE_COLUMNS)


def make_frame(rows: Iterable[dict[str, Any]] | pd.DataFrame, file: str = "") -> pd.DataFrame:
    """Rows (dicts or a frame with a subset of COLUMNS) -> a frame with exactly COLUMNS, checked."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = "" if c in ("name", "file") else np.nan
    df = df[list(COLUMNS)].copy()
    for c in ("name", "file"):
        df[c] = ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in df[c]]
    if file:
        df["file"] = [f or file for f in df["file"]]
    raw = {c: df[c].copy() for c in ("time_s", *SHAPE_COLUMNS)}  # as given, for the messages
    where = f"{file}: " if file else ""
    for c in ("time_s", *SHAPE_COLUMNS):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    bad_op = ~df["op"].isin(list(OPS))
    if bad_op.any():
        i = int(np.flatnonzero(bad_op.to_numpy())[0])
        raise TraceFormatError(f"sample row {i}: op {df['op'].iloc[i]!r}: expected one of {sorted(OPS)}")
    t = df["time_s"].to_numpy()
    bad = ~(np.isfinite(t) & (t > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceFormatError(f"{where}sample row {i} ({df['op'].iloc[i]}): time_s {_given(raw['time_s'], i)}; "
                               "allowed: a number of seconds > 0")
    for c in SHAPE_COLUMNS:  # a shape is a count: empty where the operator has none, else a number >= 0
        v = df[c].to_numpy()
        text = raw[c].to_numpy()
        given = np.array([not _blank(x) for x in text], dtype=bool)
        bad = given & ~(np.isfinite(v) & (v >= 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceFormatError(f"{where}sample row {i} ({df['op'].iloc[i]}): {c} {_given(raw[c], i)}; allowed: "
                                   "a number >= 0, or empty where the operator has no such dimension")
    return df.reset_index(drop=True)


_NA_TEXT = frozenset({"", "nan", "na", "n/a", "<na>", "none", "null", "-"})  # what a table says for "no value"


def _blank(x: Any) -> bool:
    """No value in a shape column: missing, a NaN of any kind, or text that says so."""
    if isinstance(x, str):
        return x.strip().lower() in _NA_TEXT
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _given(col: pd.Series, i: int) -> str:
    """Row ``i``'s value as the file gave it (text as text, numbers as numbers, not numpy's repr)."""
    x = col.iloc[i]
    if isinstance(x, np.generic):
        x = x.item()
    return f"{x!r}"


@dataclass
class Microbench:
    """Samples measured on one GPU, with where they came from."""

    gpu: str  # catalogue name when known, else what the source called it
    samples: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)  # versions, device, source files, notes

    def select(self, ops: Iterable[str] | None) -> Microbench:
        if ops is None:
            return self
        ops = list(ops)
        for op in ops:
            if op not in OPS:
                raise TraceFormatError(f"unknown operator {op!r}; known: {', '.join(OPS)}")
        return Microbench(self.gpu, self.samples[self.samples.op.isin(ops)].reset_index(drop=True), self.meta)

    def save(self, directory: str | Path) -> Path:
        """Write ``samples.csv`` and ``meta.json`` into ``directory`` (created)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.samples.to_csv(d / "samples.csv", index=False)
        (d / "meta.json").write_text(json.dumps({"gpu": self.gpu, **self.meta}, indent=2, default=str) + "\n")
        return d / "samples.csv"


def merge(benches: Iterable[Microbench]) -> Microbench:
    """Concatenate sources measured on the same GPU; metadata is kept per source file."""
    bl = list(benches)
    if not bl:
        raise TraceFormatError("no microbenchmark data to merge")
    gpus = sorted({b.gpu for b in bl})
    if len(gpus) > 1:
        raise TraceFormatError(f"microbenchmarks from different GPUs cannot be fitted together: {gpus}")
    frames = [b.samples for b in bl if len(b.samples)]
    samples = pd.concat(frames, ignore_index=True) if frames else make_frame([])
    meta = {"sources": [b.meta for b in bl]}
    return Microbench(gpus[0], samples, meta)


def load_samples_csv(path: str | Path) -> Microbench:
    """A ``samples.csv`` written by ``servesim calibrate`` (``meta.json`` beside it, optional)."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except (OSError, pd.errors.ParserError) as e:
        raise TraceFormatError(f"{p}: cannot read samples CSV ({e})") from None
    missing = [c for c in ("op", "time_s") if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{p}: missing column(s) {missing}")
    meta: dict[str, Any] = {}
    mp = p.parent / "meta.json"
    if mp.is_file():
        try:
            meta = json.loads(mp.read_text())
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{mp}: invalid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise TraceFormatError(f"{mp}: expected a JSON object (gpu, versions, ...), got a {type(meta).__name__}")
    gpu = str(meta.pop("gpu", "unknown"))
    meta.setdefault("format", "servesim-samples")
    meta["path"] = str(p)
    return Microbench(gpu, make_frame(df, file=p.name), meta)  # rows without a file label get the file name
