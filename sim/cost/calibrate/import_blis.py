"""BLIS / InferSim attention microbenchmarks (FlashInfer decode and prefill CSVs) -> samples."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import ServesimError, TraceFormatError
from sim.cost.calibrate.import_common import (
    _DTYPE_BYTES,
    _gpu_from_path,
    _label,
    _read_csv,
)
from sim.cost.calibrate.samples import Microbench, make_frame
from sim.cost.hardware import GpuSpec, get_gpu

# ---------------------------------------------------------------------------------------------- BLIS / InferSim


def implied_peak(flops: np.ndarray, seconds: np.ndarray, mfu: np.ndarray) -> float:
    """The peak FLOP/s a file's ``mfu`` column was normalised to: Σ achieved FLOP/s / Σ mfu over rows with
    mfu > 0 (a ratio of sums, so rows whose mfu is rounded to one or two digits weigh little)."""
    ok = np.isfinite(mfu) & (mfu > 0)
    if not ok.any():
        return math.nan
    return float((flops[ok] / seconds[ok]).sum() / mfu[ok].sum())


def mfu_units(peak: float, gpu: GpuSpec | None) -> str:
    """Which spec-sheet peak an 'mfu' column is relative to: 'bf16', 'fp8' or 'unknown' (costmodel.md §3)."""
    if gpu is None or not math.isfinite(peak):
        return "unknown"
    for label, ref in (("bf16", gpu.bf16_flops), ("fp8", gpu.fp8_flops)):
        if ref and abs(peak / ref - 1.0) < 0.1:
            return label
    return "unknown"


def load_blis_attention(path: str | Path, *, gpu: str | None = None) -> Microbench:
    """One BLIS/InferSim attention CSV: decode (``<nh>-<nkv>-<hd>-tp<N>.csv``) or prefill (``<nh>-<nkv>-<hd>.csv``).

    Only ``latency_us`` is fitted. The ``mfu`` column is checked against the spec-sheet peaks and the result
    recorded in the metadata, because public files differ on whether it is relative to BF16 or FP8.
    """
    p = Path(path)
    m = re.fullmatch(r"(\d+)-(\d+)-(\d+)(?:-tp(\d+))?\.csv", p.name)
    if not m:
        raise TraceFormatError(
            f"{p}: expected a name like 32-8-128-tp1.csv (decode) or 32-8-128.csv (prefill)"
        )
    nh, nkv, hd = (int(x) for x in m.groups()[:3])
    tp = int(m.group(4) or 1)
    gname = gpu or _gpu_from_path(p) or "unknown"
    try:
        spec = get_gpu(gname)
    except ServesimError:
        spec = None
    label = _label(p)
    heads = dict(nh=nh / tp, nkv=max(1, math.ceil(nkv / tp)), hd=hd, a_bytes=2)
    df = _read_csv(p, ("latency_us",))
    t = df.latency_us.to_numpy(float) * 1e-6
    rows: list[dict[str, Any]] = []
    if "batch_size" in df.columns and "kv_len" in df.columns:
        kvb = [_DTYPE_BYTES.get(str(x).lower(), 2) for x in df.get("kv_dtype", pd.Series(["bf16"] * len(df)))]
        for b, kv, ts, kb in zip(df.batch_size, df.kv_len, t, kvb, strict=True):
            rows.append(
                dict(
                    op="attn_decode",
                    name="decode",
                    file=label,
                    time_s=ts,
                    n_decode=b,
                    kv_decode=kv,
                    chunk=0,
                    kv_prefill=0,
                    kv_bytes=kb,
                    **heads,
                )
            )
        flops = 4.0 * heads["nh"] * hd * df.batch_size.to_numpy(float) * df.kv_len.to_numpy(float)
    elif "seq_len" in df.columns:
        for s, ts in zip(df.seq_len, t, strict=True):
            rows.append(
                dict(
                    op="attn_prefill",
                    name="prefill",
                    file=label,
                    time_s=ts,
                    chunk=s,
                    kv_prefill=0,
                    n_decode=0,
                    kv_decode=0,
                    kv_bytes=2,
                    **heads,
                )
            )
        s = df.seq_len.to_numpy(float)
        flops = 4.0 * heads["nh"] * hd * s * s / 2  # causal
    else:
        raise TraceFormatError(f"{p}: neither decode (batch_size, kv_len) nor prefill (seq_len) columns")
    peak = implied_peak(flops, t, df["mfu"].to_numpy(float)) if "mfu" in df.columns else math.nan
    units = mfu_units(peak, spec)
    info = {
        "format": "blis-attention",
        "path": str(p),
        "heads": f"{nh}-{nkv}-{hd}",
        "tp": tp,
        "mfu_implied_peak_tflops": None if math.isnan(peak) else round(peak / 1e12, 1),
        "mfu_units": units,
        "notes": [],
    }
    if units == "fp8":
        info["notes"].append(f"{label}: mfu column is normalised to the FP8 peak (ignored; latency fitted)")
    return Microbench(gname, make_frame(rows), info)
