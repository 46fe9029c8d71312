"""Workload generators by name: ``[workload] kind`` is a built-in (open, closed, trace, sessions), a name
registered with :func:`register_workload`, ``"package.module:builder"`` or a ``servesim.workloads`` entry
point (sim/core/plugins.py).

A builder is called as ``builder(table, seed, max_model_len, base_dir)`` with the whole ``[workload]``
table (its own keys included: the builder validates them) and returns an ``OpenWorkload`` /
``ClosedWorkload`` (or any workload with a ``make_source()``, as sessions have) or a plain list of
``RequestSpec`` (replayed open loop, in arrival order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.core.plugins import registrar, resolve
from sim.core.request import RequestSpec

Builder = Callable[..., Any]  # (table, seed: int | SeedSequence, max_model_len: int | None, base_dir) -> workload
_REGISTRY: dict[str, Builder] = {}


register_workload = registrar(_REGISTRY)  # @register_workload("name") on a builder ([workload] kind = name)


def workload_kinds() -> list[str]:
    return sorted(_REGISTRY)


def resolve_workload_kind(kind: Any) -> str:
    """The registered name of ``[workload] kind``; a bare function named by module path is adopted."""
    if not isinstance(kind, str):
        raise ConfigError(f"workload.kind: expected a workload kind name, got {kind!r}")
    return resolve(kind, _REGISTRY, kind="workload", where="workload.kind", adopt=_REGISTRY.__setitem__)


def build_named(kind: str, cfg: Mapping[str, Any], seed: Any, max_model_len: int | None,
                base_dir: str | Path | None) -> Any:  # fmt: skip
    """Run the builder for ``kind``; a list of RequestSpec becomes an open-loop workload."""
    from workloads.synthetic import ClosedWorkload, OpenWorkload

    name = resolve_workload_kind(kind)
    builder = _REGISTRY[name]
    try:
        out = builder(cfg, seed, max_model_len, base_dir)
    except TypeError as exc:
        if getattr(builder, "__module__", "").split(".")[0] == "workloads":
            raise
        raise ConfigError(f"workload.kind = {kind!r}: cannot be called as builder(table, seed, max_model_len, "
                          f"base_dir): {exc}") from None  # fmt: skip
    if isinstance(out, OpenWorkload | ClosedWorkload) or hasattr(out, "make_source"):  # (sessions: its own)
        return out
    if isinstance(out, list | tuple) and all(isinstance(s, RequestSpec) for s in out):
        return OpenWorkload(sorted(out, key=lambda s: s.arrival_time))
    raise ConfigError(f"workload.kind = {kind!r}: the builder returned {type(out).__name__}; expected an "
                      "OpenWorkload, a ClosedWorkload or a list of RequestSpec")  # fmt: skip
