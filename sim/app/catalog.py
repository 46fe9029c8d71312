"""The model and GPU catalogues as tables (``servesim models``, ``servesim gpus``): what a name in a config
stands for, in the units people quote (billions of parameters, GiB, GB/s, TFLOP/s)."""

from __future__ import annotations

import pandas as pd

from sim.cost.hardware import get_gpu, list_gpus
from sim.cost.models import SOURCES, get_model, list_models


def model_table() -> pd.DataFrame:
    """One row per catalogue model: parameters (total, active per token), shape, context, KV bytes/token."""
    rows = []
    for name in list_models():
        m = get_model(name)
        rows.append({
            "name": name, "params_b": m.num_params / 1e9,
            "active_params_b": m.num_active_params / 1e9 if m.is_moe else None,
            "experts": f"{m.experts_per_tok}/{m.num_experts}" if m.is_moe else "",
            "layers": m.num_hidden_layers, "hidden_size": m.hidden_size, "heads": m.num_attention_heads,
            "kv_heads": m.num_key_value_heads, "head_dim": m.head_dim, "max_model_len": m.max_position_embeddings,
            "kv_kib_per_token": m.kv_bytes_per_token("auto", "bf16") / 1024,
            "weights": m.quantization or "bf16", "source": SOURCES.get(name, "models.csv (costmodel.md §4)"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def gpu_table() -> pd.DataFrame:
    """One row per catalogue GPU: memory, bandwidth, dense peaks, the link between cards."""
    rows = []
    for name in list_gpus():
        g = get_gpu(name)
        rows.append({
            "name": name, "memory_gib": g.memory_gib, "bandwidth_gb_s": g.mem_bandwidth / 1e9,
            "bf16_tflops": g.bf16_flops / 1e12, "fp8_tflops": g.fp8_flops / 1e12 if g.fp8_flops else None,
            "int8_tops": g.int8_ops / 1e12 if g.int8_ops else None, "interconnect": g.interconnect,
            "link_gb_s": g.interconnect_bandwidth / 1e9, "max_link_gpus": g.max_link_gpus, "arch": g.arch,
        })  # fmt: skip
    return pd.DataFrame(rows)
