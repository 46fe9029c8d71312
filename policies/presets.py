"""Which ``[engine]`` knob applies to which preset, engine-native names, and the values a preset derives
from the memory plan. Used by ``sim.simulate.resolve``; the policies themselves live one per file.

A knob is either a *limit* (vLLM names, shared by every preset through PolicyLimits), an *option* (a
preset's own knob: declared by listing it in the preset's ``register(..., defaults)``), or an *alias*
(an engine's own name for a limit, e.g. TensorRT-LLM's ``max_batch_size`` for ``max_num_seqs``).
Setting an option or alias the chosen preset does not have is a ConfigError naming the knob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.errors import ConfigError

GIB = 1024**3

# Limits that presets default and resolve() picks (explicit value > preset default > fallback).
LIMIT_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)

# Preset-specific options (EngineConfig fields); a preset accepts those in its defaults.
OPTION_KNOBS = frozenset({
    "preemption_mode", "swap_space", "watermark", "scheduler_delay_factor",
    "capacity_scheduler_policy", "context_chunking_policy",
    "n_ctx", "ctx_shift", "n_keep", "slot_prompt_similarity", "cache_prompt", "cont_batching",
    "num_ctx", "num_keep", "max_queue", "multiuser_cache", "model_loaded",
    "max_concurrent_requests", "max_batch_total_tokens", "waiting_served_ratio", "max_waiting_tokens",
})  # fmt: skip

# Engine-native names of limits, per preset.
ALIASES: dict[str, dict[str, str]] = {
    "trtllm": {
        "max_batch_size": "max_num_seqs",
        "max_num_tokens": "max_num_batched_tokens",
        "tokens_per_block": "block_size",
        "enable_block_reuse": "enable_prefix_caching",
    },
    "llamacpp": {"n_parallel": "max_num_seqs", "n_batch": "max_num_batched_tokens"},
    "ollama": {"num_parallel": "max_num_seqs", "num_batch": "max_num_batched_tokens"},
    "tgi": {"max_batch_size": "max_num_seqs", "max_batch_prefill_tokens": "max_num_batched_tokens"},
    "sarathi": {"chunk_size": "max_num_batched_tokens"},
}
ALIAS_KNOBS = frozenset(a for table in ALIASES.values() for a in table)

# Presets that follow vLLM's "no chunked prefill -> budget = max(max_model_len, 2048)" rule and refuse a
# smaller budget (engines.md §1.1); the others bound or reject long prompts themselves.
VLLM_BUDGET_RULE = frozenset({"vllm", "vllm-v0", "static", "hf-static"})

# Presets whose scheduler implements ``scheduling_policy = "priority"`` (engines.md V1-3, V1-5).
PRIORITY_PRESETS = frozenset({"vllm"})


@dataclass
class PresetKnobs:
    """Explicit limit values (aliases folded in) and the preset's options with defaults applied."""

    explicit: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


def _users(knob: str, presets: dict[str, dict[str, Any]]) -> list[str]:
    return sorted({p for p, d in presets.items() if knob in d} | {p for p, t in ALIASES.items() if knob in t})


