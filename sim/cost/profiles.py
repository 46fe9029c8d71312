"""Calibration profiles: the efficiencies and fixed costs the roofline cost model multiplies the spec sheet by.

Why a separate type: the formulas (sim/cost/costmodel.py) are the same for every GPU; what changes per (GPU,
kernel library, vLLM version) are a dozen numbers. They come either from spec-sheet priors
(`prior_profile`, values from reference/costmodel.md with each one cited) or from a fitted JSON file
shipped in sim/cost/data/profiles/<gpu-slug>.json (written by the calibration tooling).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, UnknownNameError
from sim.core.fields import load_json
from sim.cost.hardware import GpuSpec

PROFILE_DIR = Path(__file__).resolve().parent / "data" / "profiles"

# vLLM V1 CUDA-graph capture sizes as the task brief specifies them: 1, 2, 4, then steps of 8 up to 512
# (costmodel.md §2.1 practical rules: V1 `cudagraph_capture_sizes` + `bs_to_padded_graph_size`, PR #28315).
DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, *range(8, 513, 8))

_SOURCES = ("prior", "fitted")
# Physical ranges a profile's fields must lie in (wider than servesim fit's bounds, sim/cost/calibrate/fit.py):
MIN_EFFICIENCY = 0.01  # of a roof (peak FLOP/s or bandwidth)
MAX_ROOFLINE_P = 16.0  # the p-norm joining compute and memory time (fitted: 1.6-3.2; the fit allows 8)
MAX_FIXED_S = 1.0  # a fixed cost per step, layer, sequence or kernel (fitted: at most 0.13 ms)
MAX_PROFILE_TOKENS = 1e7  # a token-count shape parameter (fitted: 18-16,384)
MAX_GRAPH_SIZE = 1 << 20  # a CUDA graph's batch size (vLLM captures up to 512 by default)
_MAX_NON_TIME = {"attn_ctx_pad_tokens": MAX_PROFILE_TOKENS, "prefill_causal_ramp_tokens": MAX_PROFILE_TOKENS,
                 "sampler_bytes_per_elem": 64.0}


def _number(v: Any) -> bool:
    """An int or float, not a bool (JSON's true is not 1.0 here)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class CalibrationProfile:
    """Efficiencies (fractions of the spec-sheet peak) and fixed costs (seconds) for one GPU.

    Defaults are the generic prior; `prior_profile` overrides them per GPU family.
    """

    gpu: str = "generic"
    source: str = "prior"  # "prior" (spec sheet + literature) or "fitted" (microbenchmarks)
    description: str = ""
    # --- GEMMs: smooth roofline t = ((F/(P·η_c))^p + (B/(BW·η_b))^p)^(1/p) + t0   (costmodel.md §0 item 2)
    eta_compute: float = 0.70
    eta_bandwidth: float = 0.88
    roofline_p: float = 1.6
    t0_gemm_s: float = 7e-6
    # --- decode attention: t0 + c·n + (Σctx + k·n)·kvB/(BW·η_kv) per layer       (costmodel.md §2.5)
    attn_t0_s: float = 12e-6
    eta_kv: float = 0.90
    attn_per_seq_s: float = 0.12e-6
    attn_ctx_pad_tokens: float = 18.0
    # --- prefill attention: max(causal FLOPs/(P·η_fa), KV bytes/(BW·η_kv·occ))
    #     occ = clip(chunk / prefill_kv_sat_tokens, prefill_kv_floor, 1): a single varlen sequence launches few
    #     CTAs, so a small chunk after a long cached context streams KV at ~13 % of BW (costmodel.md §2.3).
    eta_fa: float = 0.60
    prefill_kv_floor: float = 0.146
    prefill_kv_sat_tokens: float = 16384.0
    # --- the causal (chunk × chunk) part of a prefill runs below η_fa for short chunks: its FLOP time is scaled
    #     by 1 + prefill_causal_ramp_tokens/chunk (fitted on LLMServingSim RTX 4090 attention.csv: 0.32/0.48/0.62
    #     of peak at 512/1024/2048 tokens, p = 0). prefill_chunk_t0_s: fixed cost per prefill sequence (the
    #     FlashInfer prefill timings of the BLIS H100 files sit 30-50 µs above their FLOP time). 0 = off.
    prefill_causal_ramp_tokens: float = 0.0
    prefill_chunk_t0_s: float = 0.0
    # --- decode rows in a step that also holds a prefill chunk: FA2 varlen runs with max_seqlen_q > 1 and does
    #     not pack the query heads that share a KV head, so part of the nh/nkv re-reads reach HBM. KV time of the
    #     decodes is multiplied by 1 + φ·(nh/nkv − 1).
    mixed_decode_gqa_reread: float = 0.45
    #     FA2 varlen gives each (sequence, query head) one CTA streaming the whole context without split-KV, so
    #     the decodes of a mixed step also cost at least max(τ_h·nh·Σctx, τ_s·max ctx): waves of CTAs
    #     (LLMServingSim RTX 4090 attention.csv: 1 and 4 decodes at ctx 16384 beside a 16-token chunk both take
    #     520 µs, 8 take 1045 µs, 32 take 4125 µs). 0 = off.
    mixed_decode_head_token_s: float = 0.0
    mixed_decode_seq_token_s: float = 0.0
    # --- elementwise kernels (norms, RoPE, SiLU·mul, residual adds, KV write, embedding): per layer
    #     max(bytes/(BW·η_elementwise), layer_fixed_s): small batches are latency bound, large ones stream
    eta_elementwise: float = 0.90
    layer_fixed_s: float = 10e-6
    # --- embedding gather + final norm, once per step: max(bytes/(BW·η_elementwise), step_elementwise_fixed_s)
    step_elementwise_fixed_s: float = 0.0
    # --- sampler: t0 + num_logits·vocab·bytes_per_elem/(BW·η_elementwise)
    sampler_t0_s: float = 25e-6
    sampler_bytes_per_elem: float = 8.0
    # --- engine (CPU, sync) overheads per step and per scheduled sequence
    step_overhead_s: float = 126e-6
    per_seq_overhead_s: float = 4.4e-6
    # --- tensor-parallel all-reduce. "interconnect": the per-interconnect alpha-beta model with published
    #     figures (sim/cost/collectives.py, data/allreduce.json); "profile": α + 2(t−1)/t · bytes / (link BW ·
    #     eff) with the two fields below (what `servesim fit` sets when it has measured all-reduces).
    allreduce_model: str = "interconnect"
    allreduce_latency_s: float = 8e-6
    allreduce_bw_eff: float = 0.80
    # --- CUDA graphs: decode-only batches run padded to the next capture size
    cuda_graphs: bool = True
    cuda_graph_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    cuda_graph_pad_mixed: bool = False  # V1 piecewise graphs also pad mixed batches; off until measured
    # --- swap (GPU<->CPU KV copies over PCIe)
    host_bw_eff: float = 0.80
    # --- provenance of a fitted profile (device, driver, torch/CUDA versions, data files, fit command, per-
    #     operator fit error); free-form JSON, ignored by the cost model. Not hashed.
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("gpu", "description"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"profile field {name}={getattr(self, name)!r}: must be a string")
        if self.source not in _SOURCES:
            raise ConfigError(f"profile source {self.source!r}: expected one of {_SOURCES}")
        for name in (
            "eta_compute",
            "eta_bandwidth",
            "eta_kv",
            "eta_fa",
            "eta_elementwise",
            "allreduce_bw_eff",
            "host_bw_eff",
            "prefill_kv_floor",
        ):
            v = getattr(self, name)
            # A kernel at under 1 % of its roof is a broken measurement, not a GPU (the fit's floor is 2 %).
            if not (_number(v) and MIN_EFFICIENCY <= v <= 1.0):
                raise ConfigError(f"profile field {name}={v!r}: must be a fraction in [{MIN_EFFICIENCY}, 1]")
        if not (_number(self.mixed_decode_gqa_reread) and 0.0 <= self.mixed_decode_gqa_reread <= 1.0):
            raise ConfigError(
                f"profile field mixed_decode_gqa_reread={self.mixed_decode_gqa_reread!r}: must be in [0, 1]"
            )
        if not (_number(self.roofline_p) and 1.0 <= self.roofline_p <= MAX_ROOFLINE_P):
            raise ConfigError(f"profile field roofline_p={self.roofline_p!r}: must be in [1, {MAX_ROOFLINE_P:g}]")
        for name in (
            "t0_gemm_s",
            "attn_t0_s",
            "attn_per_seq_s",
            "attn_ctx_pad_tokens",
            "prefill_causal_ramp_tokens",
            "prefill_chunk_t0_s",
            "mixed_decode_head_token_s",
            "mixed_decode_seq_token_s",
            "layer_fixed_s",
            "step_elementwise_fixed_s",
            "sampler_t0_s",
            "sampler_bytes_per_elem",
            "step_overhead_s",
            "per_seq_overhead_s",
            "allreduce_latency_s",
        ):
            v = getattr(self, name)
            top = _MAX_NON_TIME.get(name, MAX_FIXED_S)
            if not (_number(v) and math.isfinite(v) and 0 <= v <= top):
                raise ConfigError(f"profile field {name}={v!r}: must be a number in [0, {top:g}]")
        if not (_number(self.prefill_kv_sat_tokens) and 0 < self.prefill_kv_sat_tokens <= MAX_PROFILE_TOKENS):
            raise ConfigError(
                f"profile field prefill_kv_sat_tokens={self.prefill_kv_sat_tokens!r}: must be in "
                f"(0, {MAX_PROFILE_TOKENS:g}]"
            )
        if self.allreduce_model not in ("interconnect", "profile"):
            raise ConfigError(
                f"profile field allreduce_model={self.allreduce_model!r}: expected 'interconnect' or 'profile'"
            )
        if not isinstance(self.metadata, dict):
            raise ConfigError(f"profile field metadata={self.metadata!r}: must be a JSON object")
        sizes = self.cuda_graph_sizes
        if (
            not sizes
            or any(not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= MAX_GRAPH_SIZE for s in sizes)
            or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False))
        ):
            raise ConfigError(
                f"profile field cuda_graph_sizes={sizes!r}: must be increasing integers in [1, {MAX_GRAPH_SIZE}]"
            )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cuda_graph_sizes"] = list(self.cuda_graph_sizes)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: CalibrationProfile | None = None) -> CalibrationProfile:
        """Keys absent from `data` keep `base`'s values (the generic defaults when no base is given)."""
        if not isinstance(data, dict):
            raise ConfigError(f"calibration profile must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(
                    f"unknown calibration profile key {key!r} (known: {', '.join(sorted(known))})"
                )
        kw = dict(data)
        if "cuda_graph_sizes" in kw:
            sizes = kw["cuda_graph_sizes"]
            if not isinstance(sizes, list | tuple):
                raise ConfigError(f"profile field cuda_graph_sizes={sizes!r}: must be a list of integers")
            kw["cuda_graph_sizes"] = tuple(sizes)
        for key in ("cuda_graphs", "cuda_graph_pad_mixed"):
            if key in kw and not isinstance(kw[key], bool):
                raise ConfigError(f"profile field {key}={kw[key]!r}: must be true or false")
        return replace(base or cls(), **kw)

    @classmethod
    def load(cls, path: str | Path) -> CalibrationProfile:
        data = load_json(Path(path), "calibration profile file")
        if not isinstance(data, dict):
            raise ConfigError(f"calibration profile {path}: expected a JSON object, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except ConfigError as e:  # which file: a run's result passed as --profile reads as a profile with odd keys
            raise ConfigError(f"calibration profile {path}: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


# ---------------------------------------------------------------------- priors


def gpu_family(gpu: GpuSpec) -> str:
    """'a100', 'hopper' (H100/H200), 'geforce' (RTX 4090 and other GeForce cards) or 'generic'."""
    name = gpu.name.lower()
    if "a100" in name or "a800" in name:
        return "a100"
    if re.search(r"\bh(100|200|800)\b|gh200", name):
        return "hopper"
    if "4090" in name or "geforce" in name or re.search(r"\brtx\s*\d{4}\b", name):
        return "geforce"
    return "generic"


def prior_profile(gpu: GpuSpec) -> CalibrationProfile:
    """Spec-sheet priors by GPU family; every number is cited to reference/costmodel.md or to the shared data."""
    fam = gpu_family(gpu)
    link = gpu.interconnect.lower()
    nvlink = ("nvlink" in link or "infinity" in link) and gpu.interconnect_bandwidth > 0
    # costmodel.md §2.2: α_AR 5–10 µs (custom AR / NVLS under graphs), 20–50 µs (eager NCCL, PCIe islands).
    ar_latency = 8e-6 if nvlink else 30e-6
    common: dict[str, Any] = {"allreduce_latency_s": ar_latency}
    if fam == "geforce":
        kw = dict(
            description=(
                "RTX 4090 / GeForce prior: GEMM fit on LLMServingSim Llama-3.1-8B (costmodel.md §2.4), "
                "attention fit §2.5, mixed-batch factor fitted on the same attention.csv"
            ),
            eta_compute=0.967,  # §2.4 RTX 4090: η_c 0.967 vs the FP32-accumulate peak (165.2 TFLOPS)
            eta_bandwidth=0.937,  # §2.4 RTX 4090: η_b 0.937
            roofline_p=2.36,  # §2.4 RTX 4090: p 2.36
            t0_gemm_s=5.7e-6,  # §2.4 RTX 4090: t0 5.7 µs
            attn_t0_s=11.5e-6,  # §2.5: t0 11.5 µs, η 0.919, c 0.12 µs/seq, k 18 (8.9 % MAPE)
            eta_kv=0.919,
            attn_per_seq_s=0.12e-6,
            attn_ctx_pad_tokens=18.0,
            eta_fa=0.705,  # §2.5 prefill η_c 0.70; refit with the floor below on attention.csv: 0.705, 9.1 % MAPE
            # §2.3: 16-token chunk after 8192 cached tokens = 13 % of BW; fit on LLMServingSim attention.csv
            # (prefill-only rows): floor 0.146 of η_kv, no visible saturation below 16K (max() combination).
            prefill_kv_floor=0.146,
            prefill_kv_sat_tokens=16384.0,
            # Least-squares fit on the mixed rows of LLMServingSim RTX4090 attention.csv (prefill chunk + decodes
            # in one kernel): decode KV time ×2.34 for Llama-3.1-8B (nh/nkv = 4) → φ = 0.45; MAPE 36 % → 18 %.
            mixed_decode_gqa_reread=0.45,
            # LLMServingSim RTX4090 dense.csv: SiLU·mul at 2048 tokens streams ≈1.0×spec BW (L2 helps);
            # the 4 small per-layer kernels at M=1 (2 norms, RoPE, act) take ≈2–2.6 µs each.
            eta_elementwise=1.0,
            layer_fixed_s=10e-6,
            # LLMServingSim RTX4090 per_sequence.csv: sampler 25 µs at 1 sequence, 311 µs at 256 (vocab 128256).
            sampler_t0_s=25e-6,
            sampler_bytes_per_elem=8.0,
        )
    elif fam == "a100":
        kw = dict(
            description="A100 prior: GEMM fits on Vidur A100 profiles (costmodel.md §2.4); attention assumed",
            eta_compute=0.71,  # §2.4: 0.710 / 0.716 (Llama-2-7B / Llama-3-8B shapes)
            eta_bandwidth=0.90,  # §2.4: 0.869 / 0.924; §2.2: 0.87–0.92
            roofline_p=1.6,  # §2.4: 1.86 / 1.46
            t0_gemm_s=7.5e-6,  # §2.4: 7.6 / 7.4 µs
            attn_t0_s=11.5e-6,  # no A100 attention data (§6 caveat): RTX 4090 values of §2.5 assumed
            eta_kv=0.88,  # assumed ≈ measured A100 copy BW fraction (§2.3: 88 %)
            eta_fa=0.60,  # from memory (FlashAttention-2 paper: 50–73 % of A100 peak); unverified
            mixed_decode_gqa_reread=0.45,  # same FA2 varlen kernel as on Ada (vLLM); assumed, not measured
            eta_elementwise=0.90,
        )
    elif fam == "hopper":
        kw = dict(
            description=(
                "H100/H200 prior: GEMM fit on Vidur H100 profiles (costmodel.md §2.4); attention fit "
                "on BLIS H100 FlashInfer microbenchmarks (shared data)"
            ),
            eta_compute=0.79,  # §2.4 H100: 0.787
            eta_bandwidth=0.92,  # §2.4 H100: 0.920; §2.2: 0.92
            roofline_p=1.36,  # §2.4 H100: 1.36
            t0_gemm_s=5.4e-6,  # §2.4 H100: 5.4 µs
            # blis-h100-attention decode 32-8-128-tp1.csv (FlashInfer, bf16), fit t0 + c·n + Σ(ctx+18)·kvB/(BW·η):
            # η 0.94, t0 18 µs, c ≈ 0.03 µs (4.9 % MAPE); rows with n·ctx ≥ 256K: η 0.92, t0 4 µs.
            attn_t0_s=12e-6,
            eta_kv=0.93,
            attn_per_seq_s=0.03e-6,
            # blis-h100-attention prefill 32-8-128.csv: 8K–32K causal prefill reaches 0.72–0.77 of 989 TFLOPS.
            eta_fa=0.72,
            mixed_decode_gqa_reread=0.0,  # vLLM uses FA3 on Hopper, which packs GQA heads: assumed, unverified
            eta_elementwise=0.90,
        )
    else:
        kw = dict(description="generic prior (class defaults): no GPU-specific data")
    return CalibrationProfile(gpu=gpu.name, source="prior", **{**common, **kw})


# ---------------------------------------------------------------------- lookup


def gpu_slug(name: str) -> str:
    """'RTX 4090' -> 'rtx-4090', 'H100 SXM' -> 'h100-sxm': the file name of a shipped profile."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json")) if PROFILE_DIR.is_dir() else []


def get_profile(gpu: GpuSpec, name_or_path: str | Path | None = None) -> CalibrationProfile:
    """None: the shipped fitted profile for this GPU if there is one, else the prior.

    "prior": the prior. A path to a .json file: that file. Any other string: a shipped profile by name.
    """
    if name_or_path is None:
        shipped = PROFILE_DIR / f"{gpu_slug(gpu.name)}.json"
        return CalibrationProfile.load(shipped) if shipped.is_file() else prior_profile(gpu)
    if isinstance(name_or_path, str) and name_or_path == "prior":
        return prior_profile(gpu)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.is_file():
        return CalibrationProfile.load(path)
    shipped = PROFILE_DIR / f"{gpu_slug(str(name_or_path))}.json"
    if shipped.is_file():
        return CalibrationProfile.load(shipped)
    known = ["prior", *shipped_profiles()]
    raise UnknownNameError(f"unknown calibration profile {name_or_path!r}; known: {', '.join(known)}")
