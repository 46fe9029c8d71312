"""Per-operator predictions of the cost model, vectorised over sample rows.

These are the formulas of sim/cost/costmodel.py written per operator call instead of per step, so a profile can
be scored against (and fitted to) single-kernel timings. tests/test_calibrate_opmodel.py checks that they
agree with RooflineCostModel on a real model, so the two cannot drift apart silently.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cost.collectives import allreduce_seconds
from sim.cost.hardware import GpuSpec
from sim.cost.profiles import CalibrationProfile
from sim.cost.smooth import smooth


def _col(df: pd.DataFrame, name: str, default: float = 0.0) -> np.ndarray:
    v = df[name].to_numpy(dtype=float)
    return np.where(np.isfinite(v), v, default)


def gemm(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    """Smooth roofline of one GEMM (costmodel.md §0 item 2); weights read once for all m rows."""
    m, k, n = _col(df, "m"), _col(df, "k"), _col(df, "n")
    bw, ba = _col(df, "w_bytes", 2.0), _col(df, "a_bytes", 2.0)
    return smooth(
        2.0 * m * k * n,
        k * n * bw + m * (k + n) * ba,
        gpu.bf16_flops * p.eta_compute,
        gpu.mem_bandwidth * p.eta_bandwidth,
        p.roofline_p,
        p.t0_gemm_s,
    )


def _attn_coefs(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame):
    nh, nkv, hd = _col(df, "nh"), _col(df, "nkv"), _col(df, "hd")
    kvb = _col(df, "kv_bytes", 2.0)
    kv_tok = 2.0 * nkv * hd * kvb  # costmodel.md §1.3: KV heads, not query heads
    attn_peak = gpu.bf16_flops * p.eta_fa
    kv_coef = np.maximum(kv_tok / (gpu.mem_bandwidth * p.eta_kv), 4.0 * nh * hd / attn_peak)
    return nh, nkv, hd, kv_tok, attn_peak, kv_coef


def _decode_part(p, kv_coef, df) -> np.ndarray:
    n, ctx = _col(df, "n_decode"), _col(df, "kv_decode")
    dec_seq = kv_coef * p.attn_ctx_pad_tokens + p.attn_per_seq_s
    return kv_coef * n * ctx + n * dec_seq


def _prefill_part(p, gpu, df, nh, hd, kv_tok, attn_peak) -> np.ndarray:
    c, pre = _col(df, "chunk"), _col(df, "kv_prefill")
    cc = np.maximum(c, 1.0)
    tf = 4.0 * nh * hd * c * (pre + (c + 1) * 0.5 * (1.0 + p.prefill_causal_ramp_tokens / cc)) / attn_peak
    occ = np.clip(c / p.prefill_kv_sat_tokens, p.prefill_kv_floor, 1.0)
    tb = kv_tok * (pre + c) / (gpu.mem_bandwidth * p.eta_kv * occ)
    return p.prefill_chunk_t0_s + np.maximum(tf, tb)


def attention(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    """One layer's attention kernel for rows of attn_decode / attn_prefill / attn_mixed (one prefill chunk)."""
    nh, nkv, hd, kv_tok, attn_peak, kv_coef = _attn_coefs(p, gpu, df)
    dec = _decode_part(p, kv_coef, df)
    chunk = _col(df, "chunk")
    mixed = (chunk > 0) & (_col(df, "n_decode") > 0)
    factor = np.where(mixed, 1.0 + p.mixed_decode_gqa_reread * (nh / np.maximum(nkv, 1.0) - 1.0), 1.0)
    dec = dec * factor
    # mixed steps: CTA-wave and single-stream floors (uniform contexts here, so max ctx = kv_decode)
    n, ctx = _col(df, "n_decode"), _col(df, "kv_decode")
    floor = np.maximum(p.mixed_decode_head_token_s * nh * n * ctx, p.mixed_decode_seq_token_s * ctx)
    dec = np.where(mixed, np.maximum(dec, floor), dec)
    pf = np.where(chunk > 0, _prefill_part(p, gpu, df, nh, hd, kv_tok, attn_peak), 0.0)
    return p.attn_t0_s + dec + pf


def ew_bytes_per_token_layer(df: pd.DataFrame) -> np.ndarray:
    """Bytes one token moves through a layer's small kernels (sim/cost/costmodel.py ``_ew_tok_layer``, dense GQA)."""
    H, inter = _col(df, "hidden"), _col(df, "inter")
    nh, nkv, hd = _col(df, "nh"), _col(df, "nkv"), _col(df, "hd")
    ba, bkv = _col(df, "a_bytes", 2.0), _col(df, "kv_bytes", 2.0)
    ew_attn = (nh + nkv) * hd * 2 * ba + 2 * nkv * hd * (ba + bkv)
    return 4 * H * ba + ew_attn + 3 * inter * ba


def elementwise_layer(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    m = _col(df, "m")
    return np.maximum(
        m * ew_bytes_per_token_layer(df) / (gpu.mem_bandwidth * p.eta_elementwise), p.layer_fixed_s
    )


def elementwise_step(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    m, H, ba = _col(df, "m"), _col(df, "hidden"), _col(df, "a_bytes", 2.0)
    return np.maximum(m * 4 * H * ba / (gpu.mem_bandwidth * p.eta_elementwise), p.step_elementwise_fixed_s)


def sampler(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    s, v = _col(df, "m"), _col(df, "vocab")
    return p.sampler_t0_s + s * v * p.sampler_bytes_per_elem / (gpu.mem_bandwidth * p.eta_elementwise)


def copy(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    """A read+write copy of ``nbytes`` at the GEMM streaming efficiency (diagnostic only)."""
    return _col(df, "nbytes") / (gpu.mem_bandwidth * p.eta_bandwidth)


def allreduce(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    """One all-reduce (eager: the benchmark suite times torch.distributed calls outside a CUDA graph).

    ``allreduce_model == "profile"``: the ring α + 2(t−1)/t · bytes / (link BW · eff); else the per-interconnect
    model of sim/cost/collectives.py, as in sim/cost/costmodel.py."""
    t, nb = np.maximum(_col(df, "tp", 1.0), 1.0), _col(df, "nbytes")
    if p.allreduce_model != "profile":
        out = np.zeros(len(df))
        for tp in np.unique(t):
            sel = t == tp
            out[sel] = allreduce_seconds(nb[sel], int(tp), gpu, graph=False)
        return out
    link = gpu.interconnect_bandwidth if gpu.interconnect_bandwidth > 0 else gpu.host_bandwidth
    return p.allreduce_latency_s + 2 * (t - 1) / t * nb / (link * p.allreduce_bw_eff)


def step_overhead(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    return p.step_overhead_s + p.per_seq_overhead_s * _col(df, "m")


PREDICT = {
    "gemm": gemm,
    "attn_decode": attention,
    "attn_prefill": attention,
    "attn_mixed": attention,
    "elementwise_layer": elementwise_layer,
    "elementwise_step": elementwise_step,
    "sampler": sampler,
    "copy": copy,
    "allreduce": allreduce,
    "step_overhead": step_overhead,
}


def predict(p: CalibrationProfile, gpu: GpuSpec, df: pd.DataFrame) -> np.ndarray:
    """Predicted seconds for every row of a samples frame (any mix of ops)."""
    out = np.full(len(df), np.nan)
    ops = df["op"].to_numpy()
    for op in pd.unique(ops):
        sel = ops == op
        out[sel] = PREDICT[op](p, gpu, df[sel])
    return out
