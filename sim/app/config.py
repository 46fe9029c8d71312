"""Run configuration: TOML sections -> frozen dataclasses, with vLLM's knob names.

Creating a config writes nothing; every unknown key or wrong type is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.base import all_preset_keys, options_class, parse_engine_options, policy_names
from sim.app.frontend import FrontendConfig, frontend_from_dict
from sim.app.prices import CostConfig, cost_from_dict
from sim.core.errors import ConfigError
from sim.core.fields import MAX_GENERATED, check_range, check_type, missing_file, read_utf8


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
    gpu_memory_utilization: float = 0.9  # left out of a config: the preset's GPU_MEMORY_UTILIZATION
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    scheduling_policy: str = "fcfs"  # "priority" only where the preset models it (its SCHEDULING_POLICIES)
    # vLLM V1's --async-scheduling: a two-deep batch queue (sim/engine/loop.py). Preset vllm only; off by
    # default for now, as the decode fast-forward covers only the synchronous loop (a slow run).
    async_scheduling: bool = False
    cost_model: str = "roofline"  # or "constant"
    constant_step_s: float = 0.02  # step time of the constant cost model
    overhead_gib: float | None = None  # activation peak + non-torch memory, overriding the estimate
    preset: str | None = None  # alias of `policy` (the issue's `engine.preset = "trtllm"`)
    max_waiting: int | None = None  # admission control: waiting-queue cap, then "queue full" rejections
    queue_timeout_s: float | None = None  # admission control: never scheduled after this long -> dropped
    # The chosen preset's own keys (its knobs and engine-native names) as given, type-checked and
    # validated by the preset's options class (policies/options.py); in the TOML they sit in [engine].
    options: dict[str, Any] = field(default_factory=dict)


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
    frontend: FrontendConfig | None = None  # [frontend]: the request path around the engine (sim/app/frontend.py)
    cost: CostConfig | None = None  # [cost]: GPU prices for the cost metrics (sim/app/prices.py)

    def to_dict(self) -> dict[str, Any]:
        """As a raw config (``config_from_dict(cfg.to_dict())`` gives ``cfg`` back): the preset's own
        keys sit in the ``engine`` table beside the shared ones."""
        d = dataclasses.asdict(self)
        d["engine"].update(d["engine"].pop("options"))
        return d


BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM's --block-size choices

_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "hardware": HardwareConfig,
    "engine": EngineConfig,
    "simulation": SimulationConfig,
}


def _check_type(section: str, key: str, value: Any, annotation: Any) -> Any:
    return check_type(f"[{section}]", key, value, annotation)


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if cls is EngineConfig:
        return _build_engine(raw, fields)
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise ConfigError(f"[{name}] unknown key {key!r}; known keys: {', '.join(fields)}")
        kwargs[key] = _check_type(name, key, value, fields[key].type)
    return cls(**kwargs)


def shared_engine_keys() -> list[str]:
    """The ``[engine]`` keys every preset shares (EngineConfig's fields)."""
    return [f.name for f in dataclasses.fields(EngineConfig) if f.name != "options"]


def engine_keys() -> list[str]:
    """Every key an ``[engine]`` table may hold for some preset (shared, then preset-specific)."""
    return [*shared_engine_keys(), *all_preset_keys()]


def _build_engine(raw: dict[str, Any], fields: dict[str, Any]) -> EngineConfig:
    """Shared keys are EngineConfig fields; the rest belong to the chosen preset's options class."""
    shared = shared_engine_keys()
    kwargs = {k: _check_type("engine", k, v, fields[k].type) for k, v in raw.items() if k in shared}
    own = {k: v for k, v in raw.items() if k not in shared}
    policy = kwargs.get("policy", EngineConfig.policy)
    if own:  # (an unknown policy with no own keys fails in resolve(), as before)
        own = parse_engine_options(policy, own, shared).given
    if "gpu_memory_utilization" not in kwargs and policy in policy_names():
        # The preset's default: vLLM's 0.9 of the card; 1.0 for engines with no such cap (policies/options.py)
        kwargs["gpu_memory_utilization"] = options_class(policy).GPU_MEMORY_UTILIZATION
    return EngineConfig(**kwargs, options=own)


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    unknown = set(raw) - set(_SECTIONS) - {"workload", "slo", "frontend", "cost"}
    if unknown:
        raise ConfigError(
            f"unknown section(s) {sorted(unknown)}; known: model, hardware, engine, workload, simulation, slo, "
            "frontend, cost"
        )
    raw = _resolve_plugin(_merge_preset(raw))
    parts: dict[str, Any] = {k: _build_section(k, cls, raw.get(k, {})) for k, cls in _SECTIONS.items()}
    workload = raw.get("workload", {})
    slo = raw.get("slo", {})
    if not isinstance(workload, dict) or not isinstance(slo, dict):
        raise ConfigError("[workload] and [slo] must be tables")
    for key, value in slo.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"[slo] {key}: expected a positive number of milliseconds, got {value!r}")
    parts["frontend"] = frontend_from_dict(raw.get("frontend"))
    parts["cost"] = cost_from_dict(raw.get("cost"))
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


