"""What the gateway shows a router of each replica (compiled, sim/native.py: the gateway counts and the
least-outstanding pick read it for every request; interpreted, each read was a dictionary-backed slot
lookup, ~1 us a request at 16 replicas)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)  # a plug-in may extend it; sweeps pickle it
@dataclass(slots=True)
class ReplicaView:
    """One replica as the gateway knows it. Static fields first, then live and polled ones."""

    index: Any  # an int; a plug-in's view may hold a numpy integer (the rotor takes int() of it)
    name: str
    pool: str = "default"
    role: str = "mixed"  # "mixed", "prefill" or "decode"
    block_size: int = 16
    max_model_len: int = 1 << 30
    num_gpu_blocks: int = 1 << 30
    # gateway-local, always current
    outstanding: int = 0  # routed here and not yet answered
    room: bool = True  # below the gateway's max_outstanding for this replica
    # polled from the engine (stale by up to the poll interval)
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    polled_at: float = 0.0
