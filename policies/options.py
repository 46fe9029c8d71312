"""A policy's own ``[engine]`` knobs: one small frozen dataclass per policy, registered with it.

A knob of the ``[engine]`` table is either *shared* (vLLM's names, a field of ``sim.app.config.EngineConfig``:
max_num_seqs, block_size, ...) or the chosen preset's own: a field of its options class, or an
*engine-native alias* of a shared limit (TensorRT-LLM's ``max_batch_size`` for ``max_num_seqs``). An
options class declares, in the policy's own file:

- its knobs as dataclass fields (name, type, default; pydantic checks the types, and any
  ``Annotated[int, Field(ge=1)]`` constraint); ``validate`` checks the rest of their values;
- ``LIMITS``: the preset's defaults for the shared limits (vLLM: 256 sequences, 2048-token budget);
- ``ALIASES``: engine-native name -> shared limit;
- ``LIMIT_FIELDS``: own knobs that resolve() hands to ``PolicyLimits`` (where the policy reads them);
- ``SCHEDULING_POLICIES`` it models, and ``VLLM_BUDGET_RULE`` (vLLM's "no chunked prefill -> budget =
  max(max_model_len, 2048)", engines.md §1.1);
- ``memory_rule`` / ``GPU_MEMORY_UTILIZATION``: how the engine sizes its KV cache at start-up;
- ``from_memory``: what it derives from the memory plan (and preset-specific default resolution).

Fields marked ``derived()`` are not user knobs: ``from_memory`` fills them (tests may pass them directly).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from pydantic import BaseModel

from sim.core.errors import ConfigError
from sim.core.fields import MAX_INT32
from sim.core.typed import section_model, validate_table

GIB = 1024**3

# The shared limits a preset defaults and resolve() picks (explicit value > preset default > fallback).
LIMIT_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)


def derived(default: Any) -> Any:
    """A field from_memory() fills in: not accepted from a config file."""
    return field(default=default, metadata={"derived": True})


def invalid(knob: str, value: Any, allowed: str) -> ConfigError:
    """The one error a bad knob value gives: ``[engine] KNOB must be ALLOWED, got VALUE``."""
    shown = value if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)
    return ConfigError(f"[engine] {knob} must be {allowed}, got {shown}")


@dataclass(frozen=True)
class MemoryRule:
    """How an engine turns GPU memory into a KV budget at start-up. Data only: sim/app/engine_memory.py
    estimates the overheads of ``profile`` and sim/app/memory.py does the arithmetic; the sources are in
    docs/memory_reservations.md.

    ``free_fraction`` None is vLLM's rule: KV = util x total - (weights + activation + non-torch). A
    number is the rule of engines that size the KV from what is free once they are loaded (TensorRT-LLM's
    free_gpu_memory_fraction, TGI's wiggle room; 1.0 for llama.cpp / Ollama / HF, which reserve no
    headroom): KV = free_fraction x (util x total - CUDA context - weights - activation - non-torch)."""

    profile: str = "vllm"  # the start-up pass the activation estimate follows (sim/app/engine_memory.py)
    profile_tokens: int = 2048  # its token budget (max_num_batched_tokens, max_num_tokens, chunk_size, ...)
    free_fraction: float | None = None
    context_tokens: int | None = None  # tokens of KV the graph is sized for (llama.cpp n_ctx, Ollama)
    context_knob: str = ""  # the knob that sets context_tokens, named when the plan fails
    max_model_len: int | None = None  # per-request context when [engine] max_model_len is unset
    cap_max_model_len: bool = False  # unset max_model_len: cap to what fits (TGI, HF) instead of failing


@dataclass(frozen=True)
class PolicyOptions:
    """Base class (no knobs). Subclasses are frozen dataclasses; see the module docstring."""

    LIMITS: ClassVar[Mapping[str, Any]] = {}
    ALIASES: ClassVar[Mapping[str, str]] = {}
    LIMIT_FIELDS: ClassVar[tuple[str, ...]] = ()
    SCHEDULING_POLICIES: ClassVar[tuple[str, ...]] = ("fcfs",)
    VLLM_BUDGET_RULE: ClassVar[bool] = False
    # With VLLM_BUDGET_RULE, an unset budget without chunked prefill is max(max_model_len, this) (vLLM V0's
    # SchedulerConfig: 2048); None: the preset's batch_limits applies its engine's rule itself.
    NO_CHUNK_BUDGET: ClassVar[int | None] = 2048
    # [engine] gpu_memory_utilization when the config leaves it out: vLLM's 0.9 of the total; 1.0 (the
    # whole card) for engines with no such cap, where it is only the card's share (two engines on a card).
    GPU_MEMORY_UTILIZATION: ClassVar[float] = 0.9

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # every engine count within int32, as the shared limits (config.Pos)
            v = getattr(self, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT32:
                raise invalid(f.name, v, f"within int32 (|value| <= {MAX_INT32})")
        self.validate()

    def validate(self) -> None:
        """Check each knob's value; raise ``invalid(knob, value, allowed)``."""

    # ---- knob names and defaults ---------------------------------------------------------------------
    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        """The user-facing knob names (derived fields excluded)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("derived"))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls) if not f.metadata.get("derived")}

    @classmethod
    def accepted(cls) -> tuple[str, ...]:
        """Every preset-specific key an ``[engine]`` table may hold for this preset."""
        return (*cls.knobs(), *cls.ALIASES)

    # ---- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> Self:
        """Knobs from an ``[engine]`` table (only this class's knobs; aliases are the caller's), type-checked
        by the pydantic model made from the class (``options_model``); ``validate`` then checks values."""
        return cls(**validate_table(cls, "[engine]", table))

    @classmethod
    def options_model(cls) -> type[BaseModel]:
        """The pydantic model of the user knobs (derived fields left out): their JSON Schema for editors."""
        return section_model(cls)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any], policy: str) -> Self:
        """Programmatic construction (tests, make_policy): knobs and derived fields, no type coercion."""
        names = [f.name for f in dataclasses.fields(cls)]
        bad = sorted(set(options) - set(names))
        if bad:
            raise ConfigError(
                f"{policy} policy: unknown options {bad}; known: {', '.join(names) or '(none)'}"
            )
        return cls(**options)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __getitem__(self, key: str) -> Any:
        """Read a knob by name, as from the dict the options used to be."""
        if key not in {f.name for f in dataclasses.fields(self)}:
            raise KeyError(key)
        return getattr(self, key)

    @classmethod
    def batch_limits(cls, gpu: Any, explicit: Mapping[str, Any], chunked: bool, max_model_len: int) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) to run with: the user's, else this preset's defaults
        (``LIMITS``; a preset whose engine picks them by card overrides this). ``gpu``: the card
        (sim.cost.hardware.GpuSpec); ``max_model_len``: as given, else the model's."""
        seqs = explicit["max_num_seqs"] or cls.LIMITS.get("max_num_seqs", 256)
        return seqs, explicit["max_num_batched_tokens"] or cls.LIMITS.get("max_num_batched_tokens", 2048)

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """How this engine sizes its KV cache at start-up (sim/app/engine_memory.py applies it). ``limits``:
        the shared limits as picked (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, ...);
        ``explicit``: those the user set (None: not set); ``max_model_len``: as given, else the model's.
        vLLM V1 (and the default): profile_run over the scheduler's token budget."""
        return MemoryRule(profile_tokens=self.budget_tokens(limits, explicit, max_model_len))

    def budget_tokens(
        self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int,
        chunked: bool | None = None,
    ) -> int:
        """max_num_batched_tokens as the engine will use it: with VLLM_BUDGET_RULE and no chunked prefill
        an unset budget is max(max_model_len, NO_CHUNK_BUDGET) (engines.md §1.1)."""
        chunked = limits["enable_chunked_prefill"] if chunked is None else chunked
        if (self.VLLM_BUDGET_RULE and not chunked and explicit["max_num_batched_tokens"] is None
                and self.NO_CHUNK_BUDGET is not None):
            return max(max_model_len, self.NO_CHUNK_BUDGET)
        return int(limits["max_num_batched_tokens"])

    # ---- resolution -----------------------------------------------------------------------------------
    def limit_values(self) -> dict[str, Any]:
        """The own knobs that go into PolicyLimits."""
        return {k: getattr(self, k) for k in self.LIMIT_FIELDS}

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Mapping[str, Any]) -> Self:
        """Values that come from the memory plan (``plan``: sim.app.memory.MemoryPlan). May update
        ``limits`` (the PolicyLimits keywords being built) and returns the options to run with.
        ``explicit``: the shared limits the user set, and ``max_model_len`` (aliases folded in; None = not set)."""
        return self


def refuse_switches(values: Mapping[str, Any], **why: str) -> None:
    """Shared switches an engine does not have (``enable_prefix_caching``, ``enable_chunked_prefill``):
    one set true in ``values`` is refused with the engine's rule ``why[key]``, not run as if unasked."""
    for key, rule in why.items():
        if values.get(key):
            raise ConfigError(f"[engine] {key} = true: {rule}; allowed: false")


def fixed_token_pool(total: int, knob: str, plan: Any, limits: dict[str, Any], hint: str = "") -> None:
    """A slot engine allocating ``total`` tokens of KV up front, no paging (llama.cpp LC-1, Ollama OL-1):
    check it fits and report the pool in tokens (blocks of 1), as the slot policies count it."""
    if total < 1:
        raise ConfigError(f"[engine] {knob} must be >= 1, got {total}")
    need = total * plan.kv_bytes_per_token
    if need > plan.kv_budget_bytes:
        raise ConfigError(
            f"[engine] {knob} = {total} tokens needs {need / GIB:.2f} GiB of KV cache, only "
            f"{plan.kv_budget_bytes / GIB:.2f} GiB fit on this GPU (memory plan){hint}"
        )
    limits["block_size"] = 1
    limits["num_gpu_blocks"] = total + 1
