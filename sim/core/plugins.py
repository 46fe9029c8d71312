"""Plug-in names: a registered name, ``"package.module:attr"``, or a name a package registers by entry point.

Every plug-in kind (policies, routers, workload generators, cost models) keeps its own registry dict and
resolves a config's name through :func:`resolve`, so the three ways of naming one work alike everywhere:

* a built-in or already-registered name (``"vllm"``, ``"least-kv"``);
* ``"package.module:attr"``: the module is imported (its ``register`` calls run) and ``attr`` is a name it
  registered, or the object it registered, or (for kinds that ``adopt``) a factory or class it defines;
* an entry point in the kind's group (``servesim.policies``, ``servesim.routers``, ``servesim.workloads``,
  ``servesim.cost_models``), loaded only when a config names it, so installing a package is enough.

An unknown name stays one line: the kind, the value, a "did you mean" and the known names.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TypeVar

from sim.core.errors import UnknownNameError

GROUPS = {
    "policy": "servesim.policies",
    "router": "servesim.routers",
    "workload": "servesim.workloads",
    "cost model": "servesim.cost_models",
}


T = TypeVar("T")


def registrar(registry: MutableMapping[str, Any]) -> Callable[[str], Callable[[T], T]]:
    """``register = registrar(_REGISTRY)``; then ``@register("name")`` on a factory or class."""

    def register(name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            registry[name] = obj
            return obj

        return deco

    return register


def _entry_points(group: str) -> list[Any]:
    try:
        return list(importlib.metadata.entry_points(group=group))
    except Exception:  # noqa: BLE001 - a broken installed distribution must not break a built-in name
        return []


def entry_point_names(kind: str) -> list[str]:
    """The names installed packages offer for ``kind`` (not loaded)."""
    return sorted({ep.name for ep in _entry_points(GROUPS[kind])})


def _registered_as(registry: Mapping[str, Any], obj: Any) -> str | None:
    for name, value in registry.items():
        if value is obj:
            return name
    return None


def _adopted(spec: str, obj: Any, registry: MutableMapping[str, Any],
             adopt: Callable[[str, Any], None] | None) -> str | None:  # fmt: skip
    """The name ``obj`` is registered under; else, where the kind adopts bare objects, ``spec`` itself."""
    name = _registered_as(registry, obj)
    if name is None and adopt is not None and callable(obj):
        adopt(spec, obj)
        return spec
    return name


def resolve(
    spec: str,
    registry: MutableMapping[str, Any],
    *,
    kind: str,
    where: str,
    adopt: Callable[[str, Any], None] | None = None,
    how: str = "",
) -> str:
    """The registry key for ``spec`` (see module doc); raises UnknownNameError naming ``where`` (the config
    field, e.g. ``[engine] policy``). ``adopt(name, obj)`` registers an unregistered factory or class under
    ``name``; without it a ``module:attr`` must name something the module registered (``how``: the
    sentence that says how to register one, for that error)."""
    if spec in registry:
        return spec
    if ":" in spec:
        return _from_module(spec, registry, kind=kind, where=where, adopt=adopt, how=how)
    for ep in _entry_points(GROUPS[kind]):
        if ep.name != spec:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party import is one line
            raise UnknownNameError(f"{where} = {spec!r}: entry point {ep.value!r} ({GROUPS[kind]}) does not "
                                   f"load: {type(exc).__name__}: {exc}") from None  # fmt: skip
        if spec in registry:  # importing it ran its register(spec, ...)
            return spec
        name = _adopted(spec, obj, registry, adopt)
        if name is not None:
            return name
        raise UnknownNameError(f"{where} = {spec!r}: entry point {ep.value!r} ({GROUPS[kind]}) registers no "
                               f"{kind} named {spec!r}")  # fmt: skip
    raise unknown(spec, registry, kind=kind, where=where)


def _from_module(spec: str, registry: MutableMapping[str, Any], *, kind: str, where: str,
                 adopt: Callable[[str, Any], None] | None, how: str) -> str:  # fmt: skip
    mod, _, attr = spec.partition(":")
    if not mod or mod.startswith(".") or not all(p.isidentifier() for p in mod.split(".")):
        raise UnknownNameError(f"{where} = {spec!r}: {mod!r} is not a module path; allowed: a registered name or "
                               f"\"package.module:name\"")
    try:
        module = importlib.import_module(mod)
    except ImportError as exc:
        raise UnknownNameError(f"{where} = {spec!r}: cannot import module {mod!r} ({exc})") from None
    if attr in registry:
        return attr
    obj = getattr(module, attr, None)
    name = _adopted(spec, obj, registry, adopt) if obj is not None else None
    if name is not None:
        return name
    what = f"registers no {kind} {attr!r}" + ("" if obj is None else f" ({attr!r} is a {type(obj).__name__})")
    raise UnknownNameError(f"{where} = {spec!r}: module {mod!r} {what}" + (f"; {how}" if how else ""))


def unknown(spec: str, registry: Mapping[str, Any], *, kind: str, where: str) -> UnknownNameError:
    """``unknown <kind> 'x'; did you mean 'y'? known: ...`` (registered names and installed entry points)."""
    known = sorted({*registry, *entry_point_names(kind)})
    close = difflib.get_close_matches(spec, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownNameError(f"{where}: unknown {kind} {spec!r}{hint} (known: {', '.join(known)}; or "
                            "\"package.module:name\")")  # fmt: skip
