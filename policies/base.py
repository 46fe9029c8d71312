"""The policy interface, the step plan it returns, and the name registry.

A policy decides, each step, which requests run and how many tokens each computes; it reserves and
frees KV only through the KV manager. The engine prices the plan, waits, and calls ``update``.

Each policy registers with its options class (policies/options.py), in its own file:
``@register("trtllm", options=TrtllmOptions)``. The registry answers which preset has which knob.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.options import PolicyOptions
from sim.core.errors import ConfigError
from sim.core.plugins import resolve
from sim.core.policy import Policy, PolicyLimits, Quiet, StepPlan
from sim.core.typed import check_value

__all__ = ["Policy", "PolicyLimits", "PolicyOptions", "Quiet", "StepPlan", "make_policy",
           "options_class", "parse_engine_options", "policy_defaults", "policy_names", "register"]  # fmt: skip


PolicyFactory = Callable[[PolicyLimits, Any], Policy]
_REGISTRY: dict[str, PolicyFactory] = {}
_OPTIONS: dict[str, type[PolicyOptions]] = {}


def register(
    name: str, options: type[PolicyOptions] = PolicyOptions
) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a policy (or an engine preset: a policy plus its options class) under a name."""

    def deco(factory: PolicyFactory) -> PolicyFactory:
        _REGISTRY[name] = factory
        _OPTIONS[name] = options
        return factory

    return deco


def _load_builtins() -> None:
    # Registration side effect: each module registers its policy / preset.
    from policies import llamacpp, ollama, orca, sarathi, static, tgi, trtllm, vllm, vllm_v0  # noqa: F401


_HOW = "decorate its factory or class with policies.base.register(name, options=...)"


def resolve_policy_name(spec: str) -> str:
    """The registered name for ``spec``: a registered policy name, ``"package.module:name"`` (the module is
    imported, its ``@register`` runs, and ``name`` is a registered name or the factory or class registered),
    or the name of a ``servesim.policies`` entry point (loaded on first use). So a policy in the user's own
    file or package works from a config and the CLI, as Ciw takes plug-ins by argument."""
    _load_builtins()
    return resolve(spec, _REGISTRY, kind="policy", where="[engine] policy", how=_HOW)


def policy_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def options_class(name: str) -> type[PolicyOptions]:
    return _OPTIONS[resolve_policy_name(name)]


def policy_defaults(name: str) -> dict[str, Any]:
    """The preset's defaults: its shared limits, then its own knobs."""
    cls = options_class(name)
    return {**cls.LIMITS, **cls.defaults()}


def knob_owners(key: str) -> list[str]:
    """The presets that have ``key`` as an own knob or an engine-native alias."""
    _load_builtins()
    return sorted(n for n, cls in _OPTIONS.items() if key in cls.accepted())


def all_preset_keys() -> list[str]:
    """Every preset-specific key any registered preset accepts."""
    _load_builtins()
    return sorted({k for cls in _OPTIONS.values() for k in cls.accepted()})


@dataclass(frozen=True)
class ParsedOptions:
    options: PolicyOptions
    given: dict[str, Any]  # the preset-specific keys as given (type-checked), aliases included
    aliases: dict[str, Any]  # engine-native names given: {alias: value}


def _unknown(name: str, key: str, shared: Iterable[str]) -> ConfigError:
    cls = _OPTIONS[name]
    shared = list(shared)
    owners = knob_owners(key)
    head = (
        f"[engine] {key} does not apply to preset {name!r}; it is a knob of: {', '.join(owners)}"
        if owners
        else f"[engine] unknown key {key!r} for preset {name!r}"
    )
    close = [] if owners else difflib.get_close_matches(key, [*shared, *cls.accepted()], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    own = ", ".join(cls.knobs()) or "(none)"
    alias = ", ".join(f"{a} (= {t})" for a, t in cls.ALIASES.items())
    return ConfigError(
        f"{head}{hint} (preset {name!r} accepts its own knobs: {own}"
        + (f"; engine-native names: {alias}" if alias else "")
        + f"; and the shared knobs: {', '.join(shared)})"
    )


def parse_engine_options(name: str, table: Mapping[str, Any], shared: Iterable[str] = ()) -> ParsedOptions:
    """Validate the preset-specific keys of an ``[engine]`` table with preset ``name``'s options class.

    ``shared``: the shared knob names (for the message and the "did you mean" of an unknown key)."""
    cls = options_class(name)
    accepted = set(cls.accepted())
    for key in table:
        if key not in accepted:
            raise _unknown(name, key, shared)
    limit_types = typing.get_type_hints(PolicyLimits)
    aliases = {k: check_value("[engine]", k, v, limit_types[cls.ALIASES[k]]) for k, v in table.items()
               if k in cls.ALIASES}  # fmt: skip
    opts = cls.from_table({k: v for k, v in table.items() if k not in cls.ALIASES})
    given = {k: (aliases[k] if k in aliases else getattr(opts, k)) for k in table}
    return ParsedOptions(opts, given, aliases)


def make_policy(
    name: str, limits: PolicyLimits, options: PolicyOptions | Mapping[str, Any] | None = None
) -> Policy:
    """A policy by name; ``options``: its options object, or a dict of its knobs (defaults for the rest)."""
    cls = options_class(name)
    if options is None or isinstance(options, Mapping):
        options = cls.from_dict(options or {}, name)
    elif not isinstance(options, cls):
        raise ConfigError(f"{name} policy: options must be {cls.__name__}, got {type(options).__name__}")
    return _REGISTRY[resolve_policy_name(name)](limits, options)
