"""LLMServingSim ``profiler/perf`` tables (dense / attention / per_sequence.csv) and the older v0
``perf_models`` layers.csv -> samples (formats: sim/cost/calibrate/importers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, TraceFormatError
from sim.cost.calibrate.import_common import (
    _gemm_shapes,
    _geometry,
    _gpu_from_path,
    _label,
    _model_from_path,
    _read_csv,
    _simple_yaml,
    _tp_from_dir,
    gpu_name,
)
from sim.cost.calibrate.samples import Microbench, make_frame
from sim.cost.models import ModelSpec, get_model

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
