"""Helpers every microbenchmark importer shares: GPU and model names from paths, CSV reading, per-rank
shapes of a model's layers.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from sim.core.errors import ServesimError, TraceFormatError
from sim.cost.calibrate.samples import read_text
from sim.cost.hardware import get_gpu
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
    text = read_text(path)  # not UTF-8: refused naming the file (sniff reads only the header)
    try:
        df = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise TraceFormatError(f"{path}: cannot read CSV ({str(e).strip()})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{path}: missing column(s) {missing}; has {list(df.columns)}")
    return df


def _simple_yaml(path: Path) -> dict[str, str]:
    """Top-level ``key: value`` pairs of a YAML file (no PyYAML dependency; nested blocks are skipped)."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in read_text(path, "YAML").splitlines():
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


def _label(f: Path) -> str:
    """A short, stable file label: the last 5 path components (GPU/org/model/.../file)."""
    return "/".join(f.parts[-6:]) if len(f.parts) > 6 else str(f)
