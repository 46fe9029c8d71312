"""Gateway routers: one small module each, registered by name (see routers.base)."""

import sim  # noqa: F401  (first: it installs the finder of the compiled modules, routers.rotor among them)
from routers.base import ReplicaView, Router, RouterContext, make_router, register, router_names

__all__ = ["ReplicaView", "Router", "RouterContext", "make_router", "register", "router_names"]
