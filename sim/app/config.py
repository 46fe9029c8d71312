"""Run configuration: TOML sections -> frozen dataclasses, with vLLM's knob names.

Creating a config writes nothing; every unknown key or wrong type is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    name: str = "Mistral-7B"  # catalogue name or path to a HF config.json
    dtype: str = "auto"  # vLLM --dtype; "auto" = bf16; awq/gptq/int4/fp8/int8 for quantized weights


@dataclass(frozen=True)
class HardwareConfig:
    gpu: str = "RTX 4090"
    tensor_parallel_size: int = 1
    profile: str = "auto"  # calibration profile name/path; "auto" = shipped fit or spec-sheet prior


@dataclass(frozen=True)
class EngineConfig:
    """Names follow vLLM engine args so settings can be copied over."""

    policy: str = "vllm"
    max_num_seqs: int | None = None  # None: the preset's default (vLLM: 256 on <70 GiB GPUs)
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the model's max_position_embeddings, capped to what fits
    block_size: int | None = None  # None: the preset's (vLLM 16, TensorRT-LLM 32)
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    scheduling_policy: str = "fcfs"
    max_new_tokens: int | None = None  # static batching: HF generate's max_new_tokens (None: batch max)
    cost_model: str = "roofline"  # or "constant"
    constant_step_s: float = 0.02  # step time of the constant cost model
    overhead_gib: float | None = None  # activation peak + non-torch memory, overriding the estimate
    # ---- presets (policies/presets.py checks which knob applies to which preset; None = preset default)
    preset: str | None = None  # alias of `policy` (the issue's `engine.preset = "trtllm"`)
    max_waiting: int | None = None  # admission control: waiting-queue cap, then "queue full" rejections
    queue_timeout_s: float | None = None  # admission control: never scheduled after this long -> dropped
    # vLLM V0 (engines.md §1.5)
    preemption_mode: str | None = None  # "recompute" | "swap"; None = V0's auto (recompute for n = 1)
    swap_space: float | None = None  # GiB of CPU swap space per GPU (V0: 4)
    watermark: float | None = None  # fraction of GPU blocks kept free at admission (V0, Sarathi: 0.01)
    scheduler_delay_factor: float | None = None  # V0-9
    # TensorRT-LLM (engines.md §2); max_batch_size / max_num_tokens / tokens_per_block / enable_block_reuse
    # are TRT's names for max_num_seqs / max_num_batched_tokens / block_size / enable_prefix_caching
    capacity_scheduler_policy: str | None = None
    context_chunking_policy: str | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    tokens_per_block: int | None = None
    enable_block_reuse: bool | None = None
    # llama.cpp server (engines.md §3.1): -np, -c (total), -b
    n_parallel: int | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    ctx_shift: bool | None = None
    n_keep: int | None = None
    slot_prompt_similarity: float | None = None
    cache_prompt: bool | None = None
    cont_batching: bool | None = None
    # Ollama (engines.md §3.2): OLLAMA_NUM_PARALLEL, num_ctx (per request), num_batch, OLLAMA_MAX_QUEUE
    num_parallel: int | None = None
    num_ctx: int | None = None
    num_batch: int | None = None
    num_keep: int | None = None
    max_queue: int | None = None
    multiuser_cache: bool | None = None
    model_loaded: bool | None = None  # v0.11.5+: requests for a loaded model bypass OLLAMA_MAX_QUEUE
    # TGI (engines.md §4.2)
    max_concurrent_requests: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    waiting_served_ratio: float | None = None
    max_waiting_tokens: int | None = None
    # Sarathi-Serve (engines.md §5.2): its name for the token budget
    chunk_size: int | None = None


@dataclass(frozen=True)
class SimulationConfig:
    seed: int = 0
    horizon: float | None = None  # seconds; None = run until every request is done
    num_requests: int | None = None  # overrides workload.num_requests
    record_step_trace: bool = False  # keep the per-step JSONL trace (written by --out)


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: dict[str, Any] = field(default_factory=dict)  # validated by workloads.build_workload
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    slo: dict[str, float] = field(default_factory=dict)  # validated by sim.app.results

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "hardware": HardwareConfig,
    "engine": EngineConfig,
    "simulation": SimulationConfig,
}


def _check_type(section: str, key: str, value: Any, annotation: Any) -> Any:
    """Coerce ints to floats where a float is wanted; reject everything else that does not match."""
    options = _resolve(annotation)
    if value is None and type(None) in options:
        return None
    for t in options:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is bool and isinstance(value, bool):
            return value
        if t is str and isinstance(value, str):
            return value
    names = " or ".join("null" if t is type(None) else t.__name__ for t in options)
    raise ConfigError(f"[{section}] {key}: expected {names}, got {value!r}")


def _resolve(annotation: Any) -> tuple[type, ...]:
    if isinstance(annotation, str):
        annotation = eval(annotation, {"Any": Any})  # annotations are simple builtins here
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(typing.get_args(annotation))
    return (annotation,)


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"[{name}] unknown key {key!r}; known keys: {', '.join(fields)}")
        kwargs[key] = _check_type(name, key, value, fields[key].type)
    return cls(**kwargs)


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    unknown = set(raw) - set(_SECTIONS) - {"workload", "slo"}
    if unknown:
        raise ConfigError(
            f"unknown section(s) {sorted(unknown)}; known: model, hardware, engine, workload, simulation, slo"
        )
    raw = _merge_preset(raw)
    parts: dict[str, Any] = {k: _build_section(k, cls, raw.get(k, {})) for k, cls in _SECTIONS.items()}
    workload = raw.get("workload", {})
    slo = raw.get("slo", {})
    if not isinstance(workload, dict) or not isinstance(slo, dict):
        raise ConfigError("[workload] and [slo] must be tables")
    for key, value in slo.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"[slo] {key}: expected a positive number, got {value!r}")
    cfg = RunConfig(workload=dict(workload), slo={k: float(v) for k, v in slo.items()}, **parts)
    _validate(cfg)
    return cfg


def _merge_preset(raw: dict[str, Any]) -> dict[str, Any]:
    """``[engine] preset`` is another name for ``policy``: copy it over; both given and different is an
    error. Returns a shallow copy, so the caller's dict is left as it was."""
    eng = raw.get("engine")
    if not isinstance(eng, dict) or eng.get("preset") is None:
        return raw
    preset = eng["preset"]
    if "policy" in eng and eng["policy"] != preset:
        raise ConfigError(
            f"[engine] preset = {preset!r} and policy = {eng['policy']!r} disagree; give one of them"
        )
    return {**raw, "engine": {**eng, "policy": preset}}


