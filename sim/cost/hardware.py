"""GPU catalogue and interconnects.

Facts come from ``shared/data/reference/gpus.csv`` / costmodel.md §3 (dense tensor peaks, no 2:4 sparsity),
kept here as Python data. ``memory_bytes`` is the capacity the driver reports (vLLM's total_gpu_memory):
the measured value where we have one (RTX 4090: meta.json of the e2e run), else gpus.csv
``mem_GiB_usable_approx`` × 2^30. Caveat: torch's total (what vLLM uses) sits ~0.4-0.5 GiB below the
nvidia-smi figure (RTX 4090: 23.52 vs 23.99 GiB), so csv-based capacities may overstate it by about that much.
GeForce peaks use FP32 accumulation (costmodel.md §3 pitfalls: vLLM's bf16 GEMMs accumulate in FP32, which
runs at half rate on GeForce cards).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from sim.core.errors import ConfigError, UnknownNameError

GiB = 1 << 30
MiB = 1 << 20
T = 1e12
GB = 1e9

# PCIe x16, one direction, theoretical (gpus.csv host_link: "PCIe4 x16 (64 GB/s)" is bidirectional).
PCIE3 = 16 * GB
PCIE4 = 32 * GB
PCIE5 = 64 * GB

# All-reduce latency floors (costmodel.md §2.2: α_AR 5-10 µs with NVLS / vLLM custom all-reduce under CUDA
# graphs, 20-50 µs eager NCCL; §1.1: llm-analysis intra_node_min_message_latency 8 µs). PCIe-only cards have
# no custom all-reduce in vLLM, so they pay an NCCL floor.
FAST_LINK_LATENCY_S = 8e-6
PCIE_LATENCY_S = 25e-6
FAST_LINKS = ("nvlink", "nvlink-bridge", "infinity-fabric", "hccs")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Spec-sheet facts (dense peaks, no sparsity). Units: bytes, bytes/s, FLOP/s."""

    name: str
    memory_bytes: int  # vendor capacity (e.g. 24 GB card -> 24e9 or the GiB the driver reports)
    mem_bandwidth: float  # bytes/s
    fp16_flops: float  # dense, with the accumulation vLLM uses (FP32 accumulate on GeForce)
    bf16_flops: float
    fp8_flops: float | None
    int8_ops: float | None
    interconnect: str  # "nvlink", "pcie", "infinity-fabric", ...
    interconnect_bandwidth: float  # bytes/s, one direction, per GPU
    host_bandwidth: float  # bytes/s, one direction, GPU<->CPU (PCIe): swap cost
    # --- added fields ---
    max_link_gpus: int = 1  # GPUs the fast link joins (NVLink bridge 2, HGX 8); beyond: PCIe
    supports_bf16: bool = True  # T4 (sm75) has no BF16: bf16_flops repeats fp16 (vLLM falls back to fp16)
    arch: str = ""
    confidence: str = "high"  # gpus.csv confidence column

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    def link_bandwidth(self, tp: int) -> float:
        """Per-direction bandwidth a ring of ``tp`` GPUs gets: the fast link if it spans them, else PCIe."""
        if self.interconnect in FAST_LINKS and tp <= self.max_link_gpus:
            return self.interconnect_bandwidth
        return self.host_bandwidth

    def link_latency(self, tp: int) -> float:
        if self.interconnect in FAST_LINKS and tp <= self.max_link_gpus:
            return FAST_LINK_LATENCY_S
        return PCIE_LATENCY_S


def _gib(x: float) -> int:
    return int(round(x * GiB))


