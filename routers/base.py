"""The router interface, what a router sees of each replica, and the name registry.

A router runs in the gateway: for each request it picks one replica among the candidates the gateway
hands it (replicas whose limits fit the request), or None to keep the request queued at the gateway.
It sees the gateway's own count of outstanding requests (always current: the gateway sees every
response) and the replicas' engine metrics as of the last poll (``poll_interval_s``; 0 = live), like a
real gateway scraping each engine's metrics endpoint. A router that reads none of the polled fields
(``num_running``, ``num_waiting``, ``kv_usage``, ``polled_at``) says so with ``reads_engine_metrics =
False``: the gateway then polls nothing and lets the replicas' decode runs go on past finishes
(sim/app/gateway.py). A router that does not say is polled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from routers.rotor import Rotor, with_room  # compiled (sim/native.py); routers import them from here
from routers.view import ReplicaView  # compiled too; routers import it from here
from sim.core.errors import ConfigError
from sim.core.fields import MAX_INT32
from sim.core.plugins import registrar, resolve
from sim.core.request import RequestSpec


@dataclass
class RouterContext:
    """What a router may know when it is built: every replica's static view and a random stream."""

    replicas: Sequence[ReplicaView]
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def pools(self) -> list[str]:
        return sorted({r.pool for r in self.replicas})


class Router(Protocol):
    name: str

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        """The replica for ``spec`` among ``candidates`` (never empty), or None to hold it at the gateway."""

    def on_routed(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None: ...

    def on_done(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None: ...


class BaseRouter:
    """No-op hooks, so a router implements only ``route`` (the gateway does not call a hook a router
    leaves as this no-op; it looks when it is handed the router)."""

    name = "base"
    reads_engine_metrics = True

    def on_routed(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None:
        pass

    def on_done(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None:
        pass


class LeastRouter(BaseRouter):
    """The replica with room whose ``key`` is smallest, ties rotating (``Rotor``); None when none has room."""

    def __init__(self) -> None:
        self.rotor = Rotor()

    def key(self, c: ReplicaView) -> Any:
        raise NotImplementedError

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        cands = with_room(candidates)
        return self.rotor.pick(cands, self.key) if cands else None


def take_options(options: dict[str, Any], router: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` updated by ``options``; an unknown option is a ConfigError naming it."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise ConfigError(f"router {router!r}: unknown option(s) {unknown}; known: {known}")
    out = dict(defaults)
    out.update(options)
    return out


def read_number(opts: dict[str, Any], key: str, router: str, lo: float = 0.0, integer: bool = False,
                hi: float | None = None) -> Any:
    """``opts[key]``, a number from ``lo`` to ``hi`` (an integer with ``integer``; ``hi`` defaults to
    MAX_INT32 for integers, no bound for other numbers); else a ConfigError naming the option."""
    v = opts[key]
    if hi is None and integer:
        hi = MAX_INT32
    ok = isinstance(v, int | float) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
    if integer:
        ok = ok and float(v).is_integer()
    if not ok:
        kind = "an integer" if integer else "a number"
        lo_s = int(lo) if integer and float(lo).is_integer() else lo
        span = f">= {lo_s}" if hi is None else f"from {lo_s} to {int(hi) if integer else hi}"
        raise ConfigError(f"router {router!r}: option {key} must be {kind} {span}, got {v!r}")
    return int(v) if integer else float(v)


def check_router(name: str, options: dict[str, Any] | None, replicas: Sequence[ReplicaView]) -> Router | None:
    """Build a built-in router once over ``replicas`` (views made from the config, before any engine
    exists): its options and pools are refused when the config loads, not after replicas are built or
    other variants have run. Returns that router (the config check reads what it does, e.g.
    ``reads_engine_metrics``; it routes nothing), or None for a plug-in router, which is built with the
    real replicas only (its factory may read what a config cannot know)."""
    key = resolve_router_name(name)
    if not _plugin(key) and not _nested_plugin(options):
        return _REGISTRY[key](dict(options or {}), RouterContext(replicas))
    return None


def _nested_plugin(options: dict[str, Any] | None) -> bool:
    """Whether a pool or affinity router's inner router (``within``, ``fallback``) is a plug-in: it is built
    with the real replicas only, as a plug-in at the top is (an unknown name is left to the router to name)."""
    for k in ("within", "fallback"):
        v = (options or {}).get(k)
        if isinstance(v, str):
            try:
                if _plugin(resolve_router_name(v)):
                    return True
            except ConfigError:
                pass
    return False


RouterFactory = Callable[[dict[str, Any], RouterContext], Router]
_REGISTRY: dict[str, RouterFactory] = {}


register = registrar(_REGISTRY)  # @register("name") on a factory or class taking (options, ctx)


def _load_builtins() -> None:
    from routers import (  # noqa: F401  (registration side effect)
        least_kv,
        least_outstanding,
        length_pools,
        prefix_aware,
        priority_pools,
        random_router,
        round_robin,
        session_affinity,
    )


def router_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def resolve_router_name(spec: str, where: str = "router") -> str:
    """The registered name of ``spec``: a router name, ``"package.module:Class"`` (a factory or class
    taking ``(options, ctx)``, registered or not) or a ``servesim.routers`` entry point (sim/core/plugins.py)."""
    _load_builtins()
    return resolve(spec, _REGISTRY, kind="router", where=where, adopt=_REGISTRY.__setitem__)


def make_router(name: str, options: dict[str, Any] | None, ctx: RouterContext) -> Router:
    key = resolve_router_name(name)
    try:
        router = _REGISTRY[key](dict(options or {}), ctx)
    except TypeError as exc:
        if not _plugin(key):
            raise
        raise ConfigError(f"router {name!r}: cannot be built as factory(options, ctx): {exc}") from None
    if not callable(getattr(router, "route", None)):
        raise ConfigError(f"router {name!r}: built a {type(router).__name__}, which has no route() method")
    return router


def _plugin(key: str) -> bool:
    return getattr(_REGISTRY[key], "__module__", "").split(".")[0] != "routers"
