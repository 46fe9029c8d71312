"""The policy interface, the step plan it returns, and the name registry.

A policy decides, each step, which requests run and how many tokens each computes; it reserves and
frees KV only through the KV manager. The engine prices the plan, waits, and calls ``update``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.core.errors import UnknownNameError
from sim.core.policy import Policy, PolicyLimits, Quiet, StepPlan

__all__ = ["Policy", "PolicyLimits", "Quiet", "StepPlan", "make_policy", "policy_defaults", "policy_names", "register"]


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