_CATALOGUE: tuple[GpuSpec, ...] = (
    # gpus.csv: T4 datasheet; 320 GB/s, 65 TF FP16 (no BF16), 130 TOPS INT8, PCIe3; 15.0 GiB usable.
    GpuSpec(
        "T4",
        _gib(15.0),
        320 * GB,
        65 * T,
        65 * T,
        None,
        130 * T,
        "pcie",
        PCIE3,
        PCIE3,
        supports_bf16=False,
        arch="Turing",
    ),
    # gpus.csv: GA102 whitepaper (medium): 936 GB/s, 71 TF w/ FP32 accumulate, NVLink bridge 112.5 GB/s bidir.
    # Memory: gpus.csv says 24.0 GiB (vendor figure); the driver reports a little less (cf. RTX 4090 below).
    GpuSpec(
        "RTX 3090",
        _gib(24.0),
        936 * GB,
        71 * T,
        71 * T,
        None,
        284 * T,
        "nvlink-bridge",
        56.25 * GB,
        PCIE4,
        max_link_gpus=2,
        arch="Ampere GA102",
        confidence="medium",
    ),
    # gpus.csv: Ada whitepaper: 1008 GB/s, 165.2 TF w/ FP32 accumulate (330.3 w/ FP16), FP8 330.3, INT8 660.6.
    # memory_bytes: device_total_memory_bytes of the real vLLM 0.19 run (shared/data/e2e/rtx4090-*/meta.json).
    # No P2P on the 4090: all-reduce goes over PCIe through the host.
    GpuSpec(
        "RTX 4090",
        25_250_627_584,
        1008 * GB,
        165.2 * T,
        165.2 * T,
        330.3 * T,
        660.6 * T,
        "pcie",
        PCIE4,
        PCIE4,
        arch="Ada AD102",
    ),
    # gpus.csv: A10 datasheet: 600 GB/s, 125 TF, 250 TOPS INT8; 22.5 GiB usable.
    GpuSpec(
        "A10",
        _gib(22.5),
        600 * GB,
        125 * T,
        125 * T,
        None,
        250 * T,
        "pcie",
        PCIE4,
        PCIE4,
        arch="Ampere GA102",
    ),
    # gpus.csv: L4 datasheet: 300 GB/s, 121 TF, FP8/INT8 242.5 (dense); 22.5 GiB usable.
    GpuSpec(
        "L4",
        _gib(22.5),
        300 * GB,
        121 * T,
        121 * T,
        242.5 * T,
        242.5 * T,
        "pcie",
        PCIE4,
        PCIE4,
        arch="Ada AD104",
    ),
    # gpus.csv: L40S datasheet / BLIS hardware_config.json: 864 GB/s, 362.05 TF, FP8/INT8 733; 44.4 GiB usable.
    GpuSpec(
        "L40S",
        _gib(44.4),
        864 * GB,
        362.05 * T,
        362.05 * T,
        733 * T,
        733 * T,
        "pcie",
        PCIE4,
        PCIE4,
        arch="Ada AD102",
    ),
    # gpus.csv: A100 datasheet: 312 TF BF16, 624 TOPS INT8, no FP8; NVLink 600 GB/s bidir = 300 per direction.
    GpuSpec(
        "A100 40GB PCIe",
        _gib(40.0),
        1555 * GB,
        312 * T,
        312 * T,
        None,
        624 * T,
        "nvlink-bridge",
        300 * GB,
        PCIE4,
        max_link_gpus=2,
        arch="Ampere GA100",
    ),
    GpuSpec(
        "A100 40GB SXM",
        _gib(40.0),
        1555 * GB,
        312 * T,
        312 * T,
        None,
        624 * T,
        "nvlink",
        300 * GB,
        PCIE4,
        max_link_gpus=8,
        arch="Ampere GA100",
    ),
    GpuSpec(
        "A100 80GB PCIe",
        _gib(80.0),
        1935 * GB,
        312 * T,
        312 * T,
        None,
        624 * T,
        "nvlink-bridge",
        300 * GB,
        PCIE4,
        max_link_gpus=2,
        arch="Ampere GA100",
    ),
    GpuSpec(
        "A100 80GB SXM",
        _gib(80.0),
        2039 * GB,
        312 * T,
        312 * T,
        None,
        624 * T,
        "nvlink",
        300 * GB,
        PCIE4,
        max_link_gpus=8,
        arch="Ampere GA100",
    ),
    # gpus.csv: H100 PCIe product brief PB-11133: 2000 GB/s, 756 TF, 1513 FP8/INT8; NVLink bridge 600 bidir.
    GpuSpec(
        "H100 PCIe",
        _gib(79.6),
        2000 * GB,
        756 * T,
        756 * T,
        1513 * T,
        1513 * T,
        "nvlink-bridge",
        300 * GB,
        PCIE5,
        max_link_gpus=2,
        arch="Hopper GH100",
    ),
    # gpus.csv: H100 SXM datasheet: 3350 GB/s, 989.4 TF, 1978.9 FP8/INT8; NVLink4 900 bidir = 450 per direction.
    GpuSpec(
        "H100 SXM",
        _gib(79.6),
        3350 * GB,
        989.4 * T,
        989.4 * T,
        1978.9 * T,
        1978.9 * T,
        "nvlink",
        450 * GB,
        PCIE5,
        max_link_gpus=8,
        arch="Hopper GH100",
    ),
    # gpus.csv: H200 datasheet: 4800 GB/s, same GH100 compute; 139.8 GiB usable.
    GpuSpec(
        "H200 SXM",
        _gib(139.8),
        4800 * GB,
        989.4 * T,
        989.4 * T,
        1978.9 * T,
        1978.9 * T,
        "nvlink",
        450 * GB,
        PCIE5,
        max_link_gpus=8,
        arch="Hopper GH100",
    ),
    # gpus.csv (medium-high): HGX B200 @1000 W: 8000 GB/s, 2250 TF BF16, 4500 FP8; NVLink5 1800 bidir; 179 GiB.
    # Host link: gpus.csv says PCIe6; HGX B200 host CPUs are PCIe5, so swap runs at Gen5 speed (our reading).
    GpuSpec(
        "B200",
        _gib(179.0),
        8000 * GB,
        2250 * T,
        2250 * T,
        4500 * T,
        4500 * T,
        "nvlink",
        900 * GB,
        PCIE5,
        max_link_gpus=8,
        arch="Blackwell",
        confidence="medium-high",
    ),
    # gpus.csv: MI300X datasheet: 5300 GB/s, 1307.4 TF, 2614.9 FP8/INT8; Infinity Fabric 7 × 128 GB/s bidir
    # -> 448 GB/s per direction aggregate per GPU.
    GpuSpec(
        "MI300X",
        _gib(192.0),
        5300 * GB,
        1307.4 * T,
        1307.4 * T,
        2614.9 * T,
        2614.9 * T,
        "infinity-fabric",
        448 * GB,
        PCIE5,
        max_link_gpus=8,
        arch="AMD CDNA3",
    ),
    # gpus.csv (LOW confidence): unnamed Ascend HWConf file: 910B2 FP16 cube 353.8 TF, INT8 707.9, 1.6 TB/s,
    # HCCS 196 GB/s (taken as bidir -> 98 per direction); a benchmark measured BF16 328 TF. No FP8.
    GpuSpec(
        "Ascend 910B",
        _gib(64.0),
        1600 * GB,
        353.8 * T,
        353.8 * T,
        None,
        707.9 * T,
        "hccs",
        98 * GB,
        PCIE4,
        max_link_gpus=8,
        arch="Huawei DaVinci",
        confidence="low",
    ),
    # Not in gpus.csv. RTX PRO 6000 Blackwell (Workstation/Server, GB202, 188 SMs, 752 tensor cores,
    # boost 2617 MHz): 96 GB GDDR7, 1792 GB/s (NVIDIA announcement as reported by VideoCardz / gpu.name).
    # Tensor peaks from the hmc-tech spec table: BF16 503.8 TF dense, FP16 w/ FP32 accumulate also 503.8 (full
    # rate on professional cards, unlike GeForce), FP8 1007.6, INT8 1007.6 -- consistent with
    # 752 TC × 2.617 GHz × 256 FLOP/clk. Confidence: medium (third-party table + arithmetic, no datasheet).
    # memory_bytes: 97887 MiB, the total nvidia-smi reports in several public logs (torch may report a few
    # hundred MiB less, as on the RTX 4090). No NVLink; PCIe5.
    GpuSpec(
        "RTX PRO 6000 Blackwell",
        97887 * MiB,
        1792 * GB,
        503.8 * T,
        503.8 * T,
        1007.6 * T,
        1007.6 * T,
        "pcie",
        PCIE5,
        PCIE5,
        arch="Blackwell GB202",
        confidence="medium",
    ),
    # The seeds' generic "24G" card: 22.5 GiB usable after firmware/ECC/display reservations (seed article),
    # RTX 4090-like speed. Used by the seeds' worked example (sim.app.memory.SEEDS_EXAMPLE).
    GpuSpec(
        "24GB",
        _gib(22.5),
        1008 * GB,
        165.2 * T,
        165.2 * T,
        330.3 * T,
        660.6 * T,
        "pcie",
        PCIE4,
        PCIE4,
        arch="generic (seeds)",
        confidence="example",
    ),
)

