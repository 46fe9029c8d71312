"""Session affinity: every turn of a conversation goes to the replica that served its first turn, where
the conversation's KV (history) is most likely still cached. A session's first request, and requests
without a session, go by the ``fallback`` router (default least-outstanding). With ``load_guard`` set,
a session whose replica has more than that many outstanding requests beyond the least-loaded
candidate moves (and stays) there instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from routers.base import (
    BaseRouter,
    ReplicaView,
    RouterContext,
    make_router,
    read_number,
    register,
    resolve_router_name,
    take_options,
    with_room,
)
from sim.core.request import RequestSpec


class SessionAffinity(BaseRouter):
    name = "session-affinity"

    def __init__(self, ctx: RouterContext, fallback: str, load_guard: int | None) -> None:
        self.fallback = make_router(resolve_router_name(fallback, "router 'session-affinity': option fallback"),
                                    {}, ctx)
        self.load_guard = load_guard
        self.home: dict[str, int] = {}
        self.num_sticky = 0
        self.num_moved = 0

    @property
    def reads_engine_metrics(self) -> bool:
        return getattr(self.fallback, "reads_engine_metrics", True)

    def route(self, spec: RequestSpec, candidates: Sequence[ReplicaView], now: float) -> ReplicaView | None:
        sid = spec.session_id
        if sid is not None and sid in self.home:
            home = next((c for c in candidates if c.index == self.home[sid]), None)
            if home is not None and home.room:
                least = min(with_room(candidates), key=lambda c: c.outstanding)
                if self.load_guard is None or home.outstanding <= least.outstanding + self.load_guard:
                    self.num_sticky += 1
                    return home
            self.num_moved += 1
        return self.fallback.route(spec, candidates, now)

    def on_routed(self, spec: RequestSpec, replica: ReplicaView, now: float) -> None:
        if spec.session_id is not None:
            self.home[spec.session_id] = replica.index
        self.fallback.on_routed(spec, replica, now)


@register("session-affinity")
def _make(options: dict[str, Any], ctx: RouterContext) -> SessionAffinity:
    o = take_options(options, "session-affinity", {"fallback": "least-outstanding", "load_guard": None})
    guard = o["load_guard"]
    return SessionAffinity(
        ctx,
        fallback=str(o["fallback"]),
        load_guard=None if guard is None else read_number(o, "load_guard", "session-affinity", integer=True),
    )
