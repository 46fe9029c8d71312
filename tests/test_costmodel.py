"""Cost model and calibration profiles: physics checks, fast paths, JSON, and the measured RTX 4090 data."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import sim.cost.profiles as profiles
from sim.core.batch import BatchSummary
from sim.core.errors import ConfigError, UnknownNameError
from sim.cost.costmodel import ConstantCostModel, CostModel, RooflineCostModel, make_cost_model
from sim.cost.hardware import GpuSpec
from sim.cost.models import ModelSpec
from sim.cost.profiles import CalibrationProfile, get_profile, gpu_family, gpu_slug, prior_profile

SHARED = Path(__file__).resolve().parents[2] / "shared"
RTX4090_DIR = SHARED / "data/microbench/llmservingsim/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1"

# Dims from reference/costmodel.md §4 (HF config.json fields).
LLAMA8B = ModelSpec("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256, 131072)
MIXTRAL = ModelSpec("Mixtral-8x7B", 32, 4096, 14336, 32, 8, 128, 32000, 32768, num_experts=8, experts_per_tok=2)
DSV2LITE = ModelSpec("DeepSeek-V2-Lite", 27, 2048, 10944, 16, 16, 192, 102400, 163840, num_experts=64,
                     experts_per_tok=6, num_shared_experts=2, moe_intermediate_size=1408,
                     first_k_dense_replace=1, kv_lora_rank=512, qk_rope_head_dim=64)
RTX4090 = GpuSpec("RTX 4090", 25250627584, 1008e9, 165.2e12, 165.2e12, 330.3e12, 660.6e12, "pcie", 0.0, 25e9)
H100 = GpuSpec("H100 SXM", 80_000_000_000, 3350e9, 989.4e12, 989.4e12, 1978.9e12, 1978.9e12, "nvlink",
               450e9, 55e9)
A100 = GpuSpec("A100 80GB SXM", 80_000_000_000, 2039e9, 312e12, 312e12, None, 624e12, "nvlink", 300e9, 25e9)


def decode(n: int, ctx: int | np.ndarray, logits: int | None = None) -> BatchSummary:
    c = np.full(n, ctx, dtype=np.int64) if np.isscalar(ctx) else np.asarray(ctx, dtype=np.int64)
    return BatchSummary(decode_ctx=c, num_logits=n if logits is None else logits)


def prefill(chunk: int, ctx: int = 0, logits: int = 0) -> BatchSummary:
    return BatchSummary(prefill_chunk=np.array([chunk]), prefill_ctx=np.array([ctx]), num_logits=logits)


def non_embedding_params(m: ModelSpec) -> int:
    attn = m.hidden_size * (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim
    attn += m.num_attention_heads * m.head_dim * m.hidden_size
    return m.num_hidden_layers * (attn + 3 * m.hidden_size * m.intermediate_size)


def attn_per_layer_us(cm: RooflineCostModel, b: BatchSummary) -> float:
    bd = cm.breakdown(b)
    return (bd["attention_fixed"] + bd["attention_decode"] + bd["attention_prefill"]) / cm.model.num_hidden_layers * 1e6


@pytest.fixture(scope="module")
def cm4090() -> RooflineCostModel:
    return RooflineCostModel(LLAMA8B, RTX4090)


# ---------------------------------------------------------------------------------------------- physics


def test_decode_batch1_is_weight_streaming(cm4090):
    t = cm4090.step_time(decode(1, 1024))
    assert 15e-3 < t < 22e-3  # 16 GB of weights at ~0.9 × 1008 GB/s
    weights = (non_embedding_params(LLAMA8B) + LLAMA8B.hidden_size * LLAMA8B.vocab_size) * 2
    assert t == pytest.approx(weights / (0.9 * 1008e9), rel=0.15)


def test_decode_time_linear_in_total_context(cm4090):
    ts = [cm4090.step_time(decode(8, c)) for c in (1024, 2048, 3072, 4096)]
    d = np.diff(ts)
    assert np.all(d > 0)
    assert d == pytest.approx(np.full(3, d[0]), rel=1e-9)
    # only Σctx matters: a skewed batch with the same Σctx costs the same
    skew = decode(8, [64] * 7 + [8 * 2048 - 7 * 64])
    assert cm4090.step_time(skew) == pytest.approx(cm4090.step_time(decode(8, 2048)), rel=1e-12)


def test_gqa_attention_counts_kv_heads_not_query_heads():
    mha = replace(LLAMA8B, name="llama-mha", num_key_value_heads=32)
    slopes = []
    for m in (LLAMA8B, mha):
        cm = RooflineCostModel(m, RTX4090)
        a = cm.breakdown(decode(16, 1024))["attention_decode"]
        b = cm.breakdown(decode(16, 5120))["attention_decode"]
        slopes.append(b - a)
    assert slopes[1] / slopes[0] == pytest.approx(32 / 8, rel=1e-6)


def test_prefill_2048_is_compute_bound(cm4090):
    t = cm4090.step_time(prefill(2048, 0, logits=1))
    prof = cm4090.profile
    ideal = 2 * non_embedding_params(LLAMA8B) * 2048 / (RTX4090.bf16_flops * prof.eta_compute)
    assert t == pytest.approx(ideal, rel=0.30)
    assert t > ideal  # attention, elementwise and overheads come on top


def test_mixed_batch_reads_weights_once(cm4090):
    dec, pf = decode(16, 1024), prefill(512, 0, logits=1)
    mixed = BatchSummary(decode_ctx=dec.decode_ctx, prefill_chunk=pf.prefill_chunk, prefill_ctx=pf.prefill_ctx,
                         num_logits=17)
    separate = cm4090.step_time(dec) + cm4090.step_time(pf)
    gemm_dec = cm4090.breakdown(dec)["gemm"]
    assert cm4090.step_time(mixed) < separate - 0.5 * gemm_dec
    # without the mixed-kernel attention penalty the saving is the decodes' whole weight read
    flat = RooflineCostModel(LLAMA8B, RTX4090, profile=replace(cm4090.profile, mixed_decode_gqa_reread=0.0))
    saving = flat.step_time(dec) + flat.step_time(pf) - flat.step_time(mixed)
    assert saving > 0.9 * gemm_dec


def test_mixed_decode_attention_penalty_scales_with_gqa_ratio(cm4090):
    b = BatchSummary(decode_ctx=np.full(32, 2048), prefill_chunk=np.array([256]), prefill_ctx=np.array([0]))
    alone = cm4090.breakdown(decode(32, 2048))["attention_decode"]
    mixed = cm4090.breakdown(b)["attention_decode"]
    phi = cm4090.profile.mixed_decode_gqa_reread
    assert mixed / alone == pytest.approx(1 + phi * (32 / 8 - 1), rel=1e-9)


def test_tensor_parallel_splits_gemms_and_adds_allreduce():
    tp1 = RooflineCostModel(LLAMA8B, H100)
    tp2 = RooflineCostModel(LLAMA8B, H100, tensor_parallel_size=2)
    for b in (decode(8, 1024), prefill(1024)):
        b1, b2 = tp1.breakdown(b), tp2.breakdown(b)
        assert b2["gemm"] < 0.65 * b1["gemm"]
        assert b1["allreduce"] == 0.0
        # at least the latency floor: 2 all-reduces per layer
        assert b2["allreduce"] >= 2 * 32 * tp2.profile.allreduce_latency_s
    # more tokens, more all-reduce bytes
    assert tp2.breakdown(prefill(1024))["allreduce"] > tp2.breakdown(decode(8, 1024))["allreduce"]
    # a PCIe-only card falls back to the host link and its larger latency floor
    pcie = RooflineCostModel(LLAMA8B, RTX4090, tensor_parallel_size=2)
    assert pcie.breakdown(prefill(1024))["allreduce"] > tp2.breakdown(prefill(1024))["allreduce"]


def test_moe_uses_active_experts():
    cm = RooflineCostModel(MIXTRAL, H100)
    E, k = MIXTRAL.num_experts, MIXTRAL.experts_per_tok
    one_expert = MIXTRAL.num_hidden_layers * 3 * MIXTRAL.hidden_size * MIXTRAL.intermediate_size
    peak = H100.bf16_flops * cm.profile.eta_compute
    t = cm.breakdown(prefill(4096))["moe"]
    active_ideal = 2 * k * one_expert * 4096 / peak
    assert t == pytest.approx(active_ideal, rel=0.25)
    assert t < 0.5 * 2 * E * one_expert * 4096 / peak  # far below pricing every expert for every token
    # decode, batch 1: only k experts' weights are read; batch 64 touches nearly all of them
    bw = H100.mem_bandwidth * cm.profile.eta_bandwidth
    t1 = cm.breakdown(decode(1, 512))["moe"]
    assert t1 == pytest.approx(k * one_expert * 2 / bw, rel=0.15)
    t64 = cm.breakdown(decode(64, 512))["moe"]
    assert t64 / t1 == pytest.approx(E * (1 - (1 - k / E) ** 64) / k, rel=0.15)


def test_mla_and_dense_first_layer():
    cm = RooflineCostModel(DSV2LITE, H100)
    assert cm.kv_bytes_per_token == 27 * (512 + 64) * 2  # costmodel.md §4: 31,104 B per token
    a = cm.breakdown(decode(16, 1024))["attention_decode"]
    b = cm.breakdown(decode(16, 2048))["attention_decode"]
    per_ctx = (b - a) / (16 * 1024) / 27
    assert per_ctx == pytest.approx(576 * 2 / (H100.mem_bandwidth * cm.profile.eta_kv), rel=1e-6)
    bd = cm.breakdown(decode(1, 128))
    assert bd["moe"] > 0 and bd["gemm"] > 0  # 26 MoE layers, 1 dense layer


def test_fp8_weights_roughly_halve_memory_bound_decode():
    bf16 = RooflineCostModel(LLAMA8B, H100)
    fp8 = RooflineCostModel(LLAMA8B, H100, dtype="fp8")
    r = fp8.step_time(decode(1, 512)) / bf16.step_time(decode(1, 512))
    assert 0.45 < r < 0.70  # the LM head stays 16-bit and fixed per-kernel costs do not shrink
    fixed = 32 * 4 * fp8.profile.t0_gemm_s  # 4 GEMM launches per layer do not shrink with the weights
    g8, g16 = (m.breakdown(decode(1, 512))["gemm"] - fixed for m in (fp8, bf16))
    assert g8 / g16 == pytest.approx(0.5, abs=0.03)
    # fp8 compute peak is used where the GPU has one: compute-bound prefill gets faster too
    assert fp8.breakdown(prefill(4096))["gemm"] < 0.7 * bf16.breakdown(prefill(4096))["gemm"]
    # A100 has no fp8 peak: weight-only fp8 (FP8 Marlin) computes at the bf16 rate plus its dequantization
    # work (sim/cost/quant.py), so compute-bound prefill is a little slower, not faster
    a_bf16, a_fp8 = RooflineCostModel(LLAMA8B, A100), RooflineCostModel(LLAMA8B, A100, dtype="fp8")
    ratio = a_fp8.breakdown(prefill(4096))["gemm"] / a_bf16.breakdown(prefill(4096))["gemm"]
    assert 1.05 < ratio < 1.2


def test_fp8_kv_cache_halves_decode_attention_bytes():
    a = RooflineCostModel(LLAMA8B, RTX4090)
    b = RooflineCostModel(LLAMA8B, RTX4090, kv_cache_dtype="fp8")
    assert b.kv_bytes_per_token * 2 == a.kv_bytes_per_token == 131072  # DESIGN.md worked example: 128 KiB
    da = a.breakdown(decode(32, 4096))["attention_decode"]
    db = b.breakdown(decode(32, 4096))["attention_decode"]
    assert db / da == pytest.approx(0.5, abs=0.02)


def test_cuda_graph_padding_of_decode_only_steps(cm4090):
    # 9 decodes run as the 16-row graph: same token-level (GEMM) time as 16
    b9, b16 = cm4090.breakdown(decode(9, 100)), cm4090.breakdown(decode(16, 100))
    assert b9["gemm"] == b16["gemm"]
    b17 = cm4090.breakdown(decode(17, 100))
    assert b17["gemm"] > b16["gemm"]
    eager = RooflineCostModel(LLAMA8B, RTX4090, profile=replace(cm4090.profile, cuda_graphs=False))
    assert eager.breakdown(decode(9, 100))["gemm"] < b9["gemm"]
    # beyond the largest capture size there is no padding
    assert cm4090.breakdown(decode(600, 10))["gemm"] < cm4090.breakdown(decode(601, 10))["gemm"]


def test_breakdown_sums_to_step_time(cm4090):
    rng = np.random.default_rng(1)
    tp2 = RooflineCostModel(MIXTRAL, H100, tensor_parallel_size=2)
    for cm in (cm4090, tp2):
        for _ in range(20):
            n = int(rng.integers(0, 80))
            k = int(rng.integers(0, 3))
            b = BatchSummary(decode_ctx=rng.integers(1, 5000, n), prefill_chunk=rng.integers(1, 900, k),
                             prefill_ctx=rng.integers(0, 5000, k), num_logits=n + int(rng.integers(0, k + 1)),
                             swap_in_blocks=int(rng.integers(0, 3)), swap_out_blocks=0)
            assert sum(cm.breakdown(b).values()) == pytest.approx(cm.step_time(b), rel=1e-9)


def test_empty_and_swap(cm4090):
    assert cm4090.step_time(BatchSummary()) == 0.0
    base = cm4090.step_time(decode(4, 100))
    one = cm4090.step_time(BatchSummary(decode_ctx=np.full(4, 100), num_logits=4, swap_out_blocks=10))
    two = cm4090.step_time(BatchSummary(decode_ctx=np.full(4, 100), num_logits=4, swap_out_blocks=10,
                                        swap_in_blocks=10))
    # 10 blocks × 16 tokens × 128 KiB over PCIe at 25 GB/s × 0.8
    expect = 10 * 16 * 131072 / (25e9 * cm4090.profile.host_bw_eff)
    assert one - base == pytest.approx(expect, rel=1e-9)
    assert two - base == pytest.approx(2 * expect, rel=1e-9)


def test_decode_step_times_equals_step_time():
    rng = np.random.default_rng(7)
    models = [RooflineCostModel(LLAMA8B, RTX4090), RooflineCostModel(MIXTRAL, H100, tensor_parallel_size=2),
              RooflineCostModel(DSV2LITE, A100),
              RooflineCostModel(LLAMA8B, H100, profile=replace(prior_profile(H100), cuda_graphs=False))]
    for cm in models:
        for n in (1, 3, 8, 9, 64, 255, 513, 700):
            ctx0 = rng.integers(1, 4000, n)
            k = 12
            sums = ctx0.sum() + n * np.arange(k)  # every row grows by one token per step
            logits = None if n % 2 else max(n - 1, 0)
            fast = cm.decode_step_times(n, sums, num_logits=logits)
            assert fast.shape == (k,)
            for i in range(k):
                b = decode(n, ctx0 + i, logits=n if logits is None else logits)
                assert fast[i] == pytest.approx(cm.step_time(b), rel=1e-12, abs=0)


def test_decode_step_times_with_rows_per_step_equals_step_time():
    """A decode run whose rows finish along the way is priced with one row count per step; each step
    must cost exactly what step_time says for that batch (cuda-graph padding, table growth, zero rows)."""
    rng = np.random.default_rng(11)
    models = [RooflineCostModel(LLAMA8B, RTX4090), RooflineCostModel(MIXTRAL, H100, tensor_parallel_size=2),
              RooflineCostModel(LLAMA8B, H100, profile=replace(prior_profile(H100), cuda_graphs=False))]
    for cm in models:
        rows = np.array([700, 600, 513, 512, 257, 64, 9, 8, 3, 1, 0, 2000])  # 2000: past the tables
        sums = rng.integers(1, 4000, len(rows)) * np.maximum(rows, 1)
        fast = cm.decode_step_times(rows, sums)
        assert fast.shape == rows.shape
        for i, n in enumerate(rows.tolist()):
            if n == 0:
                assert fast[i] == 0.0
                continue
            ctx = np.full(n, sums[i] // n)
            ctx[0] += sums[i] - ctx.sum()
            assert fast[i] == pytest.approx(cm.step_time(decode(n, ctx)), rel=1e-12, abs=0)
            assert fast[i] == cm.decode_step_times(n, sums[i:i + 1])[0]  # bit-identical to the scalar path
    const = ConstantCostModel(step_s=0.5, per_token_s=0.01)
    np.testing.assert_allclose(const.decode_step_times(np.array([3, 0, 1]), np.arange(3)), [0.53, 0.0, 0.51])


def test_hot_path_tables_grow_past_initial_size(cm4090):
    big = prefill(5000, 0, logits=300)
    t = cm4090.step_time(big)
    assert t == pytest.approx(sum(cm4090.breakdown(big).values()), rel=1e-9)
    assert cm4090.step_time(prefill(6000)) > cm4090.step_time(prefill(5000))


def test_constant_model():
    cm = ConstantCostModel(step_s=0.5, per_token_s=0.01)
    assert isinstance(cm, CostModel)
    assert cm.step_time(decode(3, 10)) == pytest.approx(0.53)
    assert cm.step_time(prefill(100)) == pytest.approx(1.5)
    assert cm.step_time(BatchSummary()) == 0.0
    np.testing.assert_allclose(cm.decode_step_times(3, np.arange(5)), np.full(5, 0.53))
    assert sum(cm.breakdown(prefill(100)).values()) == pytest.approx(1.5)
    with pytest.raises(ConfigError):
        ConstantCostModel(step_s=-1)


def test_registry():
    assert isinstance(make_cost_model("constant", step_s=2.0), ConstantCostModel)
    cm = make_cost_model("roofline", model=LLAMA8B, gpu=RTX4090, dtype="bf16")
    assert isinstance(cm, RooflineCostModel) and isinstance(cm, CostModel)
    with pytest.raises(UnknownNameError, match="constant.*roofline"):
        make_cost_model("vidur")
    with pytest.raises(ConfigError, match="bogus"):
        make_cost_model("constant", bogus=1)


def test_config_errors():
    with pytest.raises(ConfigError, match="dtype"):
        RooflineCostModel(LLAMA8B, RTX4090, dtype="fp4x")
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        RooflineCostModel(LLAMA8B, RTX4090, kv_cache_dtype="int3")
    with pytest.raises(ConfigError, match="tensor_parallel_size=3"):
        RooflineCostModel(LLAMA8B, H100, tensor_parallel_size=3)


# ---------------------------------------------------------------------------------------------- profiles


def test_profile_json_round_trip(tmp_path):
    p = replace(prior_profile(RTX4090), source="fitted", cuda_graph_sizes=(1, 2, 4, 8))
    assert CalibrationProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    path = tmp_path / "x.json"
    p.save(path)
    assert CalibrationProfile.load(path) == p
    # partial files keep the defaults
    assert CalibrationProfile.from_dict({"eta_kv": 0.5}).eta_kv == 0.5


@pytest.mark.parametrize(("data", "match"), [
    ({"eta_compute": 0.7, "eta_typo": 1}, "eta_typo"),
    ({"eta_compute": 1.7}, "eta_compute"),
    ({"source": "guess"}, "source"),
    ({"cuda_graph_sizes": [8, 4]}, "cuda_graph_sizes"),
    ({"cuda_graphs": "yes"}, "cuda_graphs"),
    ({"step_overhead_s": -1}, "step_overhead_s"),
    ({"step_overhead_s": 1e300}, r"step_overhead_s=1e\+300: must be a number in \[0, 1\]"),
    ({"eta_compute": 5e-324}, r"eta_compute=5e-324: must be a fraction in \[0.01, 1\]"),
    ({"eta_kv": True}, "eta_kv=True"),
    ({"roofline_p": float("inf")}, r"roofline_p=inf: must be in \[1, 16\]"),
    ({"cuda_graph_sizes": [1, 10**30]}, "cuda_graph_sizes"),
    ({"cuda_graph_sizes": [True, 2]}, "cuda_graph_sizes"),
])
def test_profile_validation(data, match):
    with pytest.raises(ConfigError, match=match):
        CalibrationProfile.from_dict(data)


def test_profile_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        CalibrationProfile.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        CalibrationProfile.load(bad)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        CalibrationProfile.load(deep)
    with pytest.raises(ConfigError, match="is a directory"):
        CalibrationProfile.load(tmp_path)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"description": "caf\xe9"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        CalibrationProfile.load(latin)


def test_prior_families():
    assert gpu_family(RTX4090) == "geforce" and gpu_family(H100) == "hopper" and gpu_family(A100) == "a100"
    assert gpu_family(replace(H100, name="H200 SXM")) == "hopper"
    assert gpu_family(replace(A100, name="L40S", interconnect="none", interconnect_bandwidth=0.0)) == "generic"
    p4090, ph, pa = prior_profile(RTX4090), prior_profile(H100), prior_profile(A100)
    assert {p.source for p in (p4090, ph, pa)} == {"prior"}
    assert p4090.eta_compute > ph.eta_compute > pa.eta_compute  # costmodel.md §2.4 ordering
    assert p4090.allreduce_latency_s > ph.allreduce_latency_s  # PCIe vs NVLink floor (§2.2)
    assert p4090.step_overhead_s == pytest.approx(126e-6)  # BLIS fit, costmodel.md §0 item 4


def test_get_profile_prefers_shipped_file(tmp_path, monkeypatch):
    assert gpu_slug("RTX 4090") == "rtx-4090"
    monkeypatch.setattr(profiles, "PROFILE_DIR", tmp_path)
    assert get_profile(RTX4090) == prior_profile(RTX4090)
    fitted = replace(prior_profile(RTX4090), source="fitted", eta_kv=0.5)
    fitted.save(tmp_path / "rtx-4090.json")
    assert get_profile(RTX4090) == fitted
    assert get_profile(RTX4090, "prior") == prior_profile(RTX4090)
    assert get_profile(H100, "rtx-4090") == fitted
    assert get_profile(H100, str(tmp_path / "rtx-4090.json")) == fitted
    with pytest.raises(UnknownNameError, match="prior, rtx-4090"):
        get_profile(H100, "no-such-profile")
    cm = RooflineCostModel(LLAMA8B, RTX4090)
    assert cm.profile.eta_kv == 0.5


# ---------------------------------------------------------------------------------------------- measured data

# costmodel.md §2.3: decode attention kernel time per layer (RTX 4090, Llama-3.1-8B, vLLM 0.19 FA), µs.
DECODE_ATTN_4090 = {
    (1, 128): 13.0, (1, 1024): 14.2, (1, 4096): 24.3, (1, 16384): 56.6,
    (8, 128): 18.4, (8, 1024): 55.6, (8, 4096): 164.7, (8, 16384): 588.8,
    (32, 128): 40.6, (32, 1024): 181.4, (32, 4096): 607.2, (32, 16384): 2294,
    (128, 128): 101.1, (128, 1024): 606.2, (128, 4096): 2302, (128, 16384): 9052,
    (256, 128): 186.0, (256, 1024): 1183, (256, 4096): 4555, (256, 16384): 18004,
}


def test_decode_attention_vs_measured_4090_table(cm4090):
    assert attn_per_layer_us(cm4090, decode(32, 4096)) == pytest.approx(607.2, rel=0.25)
    assert attn_per_layer_us(cm4090, decode(128, 1024)) == pytest.approx(606.2, rel=0.25)
    errs = [abs(attn_per_layer_us(cm4090, decode(n, c)) - v) / v for (n, c), v in DECODE_ATTN_4090.items()]
    assert np.mean(errs) < 0.12
    big = [abs(attn_per_layer_us(cm4090, decode(n, c)) - v) / v
           for (n, c), v in DECODE_ATTN_4090.items() if n * c >= 32768]
    assert max(big) < 0.15


def test_decode_step_vs_measured_4090_kernel_sums(cm4090):
    # costmodel.md §2.3: Llama-3.1-8B RTX 4090 decode at ctx 1024, GPU kernel-time sum (no engine overhead)
    measured_ms = {1: 16.8, 8: 18.6, 32: 23.9, 64: 29.3, 128: 40.5, 256: 63.8}
    for n, ms in measured_ms.items():
        bd = cm4090.breakdown(decode(n, 1024))
        kernels = sum(bd.values()) - bd["step_overhead"] - bd["seq_overhead"]
        assert kernels * 1e3 == pytest.approx(ms, rel=0.12), n


needs_4090_data = pytest.mark.skipif(not RTX4090_DIR.is_dir(), reason="../shared microbench data absent")


def _mape(pred, meas) -> float:
    pred, meas = np.asarray(pred), np.asarray(meas)
    return float(np.mean(np.abs(pred - meas) / meas))


@needs_4090_data
def test_attention_grid_vs_llmservingsim_4090(cm4090):
    import pandas as pd

    a = pd.read_csv(RTX4090_DIR / "attention.csv")
    a = a[(a.n_decode > 0) | (a.prefill_chunk > 0)]
    pred = []
    for r in a.itertuples():
        pc = [r.prefill_chunk] if r.prefill_chunk else []
        b = BatchSummary(decode_ctx=np.full(r.n_decode, r.kv_decode), prefill_chunk=np.array(pc, dtype=np.int64),
                         prefill_ctx=np.array([r.kv_prefill] if pc else [], dtype=np.int64))
        pred.append(attn_per_layer_us(cm4090, b))
    a = a.assign(pred=pred)
    dec, pf = a[a.prefill_chunk == 0], a[a.n_decode == 0]
    mixed = a[(a.prefill_chunk > 0) & (a.n_decode > 0)]
    assert _mape(dec.pred, dec.time_us) < 0.10  # §2.5 reports 8.9 % for this form
    assert _mape(pf.pred, pf.time_us) < 0.20
    assert _mape(mixed.pred, mixed.time_us) < 0.25


@needs_4090_data
def test_layer_gemms_vs_llmservingsim_4090(cm4090):
    import pandas as pd

    d = pd.read_csv(RTX4090_DIR / "dense.csv")
    g = d[d.layer.isin(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])].groupby("tokens").time_us.sum()
    pred = [cm4090.breakdown(prefill(int(m)))["gemm"] / 32 * 1e6 for m in g.index]
    assert _mape(pred, g.values) < 0.06  # §2.4: 3.6 % per GEMM for the fitted 4090 parameters
    s = pd.read_csv(RTX4090_DIR / "per_sequence.csv").pivot(index="sequences", columns="layer", values="time_us")
    lm = [cm4090.breakdown(decode(int(n), 16))["lm_head"] * 1e6 for n in s.index]
    assert _mape(lm, s.lm_head.values) < 0.10