_BY_NAME: dict[str, GpuSpec] = {g.name: g for g in _CATALOGUE}


def _norm(name: str) -> str:
    key = name.strip().lower()
    key = re.sub(r"^(nvidia|amd|huawei)\s*", "", key)
    key = re.sub(r"geforce", "", key)
    return re.sub(r"[\s_\-]", "", key)


_ALIASES: dict[str, str] = {
    "t4": "T4",
    "3090": "RTX 3090",
    "4090": "RTX 4090",
    "a100": "A100 80GB SXM",
    "a10080gb": "A100 80GB SXM",
    "a10080g": "A100 80GB SXM",
    "a10040gb": "A100 40GB SXM",
    "a10040g": "A100 40GB SXM",
    "a100pcie": "A100 80GB PCIe",
    "a100sxm": "A100 80GB SXM",
    "h100": "H100 SXM",
    "h10080gb": "H100 SXM",
    "h100sxm5": "H100 SXM",
    "h200": "H200 SXM",
    "h200sxm5": "H200 SXM",
    "b200hgx": "B200",
    "hgxb200": "B200",
    "mi300": "MI300X",
    "910b": "Ascend 910B",
    "910b2": "Ascend 910B",
    "ascend910b2": "Ascend 910B",
    "pro6000": "RTX PRO 6000 Blackwell",
    "rtxpro6000": "RTX PRO 6000 Blackwell",
    "rtx6000pro": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellworkstationedition": "RTX PRO 6000 Blackwell",
    "rtxpro6000blackwellserveredition": "RTX PRO 6000 Blackwell",
    "24g": "24GB",
    "generic24gb": "24GB",
    "seeds24gb": "24GB",
    "seeds": "24GB",
}
_LOOKUP: dict[str, str] = {_norm(n): n for n in _BY_NAME} | _ALIASES