def preset_knobs(
    name: str, engine: Any, defaults: dict[str, Any], all_defaults: dict[str, dict]
) -> PresetKnobs:
    """Check every preset knob set in ``engine`` applies to ``name``; fold aliases; fill options.

    ``all_defaults`` maps every registered preset to its defaults, to say where a stray knob belongs.
    """
    for knob in sorted(OPTION_KNOBS | ALIAS_KNOBS):
        if getattr(engine, knob) is None:
            continue
        if knob in defaults or knob in ALIASES.get(name, {}):
            continue
        if knob == "preemption_mode" and name == "vllm":
            if engine.preemption_mode != "recompute":
                raise ConfigError(
                    f"[engine] preemption_mode = {engine.preemption_mode!r}: vLLM V1 preempts by recompute "
                    'only (engines.md §1.1); use preset = "vllm-v0" for swap preemption'
                )
            continue
        if knob == "watermark" and name == "vllm":
            # vLLM V1's SchedulerConfig.watermark: blocks held back at admission (kv_cache_manager.py)
            if not 0 <= engine.watermark < 1:
                raise ConfigError(f"[engine] watermark must be in [0, 1), got {engine.watermark}")
            continue
        users = _users(knob, all_defaults)
        raise ConfigError(
            f"[engine] {knob} does not apply to preset {name!r}"
            + (f"; it is a knob of: {', '.join(users)}" if users else "")
        )
    for knob, bad, users in (
        ("max_new_tokens", engine.max_new_tokens is not None, ("static", "hf-static")),
        ("long_prefill_token_threshold", engine.long_prefill_token_threshold != 0, ("vllm",)),
        ("scheduler_reserve_full_isl", not engine.scheduler_reserve_full_isl, ("vllm",)),
    ):
        if bad and name not in users:
            raise ConfigError(
                f"[engine] {knob} does not apply to preset {name!r}; it is a knob of: {', '.join(users)}"
            )
    if engine.scheduling_policy != "fcfs" and name not in PRIORITY_PRESETS:
        raise ConfigError(
            f"[engine] scheduling_policy = {engine.scheduling_policy!r} is not modelled for preset {name!r} "
            f"(only: {', '.join(sorted(PRIORITY_PRESETS))})"
        )
    out = PresetKnobs()
    for key in LIMIT_KNOBS:
        out.explicit[key] = getattr(engine, key)
    for alias, target in ALIASES.get(name, {}).items():
        v = getattr(engine, alias)
        if v is None:
            continue
        if out.explicit[target] is not None and out.explicit[target] != v:
            raise ConfigError(
                f"[engine] {alias} = {v!r} and {target} = {out.explicit[target]!r} are the same knob for "
                f"preset {name!r}; give one of them"
            )
        out.explicit[target] = v
    for key, default in defaults.items():
        if key in OPTION_KNOBS:
            v = getattr(engine, key)
            out.options[key] = default if v is None else v
    if name == "vllm" and engine.watermark is not None:
        out.options["watermark"] = engine.watermark  # a PolicyLimits field: derive_from_memory moves it
    return out


def derive_from_memory(name: str, options: dict[str, Any], plan: Any, limit_kw: dict[str, Any]) -> None:
    """Per-preset values that come from the memory plan (mutates ``options`` and ``limit_kw``)."""
    if name == "vllm" and "watermark" in options:
        limit_kw["watermark"] = float(options.pop("watermark"))
    if name == "vllm-v0":
        swap = options.get("swap_space", 4.0)
        if not (swap >= 0 and math.isfinite(swap)):
            raise ConfigError(f"[engine] swap_space must be >= 0 GiB, got {swap}")
        # engines.md V0-1: num_cpu_blocks = floor(swap_space_bytes / cache_block_size).
        options["num_cpu_blocks"] = int(swap * GIB) // plan.block_bytes
    elif name in ("llamacpp", "ollama"):
        # llama.cpp allocates n_ctx tokens of KV up front (LC-1); Ollama num_ctx x OLLAMA_NUM_PARALLEL (OL-1).
        if name == "llamacpp":
            total, knob = options["n_ctx"], "n_ctx"
        else:
            total, knob = options["num_ctx"] * limit_kw["max_num_seqs"], "num_ctx x num_parallel"
        if total < 1:
            raise ConfigError(f"[engine] {knob} must be >= 1, got {total}")
        need = total * plan.kv_bytes_per_token
        if need > plan.kv_budget_bytes:
            raise ConfigError(
                f"[engine] {knob} = {total} tokens needs {need / GIB:.2f} GiB of KV cache, only "
                f"{plan.kv_budget_bytes / GIB:.2f} GiB fit on this GPU (memory plan)"
            )
        # No paging: the limits report KV in tokens (blocks of 1), as the slot policies count it.
        limit_kw["block_size"] = 1
        limit_kw["num_gpu_blocks"] = total + 1
    elif name == "tgi":
        mbtt = options.get("max_batch_total_tokens")
        if mbtt is not None:
            # TGI sizes its block allocator from max_batch_total_tokens; more than fits fails at warmup.
            blocks = mbtt // limit_kw["block_size"]
            if blocks + 1 > plan.num_gpu_blocks:
                raise ConfigError(
                    f"[engine] max_batch_total_tokens = {mbtt} needs {blocks} KV blocks, only "
                    f"{plan.num_gpu_blocks - 1} fit (memory plan)"
                )
            if blocks < 1:
                raise ConfigError(f"[engine] max_batch_total_tokens = {mbtt} is less than one block")
            limit_kw["num_gpu_blocks"] = blocks + 1
