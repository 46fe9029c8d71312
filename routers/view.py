"""What the gateway shows a router of each replica (compiled, sim/native.py: the gateway counts and the
least-outstanding pick read it for every request; interpreted, each read was a dictionary-backed slot
lookup, ~1 us a request at 16 replicas)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mypy_extensions import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)  # a plug-in may extend it; sweeps pickle it
@dataclass(slots=True)
class ReplicaView:
    """One replica as the gateway knows it. Static fields first, then live and polled ones.

    Only the gateway's own counts are typed natively (``outstanding``, ``room``: it writes them); the other
    fields take what a plug-in policy or router hands over (numpy numbers included), as the interpreted
    dataclass did."""

    index: Any  # an int; a plug-in's view may hold a numpy integer (the rotor takes int() of it)
    name: Any
    pool: Any = "default"
    role: Any = "mixed"  # "mixed", "prefill" or "decode"
    block_size: Any = 16
    max_model_len: Any = 1 << 30
    num_gpu_blocks: Any = 1 << 30
    # gateway-local, always current
    outstanding: int = 0  # routed here and not yet answered
    room: bool = True  # below the gateway's max_outstanding for this replica
    # polled from the engine (stale by up to the poll interval): a policy's counts, as it gives them
    num_running: Any = 0
    num_waiting: Any = 0
    kv_usage: Any = 0.0
    polled_at: Any = 0.0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as a constructor call (its class and field values), so a view crosses between a
        compiled and an interpreted process, as it did when it was a plain dataclass."""
        return (type(self), tuple(getattr(self, f.name) for f in fields(self)))
