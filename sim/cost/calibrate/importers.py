"""Public microbenchmark formats -> samples (sim/cost/calibrate/samples.py).

Formats (shared/data/README.md, costmodel.md §1.1):

* LLMServingSim ``profiler/perf/<HW>/<org>/<model>/<variant>/tp<N>/``: ``dense.csv`` (layer, tokens, time_us),
  ``attention.csv`` (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us), ``per_sequence.csv``
  (layer, sequences, time_us); ``meta.yaml`` one level up names the GPU and the model. The TP-N tables are
  one rank's kernels (a 1-layer model with the per-rank widths), so shapes are divided by N.
* LLMServingSim v0 ``perf_models/<HW>/<org>/<model>/tp<N>/layers.csv``: layer_name, input, kv_cache,
  tp_size, latency(ns); unfused q/k/v and gate/up projections.
* BLIS / InferSim attention: ``decode/<gpu>/<nh>-<nkv>-<hd>-tp<N>.csv`` (dtype, kv_dtype, batch_size, kv_len,
  latency_us, mfu) and ``prefill/<gpu>/<nh>-<nkv>-<hd>.csv`` (dtype, seq_len, latency_us, mfu).
* Vidur ``data/profiling/compute/<gpu>/<org>/<model>/{mlp,attention}.csv``: per-operator
  ``time_stats.<op>.median`` in milliseconds (CUDA events), shapes in n_head, n_kv_head, n_embd, ...

Every importer returns a Microbench with per-GPU shapes. Units are converted to seconds here, once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError, ServesimError, TraceFormatError
from sim.cost.calibrate.samples import Microbench, load_samples_csv, make_frame
from sim.cost.hardware import GpuSpec, get_gpu
from sim.cost.models import ModelSpec, get_model

_DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "fp32": 4,
    "float32": 4,
}

# Directory names the public datasets use for a GPU -> catalogue names (sim/cost/hardware.py).
_GPU_DIRS = {
    "rtx4090": "RTX 4090",
    "rtxpro6000": "RTX PRO 6000 Blackwell",
    # LLMServingSim v0 "H100": the LM head streams 2.87 TB/s at one token (layers.csv, 1.05 GB in 366 µs),
    # above the PCIe card's 2.0 TB/s spec, so these are SXM (HBM3) parts.
    "h100": "H100 SXM",
    "a100": "A100 80GB SXM",
    "h200": "H200 SXM",
}


def gpu_name(text: str) -> str:
    """Catalogue name for a device string ('NVIDIA GeForce RTX 4090', 'h100'); the text itself if unknown."""
    key = re.sub(r"[^a-z0-9]", "", text.lower())
    if key in _GPU_DIRS:
        return _GPU_DIRS[key]
    try:
        return get_gpu(text).name
    except ServesimError:
        return text


def _gpu_from_path(path: Path) -> str | None:
    for part in reversed(path.parts):
        key = re.sub(r"[^a-z0-9]", "", part.lower())
        if key in _GPU_DIRS:
            return _GPU_DIRS[key]
    return None


def _read_csv(path: Path, required: Iterable[str]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise TraceFormatError(f"{path}: cannot read CSV ({e})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{path}: missing column(s) {missing}; has {list(df.columns)}")
    return df


def _simple_yaml(path: Path) -> dict[str, str]:
    """Top-level ``key: value`` pairs of a YAML file (no PyYAML dependency; nested blocks are skipped)."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z_][\w]*):\s*(.*?)\s*$", line)
        if m and m.group(2):
            out[m.group(1)] = m.group(2).strip("'\"")
    return out


def _geometry(model: ModelSpec, tp: int) -> dict[str, float]:
    """Per-GPU widths of a tensor-parallel rank (KV heads replicated down to one, as vLLM does)."""
    return {
        "hidden": model.hidden_size,
        "inter": model.intermediate_size / tp,
        "nh": model.num_attention_heads / tp,
        "nkv": max(1, math.ceil(model.num_key_value_heads / tp)),
        "hd": model.head_dim,
        "vocab": model.vocab_size,
    }


