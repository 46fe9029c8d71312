"""The `vllm` preset's own options (vLLM V1's knobs beyond the shared limits): a module of its own, kept
interpreted, as the scheduler (policies/vllm.py) may be compiled by mypyc (sim/native.py), whose
dataclasses take no class-level defaults."""

from __future__ import annotations

from dataclasses import dataclass

from policies.options import PolicyOptions, invalid
from sim.core.errors import ConfigError


@dataclass(frozen=True)
class VllmOptions(PolicyOptions):
    """vLLM V1's own knobs. ``long_prefill_token_threshold`` and ``scheduler_reserve_full_isl`` go to
    PolicyLimits (resolve() copies them there; the scheduler reads them from its limits)."""

    # engines.md §1.1: V1 defaults for GPUs under 70 GiB (the API server's usage context).
    LIMITS = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "block_size": 16,
    }
    LIMIT_FIELDS = ("long_prefill_token_threshold", "scheduler_reserve_full_isl")
    SCHEDULING_POLICIES = ("fcfs", "priority")  # engines.md V1-3, V1-5
    VLLM_BUDGET_RULE = True

    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0  # kv_cache_manager watermark: fraction of GPU blocks kept free at admission
    preemption_mode: str | None = None  # accepted only as "recompute" (V1 has nothing else)

    def validate(self) -> None:
        if self.long_prefill_token_threshold < 0:
            raise invalid("long_prefill_token_threshold", self.long_prefill_token_threshold, ">= 0")
        if not 0 <= self.watermark < 1:
            raise invalid("watermark", self.watermark, "in [0, 1)")
        if self.preemption_mode not in (None, "recompute"):
            raise ConfigError(
                f"[engine] preemption_mode = {self.preemption_mode!r}: vLLM V1 preempts by recompute "
                'only (engines.md §1.1); use preset = "vllm-v0" for swap preemption'
            )
