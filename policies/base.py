"""The policy interface, the step plan it returns, and the name registry.

A policy decides, each step, which requests run and how many tokens each computes; it reserves and
frees KV only through the KV manager. The engine prices the plan, waits, and calls ``update``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from sim.batch import BatchSummary
from sim.errors import UnknownNameError
from sim.kv import KVCacheManager
from sim.request import Request


@dataclass(slots=True)
class StepPlan:
    """One step's decisions. ``scheduled`` keeps order: running first, then admitted."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    sampled: list[Request] = field(default_factory=list)  # rows that emit a token when the step ends
    rejected: list[tuple[Request, str]] = field(default_factory=list)  # dropped from the queue, with why
    batch: BatchSummary = field(default_factory=BatchSummary)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and self.batch.is_empty and not self.rejected


@dataclass(slots=True)
class DecodeRun:
    """Up to ``max_steps`` decode-only steps the engine may take in one go.

    Every row decodes one token per step and row i leaves after step ``finish_step[i]`` (1-based, the
    step of its last token); nothing else can change in between (no admission, no preemption). Rows
    finish inside a run only when the engine allows it (``decode_run(finishes_ok=True)``) and a finish
    cannot change what the policy schedules next (``QueuedPolicy.finishes_in_runs``, nothing waiting);
    otherwise ``max_steps <= min(finish_step)``.
    """

    requests: list[Request]
    max_steps: int
    computed: np.ndarray  # each row's computed tokens before the run
    finish_step: np.ndarray  # step whose token finishes each row
    new_blocks: np.ndarray  # new_blocks[s]: blocks allocated by steps 1..s (new_blocks[0] == 0)
    # Cached-free blocks when the run was planned: a disaggregated decode replica's pool can gain
    # cached blocks mid-run (a KV transfer lands), which must not show in the steps before it.
    cached_free_start: int = 0
    # Set by apply_decode_run for the recorder: free and cached-free blocks after each step's allocation.
    free_blocks: np.ndarray | None = None
    cached_free: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """Resolved engine limits every policy sees (after presets and the memory plan)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    scheduling_policy: str = "fcfs"
    max_new_tokens: int | None = None
    # vLLM V1 (policy "vllm" only): the 2-deep batch queue of async scheduling, and the fraction of
    # GPU blocks held back when admitting waiting/preempted requests (kv_cache_manager.allocate_slots).
    async_scheduling: bool = False
    watermark: float = 0.0


class Policy(Protocol):
    name: str
    kv: KVCacheManager

    def add_request(self, req: Request, now: float) -> str | None:
        """Queue a request; return a rejection reason instead when it can never run."""

    def schedule(self, now: float) -> StepPlan: ...

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step: emit tokens, finish requests, free their blocks. Returns the finished."""

    def decode_run(self, finishes_ok: bool = False) -> DecodeRun | None:
        """If the next steps are a quiet stretch of decodes, describe it (else None). ``finishes_ok``:
        the engine's arrivals do not depend on finishes, so rows may finish inside the run when the
        policy's rules allow it; otherwise the run ends at the first finish."""

    def apply_decode_run(self, run: DecodeRun, end_times: np.ndarray) -> list[Request]: ...

    def has_unfinished(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...


PolicyFactory = Callable[[PolicyLimits, dict[str, Any]], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}
_DEFAULTS: dict[str, dict[str, Any]] = {}


def register(name: str, defaults: dict[str, Any] | None = None) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a policy (or an engine preset: a policy plus its defaults) under a name."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        _REGISTRY[name] = factory
        _DEFAULTS[name] = dict(defaults or {})
        return factory

    return deco


def _load_builtins() -> None:
    # Registration side effect: each module registers its policy / preset.
    from policies import llamacpp, ollama, orca, sarathi, static, tgi, trtllm, vllm, vllm_v0  # noqa: F401


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def policy_defaults(name: str) -> dict[str, Any]:
    _load_builtins()
    if name not in _REGISTRY:
        raise UnknownNameError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return dict(_DEFAULTS[name])


def make_policy(name: str, limits: PolicyLimits, options: dict[str, Any] | None = None) -> Policy:
    _load_builtins()
    if name not in _REGISTRY:
        raise UnknownNameError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](limits, dict(options or {}))