def _validate(cfg: RunConfig) -> None:
    e = cfg.engine
    if not 0 < e.gpu_memory_utilization <= 1:
        raise ConfigError(
            f"[engine] gpu_memory_utilization must be in (0, 1], got {e.gpu_memory_utilization}"
        )
    for key in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "block_size",
        "num_gpu_blocks_override",
    ):
        v = getattr(e, key)
        if v is not None and v < 1:
            raise ConfigError(f"[engine] {key} must be >= 1, got {v}")
    if e.long_prefill_token_threshold < 0:
        raise ConfigError(
            f"[engine] long_prefill_token_threshold must be >= 0, got {e.long_prefill_token_threshold}"
        )
    if e.scheduling_policy not in ("fcfs", "priority"):
        raise ConfigError(
            f"[engine] scheduling_policy must be 'fcfs' or 'priority', got {e.scheduling_policy!r}"
        )
    if e.max_waiting is not None and e.max_waiting < 1:
        raise ConfigError(f"[engine] max_waiting must be >= 1, got {e.max_waiting}")
    if e.queue_timeout_s is not None and not (e.queue_timeout_s > 0 and math.isfinite(e.queue_timeout_s)):
        raise ConfigError(
            f"[engine] queue_timeout_s must be a positive number of seconds, got {e.queue_timeout_s}"
        )
    if e.constant_step_s <= 0:
        raise ConfigError(f"[engine] constant_step_s must be > 0, got {e.constant_step_s}")
    if cfg.hardware.tensor_parallel_size < 1:
        raise ConfigError(
            f"[hardware] tensor_parallel_size must be >= 1, got {cfg.hardware.tensor_parallel_size}"
        )
    h = cfg.simulation.horizon
    if h is not None and not (h > 0 and math.isfinite(h)):
        raise ConfigError(f"[simulation] horizon must be a positive number of seconds, got {h}")
    n = cfg.simulation.num_requests
    if n is not None and n < 0:
        raise ConfigError(f"[simulation] num_requests must be >= 0, got {n}")


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    _resolve_paths(raw, p.parent)
    apply_overrides(raw, overrides or [])
    return config_from_dict(raw)


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Trace paths in a config are relative to the config file, as users expect."""
    wl = raw.get("workload")
    if isinstance(wl, dict) and isinstance(wl.get("trace"), str):
        t = Path(wl["trace"])
        if not t.is_absolute() and (base / t).exists():
            wl["trace"] = str(base / t)


def parse_value(text: str) -> Any:
    """A --set value is TOML (so 0.9, true, "x", [1,2]); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        path, text = item.split("=", 1)
        keys = path.strip().split(".")
        if len(keys) < 2:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a table")
        node[keys[-1]] = parse_value(text.strip())
    return raw


def add_override_option(parser: Any, help_text: str = "override a config value (repeatable)") -> None:
    """The ``--set SECTION.KEY=VALUE`` option every config-taking subcommand shares (see apply_overrides)."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help_text
    )