def _gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[float, float]]:
    """(K, N) per GPU of each named linear layer: fused (vLLM) and unfused (v0 profiler) spellings."""
    H, hd = model.hidden_size, model.head_dim
    g = _geometry(model, tp)
    nh, nkv, inter = g["nh"], g["nkv"], g["inter"]
    return {
        "qkv_proj": (H, (nh + 2 * nkv) * hd),
        "q_proj": (H, nh * hd),
        "k_proj": (H, nkv * hd),
        "v_proj": (H, nkv * hd),
        "o_proj": (nh * hd, H),
        "gate_up_proj": (H, (2 if model.gated_mlp else 1) * inter),
        "gate_proj": (H, inter),
        "up_proj": (H, inter),
        "down_proj": (inter, H),
        "lm_head": (H, model.vocab_size / tp),
    }


def _tp_from_dir(path: Path) -> int | None:
    for part in reversed(path.parts):
        m = re.fullmatch(r"tp(\d+)", part.lower())
        if m:
            return int(m.group(1))
    return None


def _model_from_path(path: Path) -> ModelSpec | None:
    parts = path.parts
    for i in range(len(parts) - 1):
        try:
            return get_model(f"{parts[i]}/{parts[i + 1]}")
        except ServesimError:
            continue
    return None


# ---------------------------------------------------------------------------------------------- LLMServingSim


def load_llmservingsim(
    path: str | Path, *, model: ModelSpec | str | None = None, gpu: str | None = None, tp: int | None = None
) -> Microbench:
    """One LLMServingSim ``tp<N>`` directory, or one of its CSV files."""
    p = Path(path)
    d = p if p.is_dir() else p.parent
    files = [p] if p.is_file() else [d / n for n in ("dense.csv", "attention.csv", "per_sequence.csv")]
    files = [f for f in files if f.is_file()]
    if not files:
        raise TraceFormatError(f"{p}: no dense.csv / attention.csv / per_sequence.csv")
    meta_yaml = next(
        (q / "meta.yaml" for q in (d, d.parent, d.parent.parent) if (q / "meta.yaml").is_file()), None
    )
    meta = _simple_yaml(meta_yaml) if meta_yaml else {}
    spec = get_model(model) if model is not None else None
    if spec is None and "model" in meta:
        spec = get_model(meta["model"])
    if spec is None:
        spec = _model_from_path(d)
    if spec is None:
        raise ConfigError(f"{p}: cannot tell the model (no meta.yaml 'model:'); pass model=...")
    tp = tp or _tp_from_dir(d) or 1
    gname = gpu or (gpu_name(meta["gpu"]) if "gpu" in meta else None) or _gpu_from_path(d) or "unknown"
    geo = _geometry(spec, tp)
    shapes = _gemm_shapes(spec, tp)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for f in files:
        label = _label(f)
        if f.name == "dense.csv":
            rows += _lss_dense(f, geo, shapes, spec, label, notes)
        elif f.name == "attention.csv":
            rows += _lss_attention(f, geo, label)
        elif f.name == "per_sequence.csv":
            rows += _lss_per_sequence(f, geo, shapes, label)
        else:
            raise TraceFormatError(f"{f}: not an LLMServingSim dense/attention/per_sequence CSV")
    if (d / "moe.csv").is_file():
        notes.append("moe.csv not imported: the cost model's MoE term is not calibrated from it yet")
    info = {
        "format": "llmservingsim",
        "path": str(p),
        "model": spec.name,
        "tp": tp,
        "device_name": meta.get("gpu", ""),
        "vllm_version": meta.get("vllm_version", ""),
        "cuda_version": meta.get("cuda_version", ""),
        "notes": notes,
    }
    return Microbench(gname, make_frame(rows), info)


def _label(f: Path) -> str:
    """A short, stable file label: the last 5 path components (GPU/org/model/.../file)."""
    return "/".join(f.parts[-6:]) if len(f.parts) > 6 else str(f)