def list_gpus() -> list[str]:
    return [g.name for g in _CATALOGUE]


def get_gpu(name: str | GpuSpec) -> GpuSpec:
    """A catalogue GPU by case-insensitive name or alias ("h100", "a100-80gb", "4090", "rtx4090")."""
    if isinstance(name, GpuSpec):
        return name
    key = _norm(str(name))
    if key in _LOOKUP:
        return _BY_NAME[_LOOKUP[key]]
    close = difflib.get_close_matches(key, list(_LOOKUP), n=4, cutoff=0.5)
    names = sorted({_LOOKUP[c] for c in close})
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    raise UnknownNameError(f"unknown GPU {name!r}{hint} Known: {', '.join(list_gpus())}")


_VENDOR_WORDS = ("nvidia", "geforce", "tesla")  # words of a device name that no catalogue name has
_FORMS = {"sxm": "SXM", "sxm4": "SXM", "sxm5": "SXM", "pcie": "PCIe"}  # a device name's form factor words


def match_device(name: str) -> tuple[str | None, bool]:
    """The catalogue card a device name is (vLLM records torch's: 'NVIDIA A100-SXM4-40GB', 'NVIDIA H100 80GB
    HBM3'), and whether the whole name agrees with it: its memory word (40GB) within 15 % of the card's. The
    chip, memory and form are tried together ('A100 40GB SXM'), then the name cut word by word from the end."""
    words = [w for w in name.replace("-", " ").split() if w.lower() not in _VENDOR_WORDS]
    mems = [int(m.group(1)) for w in words if (m := re.fullmatch(r"(\d+)GB", w, re.IGNORECASE))]
    form = next((_FORMS[w.lower()] for w in words if w.lower() in _FORMS), None)
    tries = [name, " ".join(words)]
    if words and mems:
        tries += [f"{words[0]} {mems[0]}GB {form}"] if form else []
        tries.append(f"{words[0]} {mems[0]}GB")
    tries += [" ".join(words[:k]) for k in range(len(words) - 1, 0, -1)]
    for i, candidate in enumerate(tries):
        try:
            card = get_gpu(candidate)
        except UnknownNameError:
            continue
        agrees = i < 2 or all(abs(card.memory_gib - g) <= 0.15 * g for g in mems)
        return card.name, agrees
    return None, False


