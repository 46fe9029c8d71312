"""Run configuration: TOML sections -> frozen dataclasses, with vLLM's knob names.

Creating a config writes nothing; every unknown key or wrong type is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from policies.base import all_preset_keys, options_class, parse_engine_options, policy_names
from sim.app.frontend import ABSENT, FrontendConfig, frontend_from_dict
from sim.app.prices import CostConfig, cost_from_dict
from sim.app.values import same_value
from sim.core.errors import ConfigError
from sim.core.fields import MAX_GENERATED, MAX_INT32, int_digits, load_toml
from sim.core.typed import build, validate_table

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM's --block-size choices (config/cache.py BlockSize)

Pos = Annotated[int, Field(ge=1, le=2**31 - 1)]  # counts of GPUs, sequences, tokens, blocks: int32 is plenty
Seconds = Annotated[float, Field(gt=0, le=1e9)]  # le: the latest arrival a run takes (sim/core/spec.py MAX_ARRIVAL_S)


def _doc(text: str) -> dict[str, str]:
    """A field's description: the JSON Schema's, shown by editors completing the TOML."""
    return {"doc": text}


@dataclass(frozen=True)
class ModelConfig:
    """[model]: which model's weights and shapes the cost model and the memory plan use."""

    name: str = field(default="Mistral-7B", metadata=_doc("catalogue name (servesim models), HF id, or path to a HF config.json"))
    dtype: str = field(default="auto", metadata=_doc("vLLM --dtype; auto = bf16; awq/gptq/int4/fp8/int8 for quantized weights"))


@dataclass(frozen=True)
class HardwareConfig:
    """[hardware]: the GPU and its parallelism."""

    gpu: str = field(default="RTX 4090", metadata=_doc("catalogue GPU name (servesim gpus)"))
    tensor_parallel_size: Pos = 1
    profile: str = field(default="auto", metadata=_doc("calibration profile name/path; auto = shipped fit or spec-sheet prior"))


@dataclass(frozen=True)
class EngineConfig:
    """[engine]: the knobs every preset shares; names follow vLLM engine args so settings can be copied
    over. The chosen preset's own knobs sit in the same table (``options``)."""

    policy: str = field(default="vllm", metadata=_doc("engine preset / batching policy (or package.module:name)"))
    max_num_seqs: Pos | None = field(default=None, metadata=_doc("None: the preset's default (vLLM: 256; 1024 on cards from 70 GiB, A100 aside)"))
    max_num_batched_tokens: Pos | None = None
    max_model_len: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = field(default=None, metadata=_doc(
        "None: the model's max_position_embeddings (TGI / HF: capped to what fits); -1: the longest that fits "
        "(vLLM's --max-model-len auto)"))
    block_size: Literal[BLOCK_SIZES] | None = field(default=None, metadata=_doc("None: the preset's (vLLM 16, TensorRT-LLM 32)"))
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = field(
        default=0.9, metadata=_doc("left out: the preset's default (vLLM 0.9; 1.0 = the whole card for engines with no cap)"))
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: Pos | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    scheduling_policy: Literal["fcfs", "priority"] = field(
        default="fcfs", metadata=_doc("priority only where the preset models it (its SCHEDULING_POLICIES)"))
    # vLLM V1's --async-scheduling: a two-deep batch queue (sim/engine/loop.py). Modelled for preset vllm
    # only, where it is on by default (vLLM's GPU default since late 2025); false for an older server.
    async_scheduling: bool | None = field(
        default=None, metadata=_doc("None: the preset's (vllm true; others false, as they do not model it)"))
    cost_model: str = field(default="roofline", metadata=_doc("roofline, constant, or a registered / package.module:Class cost model"))
    # at least 1 µs (no GPU step is shorter; a step of 1e-300 s would not move the clock)
    constant_step_s: Annotated[float, Field(ge=1e-6, le=3600)] = field(default=0.02, metadata=_doc("step time of the constant cost model (s)"))
    overhead_gib: Annotated[float, Field(ge=0, le=1024)] | None = field(
        default=None, metadata=_doc("activation peak + non-torch memory, overriding the estimate"))
    preset: str | None = field(default=None, metadata=_doc("alias of policy"))
    max_waiting: Pos | None = field(default=None, metadata=_doc("admission control: waiting-queue cap, then queue-full rejections"))
    queue_timeout_s: Seconds | None = field(default=None, metadata=_doc("admission control: never scheduled after this long -> dropped"))
    # The chosen preset's own keys (its knobs and engine-native names) as given, type-checked and
    # validated by the preset's options class (policies/options.py); in the TOML they sit in [engine].
    options: dict[str, Any] = field(default_factory=dict, metadata={"derived": True})


