"""Which linear-layer kernel a quantized checkpoint runs on a card, and what it costs beyond its bytes.

The roofline prices a GEMM by its FLOPs at a peak and its bytes at a bandwidth (sim/cost/costmodel.py).
Quantized weights change both sides, and how depends on the kernel vLLM picks for the checkpoint and the
card's compute capability (vLLM's quantization hardware table, docs.vllm.ai "Supported Hardware"):

* **FP8 W8A8** (``dtype = "fp8"`` on sm89+: Ada, Hopper, Blackwell; MI300X): weights and activations in
  FP8, the GEMM at the card's FP8 tensor-core peak (CUTLASS / cuBLASLt scaled-mm).
* **FP8 weight-only, W8A16** (``"fp8"`` on sm80/86: Ampere): vLLM runs FP8 checkpoints there through the
  FP8 Marlin kernel: 1-byte weights, 16-bit tensor cores, plus the dequantization work (below). Turing
  (T4) has no FP8 path: an error.
* **INT8 W8A8** (``"int8"`` / ``"w8a8"`` / ``"smoothquant"``, sm75+): INT8 tensor cores at the INT8 peak.
* **4-bit weight-only, W4A16** (``"awq"``, ``"gptq"``, ``"w4a16"``, ``"int4"``): on sm80+ vLLM converts
  AWQ/GPTQ checkpoints to the Marlin kernel (``awq_marlin`` / ``gptq_marlin``); on Hopper GPTQ-style
  checkpoints use Machete. Below sm80 (T4) the original AWQ GEMM / GPTQ kernels run.

Figures (each a constant below, with its source):

* ``MARLIN_DEQUANT_OVERHEAD = 0.15``: compute-bound Marlin GEMMs take 15 % longer than 16-bit ones (the
  dequantization runs on the CUDA cores beside the tensor cores). MARLIN (Frantar et al., PPoPP 2025,
  arXiv 2408.11743, abstract): "batchsizes up to 16-32 ... with close to maximum (4x) quantization speedup,
  and larger batchsizes up to 64-128 with gradually decreasing, but still significant, acceleration". The
  15 % is our reading of that curve, not a measurement: with it the modelled W4A16/FP16 time of all of
  Llama-3.1-8B's GEMMs (launch floors included) on an A100 is 2.5x at 16 tokens, 1.2x at 128 and 0.87x
  (slower) at 4096 (tests/test_quant.py).
* ``MACHETE_DEQUANT_OVERHEAD = 0.0``: Machete (Neural Magic, Oct 2024; vLLM's W4A16 kernel on Hopper)
  "matches compute-bound performance" of FP16.
* ``LEGACY_W4_BANDWIDTH = 0.75`` and ``LEGACY_W4_OVERHEAD = 1.0`` (pre-Marlin AWQ/GPTQ kernels, T4 and
  non-NVIDIA cards): AutoAWQ's README reports 3x over FP16 on memory-bound decoding where the bytes allow
  ~4x (so 3/4 of the bandwidth), and vLLM's AutoAWQ page (v0.5-v0.7) warns that "vLLM's AWQ
  implementation have lower throughput than unquantized version": we take half the 16-bit compute rate, an
  assumption that only says "slower than FP16 once compute-bound".
* 4-bit weights read their fp16 group scale and zero too: 4 B per 128 weights (sim/cost/modelspec.py).

Not modelled: the per-token activation quantization of W8A8 (one small elementwise kernel per GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.cost.hardware import GpuSpec
from sim.cost.modelspec import DTYPE_BYTES, QUANT_GROUP_OVERHEAD_BYTES, QUANT_GROUP_SIZE, normalize_dtype

MARLIN_DEQUANT_OVERHEAD = 0.15
MACHETE_DEQUANT_OVERHEAD = 0.0
LEGACY_W4_BANDWIDTH = 0.75
LEGACY_W4_OVERHEAD = 1.0
_W4_BYTES = DTYPE_BYTES["int4"] + QUANT_GROUP_OVERHEAD_BYTES / QUANT_GROUP_SIZE
_MACHETE_NAMES = ("gptq", "gptq_marlin", "w4a16")  # compressed-tensors / GPTQ checkpoints on Hopper


@dataclass(frozen=True)
class QuantKernel:
    """The linear-layer kernel: bytes per weight, the FLOP/s it computes at (before the profile's
    efficiency), and the fraction of the GEMM bandwidth it reaches."""

    name: str
    weight_bytes: float
    peak: float
    bandwidth_factor: float = 1.0
    weight_only: bool = False


def compute_capability(gpu: GpuSpec) -> float | None:
    """CUDA compute capability from the catalogue's architecture (None: not an NVIDIA card)."""
    arch = gpu.arch.lower()
    table = (("turing", 7.5), ("ampere ga100", 8.0), ("ampere", 8.6), ("ada", 8.9), ("hopper", 9.0),
             ("blackwell gb202", 12.0), ("blackwell", 10.0))  # fmt: skip
    for prefix, cc in table:
        if arch.startswith(prefix):
            return cc
    if arch.startswith("generic"):  # the seeds' 24 GB card is modelled on the RTX 4090 (Ada)
        return 8.9
    return None


def select_kernel(dtype: str, gpu: GpuSpec, half_peak: float) -> QuantKernel:
    """The kernel vLLM would run ``dtype`` weights with on ``gpu`` (module doc); ``half_peak`` is the
    16-bit (or TF32) tensor rate the dense path uses. ConfigError for a dtype the card cannot run."""
    raw = str(dtype).strip().lower()
    canon = normalize_dtype(raw)
    cc = compute_capability(gpu)
    if canon in ("bf16", "fp16", "fp32"):
        return QuantKernel("dense", DTYPE_BYTES[canon], half_peak)
    if canon == "fp8":
        if gpu.fp8_flops and (cc is None or cc >= 8.9):
            return QuantKernel("fp8-w8a8", 1.0, gpu.fp8_flops)
        if cc is None or cc >= 8.0:  # (an unknown card without an FP8 rate: weight-only, like Ampere)
            return QuantKernel("fp8-marlin-w8a16", 1.0, half_peak / (1 + MARLIN_DEQUANT_OVERHEAD), weight_only=True)
        raise ConfigError(f"dtype {dtype!r} on {gpu.name}: vLLM runs FP8 weights on compute capability >= 8.0 "
                          f"(FP8 tensor cores from 8.9, weight-only Marlin on 8.0-8.6); {gpu.name} has neither; "
                          f"allowed there: fp16, {'bf16, ' if gpu.supports_bf16 else ''}int8, awq, gptq")  # fmt: skip
    if canon == "int8":
        if not gpu.int8_ops:
            raise ConfigError(f"dtype {dtype!r} on {gpu.name}: no INT8 tensor-core rate in the catalogue")
        return QuantKernel("int8-w8a8", 1.0, gpu.int8_ops)
    # 4-bit weight-only
    if cc is not None and cc >= 8.0:
        if cc >= 9.0 and cc < 10.0 and raw in _MACHETE_NAMES:
            return QuantKernel("machete-w4a16", _W4_BYTES, half_peak / (1 + MACHETE_DEQUANT_OVERHEAD),
                               weight_only=True)  # fmt: skip
        return QuantKernel("marlin-w4a16", _W4_BYTES, half_peak / (1 + MARLIN_DEQUANT_OVERHEAD), weight_only=True)
    return QuantKernel("awq-gemm-w4a16", _W4_BYTES, half_peak / (1 + LEGACY_W4_OVERHEAD), LEGACY_W4_BANDWIDTH,
                       weight_only=True)  # fmt: skip
