"""The `vllm` preset's own options (vLLM V1's knobs beyond the shared limits): a module of its own, kept
interpreted, as the scheduler (policies/vllm.py) may be compiled by mypyc (sim/native.py), whose
dataclasses take no class-level defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.options import GIB, PolicyOptions, invalid
from sim.core.errors import ConfigError


@dataclass(frozen=True)
class VllmOptions(PolicyOptions):
    """vLLM V1's own knobs. ``long_prefill_token_threshold`` and ``scheduler_reserve_full_isl`` go to
    PolicyLimits (resolve() copies them there; the scheduler reads them from its limits)."""

    # engines.md §1.1: V1 defaults for GPUs under 70 GiB (the API server's usage context); batch_limits
    # picks max_num_seqs and max_num_batched_tokens by the card.
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
    NO_CHUNK_BUDGET = None  # batch_limits: max(max_model_len, the card's default budget)

    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0  # kv_cache_manager watermark: fraction of GPU blocks kept free at admission
    preemption_mode: str | None = None  # accepted only as "recompute" (V1 has nothing else)

    @classmethod
    def batch_limits(cls, gpu: Any, explicit: Mapping[str, Any], chunked: bool, max_model_len: int) -> tuple[int, int]:
        """vLLM 0.33's defaults for the API server (EngineArgs.get_batch_defaults and
        _set_default_max_num_seqs_and_batched_tokens_args): by the card's memory, 2048 tokens / 256
        sequences below 70 GiB and on any A100, 8192 / 1024 from 70 GiB (H100, H200), 16384 / 1024 from 160
        GiB (B200, MI300X). A defaulted budget is at least max_model_len without chunked prefill and at most
        max_num_seqs x max_model_len; a defaulted max_num_seqs is at most the budget."""
        mem, name = gpu.memory_bytes, gpu.name.lower()
        seqs, budget = (1024, 16384) if mem >= 160 * GIB else (1024, 8192) if mem >= 70 * GIB and "a100" not in name \
            else (256, 2048)
        seqs = explicit["max_num_seqs"] or seqs
        if explicit["max_num_batched_tokens"]:
            budget = explicit["max_num_batched_tokens"]
        else:
            if not chunked:
                budget = max(max_model_len, budget)
            budget = min(seqs * max_model_len, budget)
        if not explicit["max_num_seqs"]:
            seqs = min(seqs, budget)
        return seqs, budget

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Mapping[str, Any]) -> VllmOptions:
        """vLLM's SchedulerConfig refuses a long-prefill threshold past max_model_len (it would never cut)."""
        max_len = limits["max_model_len"]
        if self.long_prefill_token_threshold > max_len:
            raise invalid("long_prefill_token_threshold", self.long_prefill_token_threshold,
                          f"<= max_model_len ({max_len}), as vLLM requires (0: off)")
        return self

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