def _lss_dense(f, geo, shapes, spec, label, notes) -> list[dict[str, Any]]:
    df = _read_csv(f, ("layer", "tokens", "time_us"))
    rows: list[dict[str, Any]] = []
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        k, n = shapes[name]
        for r in df[df.layer == name].itertuples():
            rows.append(
                dict(
                    op="gemm",
                    name=name,
                    file=label,
                    time_s=r.time_us * 1e-6,
                    m=r.tokens,
                    k=k,
                    n=n,
                    w_bytes=2,
                    a_bytes=2,
                )
            )
    piv = df.pivot_table(index="tokens", columns="layer", values="time_us", aggfunc="median")
    # Per layer: two fused add+RMSNorm calls, RoPE, SiLU·mul (costmodel.md §1.2). qk_norm (Qwen3) is not a term
    # of the cost model and is left out; MoE models have no dense act_fn here.
    need = ("layernorm", "rotary_emb", "act_fn")
    if all(c in piv.columns for c in need) and not spec.num_experts:
        t = 2 * piv["layernorm"] + piv["rotary_emb"] + piv["act_fn"]
        for m, v in t.dropna().items():
            rows.append(
                dict(
                    op="elementwise_layer",
                    name="2*layernorm+rotary_emb+act_fn",
                    file=label,
                    time_s=v * 1e-6,
                    m=m,
                    a_bytes=2,
                    kv_bytes=2,
                    **geo,
                )
            )
    else:
        notes.append(f"{label}: per-layer elementwise not imported (needs {need}, dense MLP)")
    if all(c in piv.columns for c in ("embedding", "final_layernorm")):
        t = piv["embedding"] + piv["final_layernorm"]
        for m, v in t.dropna().items():
            rows.append(
                dict(
                    op="elementwise_step",
                    name="embedding+final_layernorm",
                    file=label,
                    time_s=v * 1e-6,
                    m=m,
                    a_bytes=2,
                    **geo,
                )
            )
    return rows


def _lss_attention(f, geo, label) -> list[dict[str, Any]]:
    df = _read_csv(f, ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
    rows: list[dict[str, Any]] = []
    heads = dict(nh=geo["nh"], nkv=geo["nkv"], hd=geo["hd"], kv_bytes=2, a_bytes=2)
    for r in df.itertuples():
        if r.prefill_chunk > 0 and r.n_decode > 0:
            op = "attn_mixed"
        elif r.prefill_chunk > 0:
            op = "attn_prefill"
        elif r.n_decode > 0:
            op = "attn_decode"
        else:
            continue
        rows.append(
            dict(
                op=op,
                file=label,
                time_s=r.time_us * 1e-6,
                chunk=r.prefill_chunk,
                kv_prefill=r.kv_prefill,
                n_decode=r.n_decode,
                kv_decode=r.kv_decode,
                **heads,
            )
        )
    return rows


def _lss_per_sequence(f, geo, shapes, label) -> list[dict[str, Any]]:
    df = _read_csv(f, ("layer", "sequences", "time_us"))
    rows: list[dict[str, Any]] = []
    k, n = shapes["lm_head"]
    for r in df.itertuples():
        if r.layer == "lm_head":
            rows.append(
                dict(
                    op="gemm",
                    name="lm_head",
                    file=label,
                    time_s=r.time_us * 1e-6,
                    m=r.sequences,
                    k=k,
                    n=n,
                    w_bytes=2,
                    a_bytes=2,
                )
            )
        elif r.layer == "sampler":
            rows.append(
                dict(
                    op="sampler",
                    name="sampler",
                    file=label,
                    time_s=r.time_us * 1e-6,
                    m=r.sequences,
                    vocab=geo["vocab"],
                    a_bytes=2,
                )
            )
    return rows


# ---------------------------------------------------------------------------------------------- LLMServingSim v0


def load_layers_csv(
    path: str | Path, *, model: ModelSpec | str | None = None, gpu: str | None = None
) -> Microbench:
    """LLMServingSim v0 ``layers.csv`` (latency in ns)."""
    p = Path(path)
    df = _read_csv(p, ("layer_name", "input", "kv_cache", "tp_size", "latency(ns)"))
    spec = get_model(model) if model is not None else _model_from_path(p)
    if spec is None:
        raise ConfigError(f"{p}: cannot tell the model from the path; pass model=...")
    tps = sorted(set(df.tp_size.astype(int)))
    if len(tps) != 1:
        raise TraceFormatError(f"{p}: expected one tp_size, got {tps}")
    tp = tps[0]
    geo = _geometry(spec, tp)
    shapes = _gemm_shapes(spec, tp)
    label = _label(p)
    t = df["latency(ns)"].to_numpy(float) * 1e-9
    rows: list[dict[str, Any]] = []
    for name, (k, n) in shapes.items():
        sel = (df.layer_name == name).to_numpy()
        for m, ts in zip(df.input.to_numpy()[sel], t[sel], strict=True):
            rows.append(
                dict(op="gemm", name=name, file=label, time_s=ts, m=m, k=k, n=n, w_bytes=2, a_bytes=2)
            )
    heads = dict(nh=geo["nh"], nkv=geo["nkv"], hd=geo["hd"], kv_bytes=2, a_bytes=2)
    sel = (df.layer_name == "attn").to_numpy()
    for m, kv, ts in zip(df.input.to_numpy()[sel], df.kv_cache.to_numpy()[sel], t[sel], strict=True):
        rows.append(
            dict(
                op="attn_prefill",
                name="attn",
                file=label,
                time_s=ts,
                chunk=m,
                kv_prefill=kv,
                n_decode=0,
                kv_decode=0,
                **heads,
            )
        )
    piv = df.assign(t=t).pivot_table(index="input", columns="layer_name", values="t", aggfunc="median")
    need = ("input_layernorm", "post_layernorm", "rope", "act_fn")
    notes = []
    if all(c in piv.columns for c in need) and not spec.num_experts:
        tot = piv["input_layernorm"] + piv["post_layernorm"] + piv["rope"] + piv["act_fn"]
        for m, v in tot.dropna().items():
            rows.append(
                dict(
                    op="elementwise_layer",
                    name="+".join(need),
                    file=label,
                    time_s=v,
                    m=m,
                    a_bytes=2,
                    kv_bytes=2,
                    **geo,
                )
            )
    if all(c in piv.columns for c in ("embedding", "final_layernorm")):
        tot = piv["embedding"] + piv["final_layernorm"]
        for m, v in tot.dropna().items():
            rows.append(
                dict(
                    op="elementwise_step",
                    name="embedding+final_layernorm",
                    file=label,
                    time_s=v,
                    m=m,
                    a_bytes=2,
                    **geo,
                )
            )
    if spec.num_experts:
        notes.append(f"{label}: MoE expert and router timings not imported")
    gname = gpu or _gpu_from_path(p) or "unknown"
    info = {"format": "llmservingsim-v0", "path": str(p), "model": spec.name, "tp": tp, "notes": notes}
    return Microbench(gname, make_frame(rows), info)


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


# ---------------------------------------------------------------------------------------------- detection


def sniff(path: Path) -> str:
    """The format of one file, from its name and header."""
    try:
        with path.open() as fh:
            header = fh.readline().strip()
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e})") from None
    cols = set(header.split(","))
    if {"op", "time_s"} <= cols:
        return "servesim-samples"
    if path.name in ("dense.csv", "attention.csv", "per_sequence.csv") and "time_us" in cols:
        return "llmservingsim"
    if "latency(ns)" in cols and "layer_name" in cols:
        return "llmservingsim-v0"
    if "latency_us" in cols and re.fullmatch(r"\d+-\d+-\d+(?:-tp\d+)?\.csv", path.name):
        return "blis-attention"
    if any(c.startswith("time_stats.") for c in cols):
        if "is_prefill" in cols:
            return "vidur-attention"
        if "num_tokens" in cols:
            return "vidur-mlp"
    return "unknown"


