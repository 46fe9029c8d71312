"""Where requests come from during a run: a fixed list (open loop) or N clients (closed loop).

Both answer the same three questions the engine asks: when is the next arrival, which specs are due
now, and what happens when a request ends (a closed-loop client thinks, then sends its next one).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from sim.core.request import RequestSpec


class ClosedWorkloadLike(Protocol):
    num_clients: int
    num_requests: int

    def spec(self, index: int, client: int, arrival_time: float) -> RequestSpec: ...

    def think_time(self, index: int) -> float: ...


class OpenSource:
    """Requests at fixed arrival times. Since no arrival depends on a finish, the engine lets rows
    finish inside a fast-forwarded decode run (sim/engine/fastforward.py); a subclass whose ``on_done``
    brings arrivals must set ``arrivals_ignore_finishes = False``."""

    arrivals_ignore_finishes = True

    def __init__(self, specs: Sequence[RequestSpec]) -> None:
        self.specs = sorted(specs, key=lambda s: s.arrival_time)
        self.pos = 0

    def peek_time(self) -> float | None:
        return self.specs[self.pos].arrival_time if self.pos < len(self.specs) else None

    def pop_due(self, now: float) -> list[RequestSpec]:
        specs, i = self.specs, self.pos
        j = i
        while j < len(specs) and specs[j].arrival_time <= now:
            j += 1
        self.pos = j
        return list(specs[i:j])

    def on_done(self, spec: RequestSpec, now: float) -> None:
        pass

    def remaining(self) -> list[RequestSpec]:
        return list(self.specs[self.pos :])


class ClosedSource:
    """Each client sends at t=0, then again ``think_time`` after its previous request ends."""

    def __init__(self, workload: ClosedWorkloadLike) -> None:
        self.w = workload
        self.issued = 0
        self.heap: list[tuple[float, int, int]] = []  # (time, order, client)
        self.client_of: dict[str, int] = {}
        self.index_of: dict[str, int] = {}
        self.pending_count = 0
        for client in range(min(workload.num_clients, workload.num_requests)):
            self._schedule(client, 0.0)

    def _schedule(self, client: int, t: float) -> None:
        if self.pending_count + self.issued >= self.w.num_requests:
            return
        heapq.heappush(self.heap, (t, self.pending_count + self.issued, client))
        self.pending_count += 1

    def peek_time(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now: float) -> list[RequestSpec]:
        out: list[RequestSpec] = []
        while self.heap and self.heap[0][0] <= now:
            t, _, client = heapq.heappop(self.heap)
            self.pending_count -= 1
            spec = self.w.spec(self.issued, client, t)
            self.client_of[spec.request_id] = client
            self.index_of[spec.request_id] = self.issued
            self.issued += 1
            out.append(spec)
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        client = self.client_of.pop(spec.request_id, None)
        if client is not None:
            idx = self.index_of.pop(spec.request_id)
            self._schedule(client, now + self.w.think_time(idx))

    def remaining(self) -> list[RequestSpec]:
        """Requests the clients would still send: specs are made with their due times for the report."""
        out = []
        issued = self.issued
        for t, _, client in sorted(self.heap):
            out.append(self.w.spec(issued, client, t))
            issued += 1
        return out
