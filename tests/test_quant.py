"""Quantized weights change the step cost, not only the memory: the kernel vLLM would pick per card and
what it costs (sim/cost/quant.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.core.errors import ConfigError
from sim.cost.costmodel import RooflineCostModel
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model
from sim.cost.quant import MARLIN_DEQUANT_OVERHEAD, compute_capability, select_kernel

LLAMA8B = get_model("Llama-3.1-8B")
M = np.array([1, 16, 128, 4096])


def gemm_speedup(gpu: str, dtype: str) -> np.ndarray:
    """16-bit GEMM time / quantized GEMM time for all the linear layers, at M tokens per step."""
    g = get_gpu(gpu)
    base = RooflineCostModel(LLAMA8B, g, dtype="fp16")._token_parts(M)["gemm"]
    return base / RooflineCostModel(LLAMA8B, g, dtype=dtype)._token_parts(M)["gemm"]


def test_kernel_choice_follows_the_compute_capability():
    assert compute_capability(get_gpu("T4")) == 7.5 and compute_capability(get_gpu("H100 SXM")) == 9.0
    assert compute_capability(get_gpu("MI300X")) is None
    names = {(g, d): select_kernel(d, get_gpu(g), 1.0).name
             for g in ("T4", "A100 40GB SXM", "RTX 4090", "H100 SXM") for d in ("awq", "gptq", "fp8", "int8")
             if not (g == "T4" and d == "fp8")}  # fmt: skip
    assert names[("A100 40GB SXM", "fp8")] == "fp8-marlin-w8a16"  # Ampere: no FP8 tensor cores
    assert names[("RTX 4090", "fp8")] == names[("H100 SXM", "fp8")] == "fp8-w8a8"
    assert names[("T4", "awq")] == "awq-gemm-w4a16"  # no Marlin below sm80
    assert names[("A100 40GB SXM", "awq")] == names[("H100 SXM", "awq")] == "marlin-w4a16"
    assert names[("H100 SXM", "gptq")] == "machete-w4a16"
    assert all(v == "int8-w8a8" for (g, d), v in names.items() if d == "int8")
    with pytest.raises(ConfigError, match="T4.*compute capability"):
        select_kernel("fp8", get_gpu("T4"), 1.0)
    with pytest.raises(ConfigError, match="T4"):
        RooflineCostModel(LLAMA8B, get_gpu("T4"), dtype="fp8")


def test_w4a16_is_fast_when_memory_bound_and_slower_than_fp16_when_compute_bound():
    s = gemm_speedup("A100 80GB SXM", "awq")
    assert s[0] > 2.5 and s[1] > 2.3  # bytes decide: 4-bit weights (launch floors cap it below 4x)
    assert 1.05 < s[2] < 1.6  # "gradually decreasing, but still significant" (MARLIN) at 128 tokens
    assert s[3] == pytest.approx(1 / (1 + MARLIN_DEQUANT_OVERHEAD), rel=0.03)  # prefill pays the dequant
    legacy = gemm_speedup("T4", "awq")
    assert legacy[0] < gemm_speedup("T4", "fp16")[0] * 4 and legacy[3] == pytest.approx(0.5, rel=0.05)
    assert gemm_speedup("H100 SXM", "gptq")[3] == pytest.approx(1.0, rel=0.03)  # Machete: no compute penalty


def test_fp8_and_int8_compute_at_their_peaks_where_the_card_has_them():
    h = gemm_speedup("H100 SXM", "fp8")
    assert h[3] == pytest.approx(2.0, rel=0.05)  # FP8 tensor cores: twice the bf16 rate, compute-bound
    a = gemm_speedup("A100 80GB SXM", "fp8")
    assert a[0] > 1.5 and a[3] < 0.9  # weight-only FP8 on Ampere: bytes halve, compute pays the dequant
    assert gemm_speedup("A100 80GB SXM", "int8")[3] == pytest.approx(2.0, rel=0.05)  # 624 vs 312 TOPS


def test_quantized_steps_price_end_to_end():
    g = get_gpu("A100 40GB SXM")
    from sim.core.batch import BatchSummary

    dec = BatchSummary(decode_ctx=np.full(8, 1024), prefill_chunk=np.array([], dtype=np.int64),
                       prefill_ctx=np.array([], dtype=np.int64))  # fmt: skip
    fp16, awq = (RooflineCostModel(LLAMA8B, g, dtype=d) for d in ("fp16", "awq"))
    assert awq.step_time(dec) < 0.7 * fp16.step_time(dec)
    assert sum(awq.breakdown(dec).values()) == pytest.approx(awq.step_time(dec))