def load_path(
    path: str | Path,
    *,
    model: ModelSpec | str | None = None,
    gpu: str | None = None,
) -> list[Microbench]:
    """Every recognised microbenchmark file under ``path`` (a file or a directory, searched recursively)."""
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"microbenchmark path not found: {p}")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*.csv") if f.is_file())
    out: list[Microbench] = []
    lss_dirs: set[Path] = set()
    for f in files:
        fmt = sniff(f)
        if fmt == "llmservingsim":
            if p.is_file():
                out.append(load_llmservingsim(f, model=model, gpu=gpu))
            elif f.parent not in lss_dirs:
                lss_dirs.add(f.parent)
                out.append(load_llmservingsim(f.parent, model=model, gpu=gpu))
        elif fmt == "llmservingsim-v0":
            out.append(load_layers_csv(f, model=model, gpu=gpu))
        elif fmt == "blis-attention":
            out.append(load_blis_attention(f, gpu=gpu))
        elif fmt == "vidur-mlp":
            out.append(load_vidur_mlp(f, gpu=gpu))
        elif fmt == "vidur-attention":
            out.append(load_vidur_attention(f, gpu=gpu))
        elif fmt == "servesim-samples":
            mb = load_samples_csv(f)
            if gpu:
                mb.gpu = gpu
            out.append(mb)
        elif p.is_file():
            raise TraceFormatError(f"{f}: unrecognised microbenchmark format (header: see sim/calibrate)")
    if not out:
        raise TraceFormatError(f"{p}: no recognised microbenchmark files")
    return out