@dataclass(frozen=True)
class SimulationConfig:
    """[simulation]: seed, horizon and what the run records."""

    seed: Annotated[int, Field(ge=0, le=2**64 - 1)] = 0
    horizon: Seconds | None = field(default=None, metadata=_doc("seconds; None = run until every request is done"))
    num_requests: Annotated[int, Field(ge=1, le=MAX_GENERATED)] | None = field(
        default=None, metadata=_doc("overrides workload.num_requests (each workload kind checks its own cap)"))
    record_step_trace: bool = field(default=False, metadata=_doc("keep the per-step JSONL trace (written by --out)"))


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: dict[str, Any] = field(default_factory=dict)  # validated by workloads.build_workload
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    slo: dict[str, float] = field(default_factory=dict)  # validated by sim.app.results
    # [frontend]: the request path around the engine (sim/app/frontend.py). config_from_dict gives an absent
    # table the preset's default (the priors for vllm); a RunConfig built by hand has what it is given.
    frontend: FrontendConfig | None = None
    cost: CostConfig | None = None  # [cost]: GPU prices for the cost metrics (sim/app/prices.py)

    def to_dict(self) -> dict[str, Any]:
        """As a raw config (``config_from_dict(cfg.to_dict())`` gives ``cfg`` back): the preset's own
        keys sit in the ``engine`` table beside the shared ones."""
        d = dataclasses.asdict(self)
        d["engine"].update(d["engine"].pop("options"))
        return d


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "hardware": HardwareConfig,
    "engine": EngineConfig,
    "simulation": SimulationConfig,
}


SECTION_NAMES = ("model", "hardware", "engine", "workload", "simulation", "slo", "frontend", "cost")
CLUSTER_TABLES = ("cluster", "replica", "stream", "variants")  # any of them makes a config a cluster's (sim/app/cluster_config.py)


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if cls is EngineConfig:
        return _build_engine(raw)
    return build(cls, f"[{name}]", raw)


def shared_engine_keys() -> list[str]:
    """The ``[engine]`` keys every preset shares (EngineConfig's fields)."""
    return [f.name for f in dataclasses.fields(EngineConfig) if f.name != "options"]


def engine_keys() -> list[str]:
    """Every key an ``[engine]`` table may hold for some preset (shared, then preset-specific)."""
    return [*shared_engine_keys(), *all_preset_keys()]


def _build_engine(raw: Any) -> EngineConfig:
    """Shared keys are EngineConfig fields (its model checks them); the rest belong to the chosen preset's
    options class."""
    if not isinstance(raw, dict):
        raise ConfigError(f"[engine] must be a table, got {raw!r}")
    shared = shared_engine_keys()
    kwargs = validate_table(EngineConfig, "[engine]", {k: v for k, v in raw.items() if k in shared})
    own = {k: v for k, v in raw.items() if k not in shared}
    policy = kwargs.get("policy", EngineConfig.policy)
    if own:  # (an unknown policy with no own keys fails in resolve(), as before)
        own = parse_engine_options(policy, own, shared).given
    if "gpu_memory_utilization" not in kwargs and policy in policy_names():
        # The preset's default: vLLM's 0.9 of the card; 1.0 for engines with no such cap (policies/options.py)
        kwargs["gpu_memory_utilization"] = options_class(policy).GPU_MEMORY_UTILIZATION
    return EngineConfig(**kwargs, options=own)


