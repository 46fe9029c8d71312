"""Gateway routers: one small module each, registered by name (see routers.base)."""

from routers.base import ReplicaView, Router, RouterContext, make_router, register, router_names

__all__ = ["ReplicaView", "Router", "RouterContext", "make_router", "register", "router_names"]