def _resolve_plugin(raw: dict[str, Any]) -> dict[str, Any]:
    """``[engine] policy = "package.module:name"`` or an entry point's name: load it, keep the registered
    name; ``[engine] cost_model`` likewise (sim/core/plugins.py)."""
    eng = raw.get("engine")
    if not isinstance(eng, dict):
        return raw
    if isinstance(eng.get("cost_model"), str):
        from sim.cost.costmodel import resolve_cost_model

        eng = {**eng, "cost_model": resolve_cost_model(eng["cost_model"])}
    if not isinstance(eng.get("policy"), str):
        return {**raw, "engine": eng}
    from policies.base import resolve_policy_name

    return {**raw, "engine": {**eng, "policy": resolve_policy_name(eng["policy"])}}


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
    check_range("[engine]", "constant_step_s", e.constant_step_s, 0, 3600, lo_open=True, unit="seconds")
    check_range("[engine]", "overhead_gib", e.overhead_gib, 0, 1024, unit="GiB")
    if e.block_size is not None and e.block_size not in BLOCK_SIZES:
        raise ConfigError(f"[engine] block_size: not a supported block size, got {e.block_size}; allowed "
                          f"{', '.join(map(str, BLOCK_SIZES))} (vLLM's choices)")
    check_range("[simulation]", "seed", cfg.simulation.seed, 0, 2**64 - 1)
    if cfg.hardware.tensor_parallel_size < 1:
        raise ConfigError(
            f"[hardware] tensor_parallel_size must be >= 1, got {cfg.hardware.tensor_parallel_size}"
        )
    h = cfg.simulation.horizon
    if h is not None and not (h > 0 and math.isfinite(h)):
        raise ConfigError(f"[simulation] horizon must be a positive number of seconds, got {h}")
    n = cfg.simulation.num_requests
    check_range("[simulation]", "num_requests", n, 1, MAX_GENERATED)  # each workload kind checks its own cap
    if cfg.slo:
        from sim.app.results import parse_slo

        parse_slo(cfg.slo)  # before the run, not when its summary is made; its errors name [slo]
    from sim.cost.modelspec import kv_dtype_bytes, normalize_dtype

    for section, key, check in (("[model]", "dtype", normalize_dtype),
                                ("[engine]", "kv_cache_dtype", kv_dtype_bytes)):  # fmt: skip
        value = getattr(cfg.model if section == "[model]" else e, key)
        try:
            check(value)
        except ConfigError as exc:
            raise ConfigError(f"{section} {key}: {exc}") from None

    from sim.cost.costmodel import resolve_cost_model

    resolve_cost_model(e.cost_model)  # a config built without _resolve_plugin (dataclasses.replace)


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    p = Path(path)
    if (why := missing_file(p, "config file")) is not None:
        raise ConfigError(why)
    try:
        raw = tomllib.loads(read_utf8(p))
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
