"""The run config's JSON Schema (``servesim schema``), from the pydantic models of its sections, so an
editor completes and checks the TOML (Taplo / Even Better TOML: ``#:schema ./servesim.schema.json`` on
the first line).

``[engine]`` holds the shared knobs and every preset's own ones (each says which presets take it; the
config check then rejects a knob the chosen preset lacks). ``[workload]`` stays a free table checked by
its builder (workloads/), so its schema documents the keys without forbidding others.
"""

from __future__ import annotations

from typing import Any

from policies.base import options_class, policy_names
from sim.app.config import (
    CLUSTER_TABLES,
    SECTION_NAMES,
    EngineConfig,
    HardwareConfig,
    ModelConfig,
    SimulationConfig,
)
from sim.app.frontend import FrontendConfig
from sim.app.prices import CostConfig
from sim.core.errors import ConfigError
from sim.core.typed import section_model
from workloads.gen.lengths import DISTS

_MODELS: dict[str, type] = {"model": ModelConfig, "hardware": HardwareConfig, "simulation": SimulationConfig,
                            "frontend": FrontendConfig, "cost": CostConfig}  # fmt: skip

_LENGTH = {"description": f"a token count, or a length distribution table {{dist = {'|'.join(DISTS)}, ...}}; "
                          "empirical takes values = [...] or csv = path with column (workloads/gen/lengths.py)",
           "anyOf": [{"type": "integer", "minimum": 1}, {"type": "object"}]}  # fmt: skip

# [workload] as the builders read it (workloads/synthetic.py OPEN_KEYS / CLOSED_KEYS, workloads/gen/sessions.py,
# the trace loaders); each builder rejects the keys its kind does not take, with a one-line error.
WORKLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "workload",
    "description": "What the clients send. kind = open (an arrival process at `rate`), closed (`num_clients` "
                   "each waiting for its answer), sessions (multi-turn chats) or trace (a JSONL or a known "
                   "trace format at `trace`); a plug-in kind takes its own keys. Checked by its builder.",
    "additionalProperties": True,
    "properties": {
        "kind": {"type": "string", "description": "open | closed | sessions | trace | a registered plug-in"},
        "num_requests": {"type": "integer", "minimum": 1},
        "rate": {"type": "number", "exclusiveMinimum": 0, "description": "requests per second (open loop)"},
        "arrival": {"type": "string", "description": "poisson | gamma | constant (open loop)"},
        "burstiness": {"type": "number", "exclusiveMinimum": 0, "description": "vLLM bench's gamma shape"},
        "prompt": _LENGTH,
        "output": _LENGTH,
        "num_clients": {"type": "integer", "minimum": 1, "description": "closed loop: concurrent clients"},
        "think_time": {"type": "number", "minimum": 0, "description": "closed loop / sessions: seconds"},
        "shared_prefix": {"type": "object", "description": "shared-prefix groups (workloads/gen/draws.py)"},
        "priority": {"type": "object", "description": "a priority mix (scheduling_policy = priority)"},
        "trace": {"type": "string", "description": "kind = trace: path, relative to the config file"},
    },
}
SLO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "slo",
    "description": "Latency SLOs in milliseconds: ttft_ms, tpot_ms, itl_ms, e2el_ms (per request, for "
                   "goodput) or a percentile p99_ttft_ms, ... (sim/app/slo.py)",
    "additionalProperties": {"type": "number", "exclusiveMinimum": 0},
}


def _strip_titles(schema: dict[str, Any]) -> dict[str, Any]:
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def engine_schema() -> dict[str, Any]:
    """The shared knobs, then each preset's own (type and default from its options model)."""
    schema = _strip_titles(section_model(EngineConfig).model_json_schema())
    schema["title"] = "engine"
    props = schema["properties"]
    props["policy"]["enum"] = policy_names()
    props["preset"]["anyOf"][0]["enum"] = policy_names()
    owners: dict[str, list[str]] = {}
    for name in policy_names():
        cls = options_class(name)
        own = _strip_titles(cls.options_model().model_json_schema())
        for key, prop in own.get("properties", {}).items():
            owners.setdefault(key, []).append(name)
            props.setdefault(key, prop)
        for alias, target in cls.ALIASES.items():
            owners.setdefault(alias, []).append(name)
            props.setdefault(alias, {**{k: v for k, v in props[target].items() if k != "description"},
                                     "description": f"engine-native name for {target}"})  # fmt: skip
    for key, names in owners.items():
        text = props[key].get("description")
        props[key]["description"] = (f"{text}; " if text else "") + f"preset {', '.join(names)} only"
    return schema


def section_schema(section: str) -> dict[str, Any]:
    """One section's JSON Schema (``[engine]``: with every preset's own knobs)."""
    if section == "engine":
        return engine_schema()
    if section == "workload":
        return WORKLOAD_SCHEMA
    if section == "slo":
        return SLO_SCHEMA
    if section in _CLUSTER:  # what the whole schema says of it (cluster_config.py checks its keys)
        return {"title": section, **_CLUSTER[section]}
    if section not in _MODELS:
        raise ConfigError(f"--section {section!r}: not a config section; allowed: "
                          f"{', '.join((*SECTION_NAMES, *_CLUSTER))}")
    schema = _strip_titles(section_model(_MODELS[section]).model_json_schema())
    schema["title"] = section
    return schema


def config_schema() -> dict[str, Any]:
    """The whole run config: one property per section, unknown sections rejected."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "servesim run config",
        "description": "A servesim run configuration (TOML). `servesim schema` prints this.",
        "type": "object",
        "additionalProperties": False,
        "properties": {**{name: section_schema(name) for name in SECTION_NAMES}, **_CLUSTER},
    }


# A cluster config (sim/app/cluster_config.py) adds these tables; that module checks their keys.
_CLUSTER = {k: {"type": ["object", "array"], "description": f"cluster configs: [{k}] or [[{k}]] (sim/app/cluster_config.py checks it)"}
            for k in CLUSTER_TABLES}
