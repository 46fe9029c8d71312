"""Vidur ``data/profiling/compute`` mlp.csv and attention.csv -> samples."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cost.calibrate.import_common import (
    _gpu_from_path,
    _label,
    _read_csv,
)
from sim.cost.calibrate.samples import Microbench, make_frame

# ---------------------------------------------------------------------------------------------- Vidur

_VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _vidur_time(df: pd.DataFrame, op: str) -> pd.Series | None:
    for stat in ("median", "mean"):
        col = f"time_stats.{op}.{stat}"
        if col in df.columns:
            return pd.to_numeric(df[col], errors="coerce") * 1e-3  # Vidur CudaTimer: milliseconds
    return None


def load_vidur_mlp(path: str | Path, *, gpu: str | None = None) -> Microbench:
    """Vidur ``mlp.csv``: per-token-count medians of the linear layers (ms). Zero/missing times are skipped."""
    p = Path(path)
    df = _read_csv(
        p, ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers")
    )
    label = _label(p)
    rows: list[dict[str, Any]] = []
    for op in _VIDUR_GEMMS:
        t = _vidur_time(df, op)
        if t is None:
            continue
        for r, ts in zip(df.itertuples(), t, strict=True):
            if not (ts > 0):
                continue
            tp = int(r.num_tensor_parallel_workers)
            H, nh, nkv = float(r.n_embd), r.n_head / tp, max(1, math.ceil(r.n_kv_head / tp))
            hd = r.n_embd / r.n_head
            inter = r.n_expanded_embd / tp
            gated = bool(getattr(r, "use_gated_mlp", True))
            k, n = {
                "attn_pre_proj": (H, (nh + 2 * nkv) * hd),
                "attn_post_proj": (nh * hd, H),
                "mlp_up_proj": (H, (2 if gated else 1) * inter),
                "mlp_down_proj": (inter, H),
            }[op]
            rows.append(
                dict(
                    op="gemm", name=op, file=label, time_s=ts, m=r.num_tokens, k=k, n=n, w_bytes=2, a_bytes=2
                )
            )
    gname = gpu or _gpu_from_path(p) or "unknown"
    return Microbench(gname, make_frame(rows), {"format": "vidur-mlp", "path": str(p), "notes": []})


def load_vidur_attention(path: str | Path, *, gpu: str | None = None) -> Microbench:
    """Vidur ``attention.csv``: ``attn_prefill`` (batch 1, chunk after kv_cache_size) and ``attn_decode``."""
    p = Path(path)
    df = _read_csv(
        p,
        (
            "n_embd",
            "n_q_head",
            "n_kv_head",
            "num_tensor_parallel_workers",
            "batch_size",
            "prefill_chunk_size",
            "kv_cache_size",
            "is_prefill",
        ),
    )
    tpf, tdc = _vidur_time(df, "attn_prefill"), _vidur_time(df, "attn_decode")
    label = _label(p)
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(df.itertuples()):
        tp = int(r.num_tensor_parallel_workers)
        heads = dict(
            nh=r.n_q_head / tp,
            nkv=max(1, math.ceil(r.n_kv_head / tp)),
            hd=r.n_embd / r.n_q_head,
            kv_bytes=2,
            a_bytes=2,
        )
        prefill = str(r.is_prefill).lower() in ("true", "1")
        t = tpf if prefill else tdc
        ts = float(t.iloc[i]) if t is not None else math.nan
        if not (ts > 0):
            continue
        if prefill:
            rows.append(
                dict(
                    op="attn_prefill",
                    name="attn_prefill",
                    file=label,
                    time_s=ts,
                    chunk=r.prefill_chunk_size,
                    kv_prefill=r.kv_cache_size,
                    n_decode=0,
                    kv_decode=0,
                    **heads,
                )
            )
        else:
            rows.append(
                dict(
                    op="attn_decode",
                    name="attn_decode",
                    file=label,
                    time_s=ts,
                    n_decode=r.batch_size,
                    kv_decode=r.kv_cache_size,
                    chunk=0,
                    kv_prefill=0,
                    **heads,
                )
            )
    gname = gpu or _gpu_from_path(p) or "unknown"
    return Microbench(gname, make_frame(rows), {"format": "vidur-attention", "path": str(p), "notes": []})