def device_gpu(name: str) -> str | None:
    """The catalogue card a device name plainly is; None where only a part of it matches a card whose memory
    differs ('A100 ... 40GB' is not the A100 80GB that 'A100' alone means) or nothing matches."""
    card, agrees = match_device(name)
    return card if agrees else None


def validate_tp(gpu: GpuSpec, tp: int, model: object | None = None) -> None:
    """Raise ConfigError for a tensor-parallel degree vLLM would refuse (or a single node cannot hold).

    tp must be a positive integer <= 8 (one node); with a model, its attention heads must divide by tp
    (vLLM's check), and KV heads must divide by tp or tp by KV heads (replication).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    if tp > 8:
        raise ConfigError(f"tensor_parallel_size {tp} > 8: one node holds at most 8 GPUs ({gpu.name})")
    if model is not None:
        nh = getattr(model, "num_attention_heads", 1)
        nkv = getattr(model, "num_key_value_heads", nh)
        name = getattr(model, "name", "model")
        if nh % tp:
            mla = getattr(model, "is_mla", False)
            ok = ", ".join(str(d) for d in range(1, 9) if not nh % d and (mla or not nkv % d or not d % nkv))
            raise ConfigError(f"tensor_parallel_size {tp} does not divide num_attention_heads {nh} of {name}; "
                              f"allowed: {ok}")
        if not getattr(model, "is_mla", False) and nkv % tp and tp % nkv:
            raise ConfigError(
                f"tensor_parallel_size {tp} and num_key_value_heads {nkv} of {name}: neither divides the other"
            )


def allreduce_time(num_bytes: float, tp: int, gpu: GpuSpec, latency_s: float | None = None) -> float:
    """Ring all-reduce seconds: latency floor + 2(tp-1)/tp × bytes / per-direction link bandwidth.

    Fast link (NVLink, Infinity Fabric, HCCS) when it spans ``tp`` GPUs, else PCIe; 0 for tp == 1
    (costmodel.md §1.1 llm-analysis / GenZ ring formula, §2.2 latency floors).
    """
    if tp < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {tp}")
    if tp == 1:
        return 0.0
    if num_bytes < 0:
        raise ConfigError(f"all-reduce size must be >= 0 bytes, got {num_bytes}")
    lat = gpu.link_latency(tp) if latency_s is None else latency_s
    return lat + 2.0 * (tp - 1) / tp * float(num_bytes) / gpu.link_bandwidth(tp)