def _check_tables(raw: Any) -> None:
    """A config is a dict of tables whose keys are strings, at every depth (as TOML makes them): a list or an
    int key from Python code is refused here, not by whatever first trips on it."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a dict of tables ([section] -> keys), got {type(raw).__name__}")
    stack: list[tuple[str, Any]] = [("", raw)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{where or 'config'}: key {k!r} is a {type(k).__name__}; allowed: string keys")
                stack.append((f"{where}.{k}" if where else k, v))
        elif isinstance(node, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    _check_tables(raw)
    unknown = sorted(set(raw) - set(SECTION_NAMES))
    cluster = [k for k in CLUSTER_TABLES if k in unknown]
    if cluster:  # a cluster config handed to a one-engine reader (the Python API, --intervals, a sweep point)
        raise ConfigError(f"cluster table(s) {cluster} in a one-engine config; allowed: `servesim run FILE` or "
                          "`servesim cluster FILE`, or sim.app.cluster.simulate_cluster(raw) in Python")
    if unknown:
        close = difflib.get_close_matches(unknown[0], SECTION_NAMES, n=1)
        hint = f"did you mean [{close[0]}]? " if close else ""
        raise ConfigError(f"unknown section(s) {unknown}; {hint}known: {', '.join(SECTION_NAMES)}")
    raw = _resolve_plugin(_merge_preset(raw))
    parts: dict[str, Any] = {k: _build_section(k, cls, raw.get(k, {})) for k, cls in _SECTIONS.items()}
    workload = raw.get("workload", {})
    slo = raw.get("slo", {})
    if not isinstance(workload, dict) or not isinstance(slo, dict):
        raise ConfigError("[workload] and [slo] must be tables")
    for key, value in slo.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or (
                isinstance(value, int) and value > 1e300):  # an integer past any float (float() would overflow)
            shown = f"an integer of {int_digits(value)} digits" if isinstance(value, int) and value > 1e300 else repr(value)
            raise ConfigError(f"[slo] {key}: expected a positive number of milliseconds, got {shown}")
    # an absent [frontend] is the preset's default; None (to_dict of a run without one) is none
    parts["frontend"] = frontend_from_dict(raw.get("frontend", ABSENT), parts["engine"].policy)
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
    """What the section models cannot check alone: names looked up in catalogues and registries."""
    e = cfg.engine
    if e.max_model_len is not None and e.max_model_len < 2 and e.max_model_len != -1:  # a prompt and an output token
        raise ConfigError(f"[engine] max_model_len: out of range, got {e.max_model_len}; allowed 2 <= value <= "
                          f"{MAX_INT32} (a prompt token and an output token), or -1 (the longest that fits, vLLM's "
                          "auto)")
    if not cfg.model.name.strip():
        raise ConfigError(f"[model] name: got {cfg.model.name!r}; allowed: a catalogue name (servesim models), a "
                          "config.json path, or a folder holding one")
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
    if not isinstance(path, str | Path):
        raise ConfigError(f"load_config: expected the path of a TOML config, got {type(path).__name__}")
    p = Path(path)
    raw = load_toml(p)
    _resolve_paths(raw, p.parent)
    apply_overrides(raw, overrides or [])
    check_rate_scales(raw)
    return config_from_dict(raw)


def check_rate_scales(raw: dict[str, Any]) -> None:
    """A user's ``rate_scale`` (in [workload], a [[stream]] or a [variants.NAME] of them) gets the bound its
    inverse, ``time_scale``, has: a million times faster at most (sim.cli.trace's --rate-scale too). Checked
    where a config file and its --set are read, not in the trace loader, which leaves it open: the sizing
    search replays a trace far faster, at its offline point (sim/app/sizing.py OFFLINE_SCALE)."""
    for where, table in _workload_tables(raw, ""):
        check_rate_scale(table.get("rate_scale"), f"{where}.rate_scale")


def _workload_tables(raw: Any, at: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, table) of every workload table of a raw config, its variants' included."""
    if not isinstance(raw, dict):
        return []
    out = [(f"{at}workload", raw["workload"])] if isinstance(raw.get("workload"), dict) else []
    streams = raw.get("stream")
    if isinstance(streams, list):
        out += [(f"{at}[[stream]] #{j + 1}", s) for j, s in enumerate(streams) if isinstance(s, dict)]
    variants = raw.get("variants")
    if isinstance(variants, dict):
        for name, v in variants.items():
            out += _workload_tables(v, f"[variants.{name}] ")
    return out


def check_rate_scale(value: Any, where: str) -> None:
    """``value`` as a user's rate_scale: a number above MAX_RATE_SCALE is refused (any other value is the
    trace loader's to check)."""
    from workloads.tracefmt.core import MAX_RATE_SCALE

    if isinstance(value, bool) or not isinstance(value, int | float) or not value > MAX_RATE_SCALE:
        return
    shown = f"an integer of {int_digits(value)} digits" if isinstance(value, int) and value > 1e300 else repr(value)
    raise ConfigError(f"{where}: got {shown}; allowed rate_scale <= {MAX_RATE_SCALE:g} (as time_scale >= "
                      f"{1 / MAX_RATE_SCALE:g}: a million times faster at most)")


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Trace paths, and the CSVs of empirical length distributions anywhere in [workload] (a prompt's, a
    session's message's), are relative to the config file, as users expect."""
    wl = raw.get("workload")
    if not isinstance(wl, dict):
        return
    _resolve_key(wl, "trace", base)

    def walk(table: dict[str, Any]) -> None:
        for v in table.values():
            if isinstance(v, dict):
                _resolve_key(v, "csv", base)
                walk(v)

    walk(wl)


def _resolve_key(table: dict[str, Any], key: str, base: Path) -> None:
    """``table[key]``, a relative path that exists beside the config, as that path ("": refused later)."""
    v = table.get(key)
    if isinstance(v, str) and v.strip() and "\x00" not in v:
        t = Path(v)
        if not t.is_absolute() and (base / t).exists():
            table[key] = str(base / t)


def parse_value(text: str, where: str = "--set") -> Any:
    """A --set value is TOML (so 0.9, true, "x", [1,2]); a bare word is a string. One line: a newline
    would start a second TOML key that the value silently dropped."""
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{where} value {text!r}: a line break in a value; allowed: one line of TOML")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError(f"{where} value {text[:40]!r}...: nested too deeply to parse") from None
    if isinstance(value, float) and math.isinf(value) and "inf" not in text:  # 1e400: past float64, read as inf
        raise ConfigError(f"{where} value {text!r}: past the largest float (~1.8e308); allowed: a finite number, "
                          "or inf where a setting takes it")
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        path, text = item.split("=", 1)
        keys = _key_path(path, item)
        if len(keys) < 2:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        node = raw
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a table")
        node[keys[-1]] = parse_value(text.strip(), f"--set {path.strip()}")
    return raw


def check_set_repeats(overrides: list[str]) -> None:
    """The user's ``--set`` list names each key once, or twice with the same value: two values for one key
    would have the later silently win (argparse's rule for a flag given twice). Layered overrides (the
    vLLM flags, the prices, ``--goodput``) go before and after the user's, and are not checked here."""
    seen: dict[str, tuple[str, Any]] = {}
    for item in overrides:
        if "=" not in item:
            continue  # apply_overrides says what is wrong with it
        key = override_key(item)
        text = item.split("=", 1)[1].strip()
        value = parse_value(text, f"--set {key}")
        if key in seen and not same_value(key, seen[key][1], value):
            raise ConfigError(f"--set {key} is given twice, {seen[key][0]!r} then {text!r}; allowed: one value "
                              "for a key (the later would silently replace the earlier)")
        for other, (other_text, other_value) in seen.items():  # a table, and a key inside it
            if other.startswith(key + ".") or key.startswith(other + "."):
                table, inner = (key, other) if len(key) < len(other) else (other, key)
                tvalue, ivalue = (value, other_value) if table == key else (other_value, value)
                path = inner[len(table) + 1:].split(".")
                # The table first, then a key it does not give: the key joins the table (apply_overrides goes
                # into it), nothing is lost. The key first, then a table without that value, or a table with
                # another value for it, then the key: the later replaces the earlier.
                given = _at(tvalue, path)
                if table == other and given is _ABSENT:
                    continue
                if given is _ABSENT or not same_value(inner, given, ivalue):
                    raise ConfigError(f"--set {other}={other_text} then --set {key}={text}: the table {table} and "
                                      f"its key {inner} (the later would replace part of the earlier, or all of it); "
                                      f"allowed: the whole table in one --set, or its keys one by one")
        seen.setdefault(key, (text, value))


_ABSENT = object()


def _at(table: Any, path: list[str]) -> Any:
    """What the ``--set`` value ``table`` gives at ``path`` (_ABSENT: nothing)."""
    for k in path:
        if not isinstance(table, dict) or k not in table:
            return _ABSENT
        table = table[k]
    return table


def override_key(item: str) -> str:
    """The dotted key a ``--set SECTION.KEY=VALUE`` sets, as the config reads it (parts stripped, TOML quotes
    resolved): what the checks comparing a --set with another option's key look at."""
    return ".".join(part.strip() for part in _key_path(item.partition("=")[0], item))


def _key_path(path: str, item: str) -> list[str]:
    """The parts of ``--set``'s dotted key. A quoted part is read as TOML reads a key (``slo."p99.9_ttft_ms"``:
    a dot inside quotes belongs to the name); without quotes the dots split it as written (a card's price key
    ``cost.gpu_hour.RTX 4090`` has a space, which a bare TOML key cannot)."""
    if '"' not in path and "'" not in path:
        return path.strip().split(".")
    try:
        node: Any = tomllib.loads(f"{path.strip()} = 0")
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"--set {item!r}: the key is not a dotted TOML key (quote a part with a dot inside, "
                          'e.g. slo."p99.9_ttft_ms")') from None
    keys: list[str] = []
    while isinstance(node, dict):
        (k, node), = node.items()
        keys.append(k)
    return keys


def add_override_option(parser: Any, help_text: str = "override a config value (repeatable)") -> None:
    """The ``--set SECTION.KEY=VALUE`` option every config-taking subcommand shares (see apply_overrides)."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help_text
    )
