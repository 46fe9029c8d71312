"""The routers' tie-break and room filter, compiled with the engine (sim/native.py): the gateway asks a
router once per request, and a least-something router reads every replica's key each time (16 replicas:
the loop was ~2.3 us a request interpreted, the gateway's largest single cost after the source)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mypy_extensions import mypyc_attr

from routers.view import ReplicaView


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)  # compiled (sim/native.py); routers may extend it
class Rotor:
    """Breaks ties by rotating through replica indices, so equal replicas share the load evenly
    (always taking the first of equals would pile every quiet-period request onto replica 0)."""

    def __init__(self) -> None:
        self.next = 0

    def pick(self, cands: Sequence[Any], key: Callable[[Any], Any]) -> Any:
        """The candidate with the smallest key; among equals, the first at or after ``next`` in index
        order (wrapping). One pass, each key read once: the gateway asks this for every request (the
        least-outstanding router's own pass, ``least_outstanding``, keeps this tie rule)."""
        nxt: int = self.next
        chosen = cands[0]
        best = key(chosen)
        idx = int(chosen.index)  # a plug-in's view may hold a numpy integer
        rot = (idx - nxt) % (1 << 30)
        for i in range(1, len(cands)):
            c = cands[i]
            k = key(c)
            if k < best:
                idx = int(c.index)
                chosen, best, rot = c, k, (idx - nxt) % (1 << 30)
            elif k == best:
                idx = int(c.index)
                r = (idx - nxt) % (1 << 30)
                if r < rot:
                    chosen, rot = c, r
        self.next = int(chosen.index) + 1
        return chosen

    def least_outstanding(self, cands: list[ReplicaView]) -> ReplicaView | None:
        """``pick(with_room(cands), key=outstanding)`` in one pass over the views' native fields (None:
        none has room): the least-outstanding router's choice, made for every request. The tie rule is
        ``pick``'s (keep the two alike). Raises TypeError, before changing anything, on a candidate that
        is not a ReplicaView (the router then takes ``pick``)."""
        nxt: int = self.next
        chosen: ReplicaView | None = None
        best = 0
        rot = 0
        for c in cands:
            if not c.room:
                continue
            k = c.outstanding
            if chosen is None or k <= best:
                idx = c.index
                r = ((idx if isinstance(idx, int) else int(idx)) - nxt) % (1 << 30)  # no int() call for an int
                if chosen is None or k < best or r < rot:
                    chosen, best, rot = c, k, r
        if chosen is not None:
            self.next = int(chosen.index) + 1
        return chosen


def with_room(cands: Sequence[Any]) -> list[Any]:
    """The candidates below the gateway's max_outstanding."""
    return [c for c in cands if c.room]
