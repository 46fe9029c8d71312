"""Where requests come from during a run: a fixed list (open loop) or N clients (closed loop).

Both answer the same three questions the engine asks: when is the next arrival, which specs are due
now, and what happens when a request ends (a closed-loop client thinks, then sends its next one).
A source whose arrivals follow finishes may also say how soon at the earliest (``response_delay``): the
decode fast-forward then lets rows finish inside a run that ends before the arrivals they cause.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np

from sim.core.request import RequestSpec


class ClosedWorkloadLike(Protocol):
    num_clients: int
    num_requests: int

    def spec(self, index: int, client: int, arrival_time: float) -> RequestSpec: ...

    def think_time(self, index: int) -> float: ...


class RequestPath(Protocol):
    """A front end's ways around the engine (sim/app/frontend.py FrontendConfig): a request's send to the
    engine, and a token from the engine to the client. A source that takes one (sessions) times its own
    arrivals instead of being wrapped."""

    def input_latency(self, prompt_len: int) -> float: ...

    def output_latency(self, batch: int) -> float: ...


# The same requests' chunks with each arrival delayed by a function of the prompt lengths (a front end's
# input path): (specs at the delayed times, the original times), chunk by chunk, in the original order.
DelayedChunks = Callable[[Callable[[np.ndarray], np.ndarray]], Iterator[tuple[list[RequestSpec], list[float]]]]


class OpenSource:
    """Requests at fixed arrival times: a list, or chunks of one generated as the clock reaches them
    (``chunks``, ``total``: a lazy synthetic workload; each chunk in arrival order, chunks in turn). Since
    no arrival depends on a finish, the engine lets rows finish inside a fast-forwarded decode run
    (sim/engine/fastforward.py); a subclass whose ``on_done`` brings arrivals must set
    ``arrivals_ignore_finishes = False``. ``delayed``: the lazy workload's requests re-timed (DelayedChunks),
    when it can make them so."""

    arrivals_ignore_finishes = True

    def __init__(self, specs: Sequence[RequestSpec] = (), *, chunks: Iterable[list[RequestSpec]] | None = None,
                 total: int | None = None, delayed: DelayedChunks | None = None) -> None:  # fmt: skip
        self.delayed = delayed
        if chunks is None:
            self.specs = sorted(specs, key=lambda s: s.arrival_time)
            self._more: Iterator[list[RequestSpec]] = iter(())
            self.total = len(self.specs)
        else:
            self._more = iter(chunks)
            # the first chunk is drawn when first asked for (a front end may re-time the source unused)
            self.specs = next(self._more, []) if total is None else []
            self.total = len(self.specs) if total is None else total
        self.pos = 0
        self.num_sent = 0  # requests handed out before the current chunk

    @property
    def untouched(self) -> bool:
        """Nothing generated or handed out yet (a front end may still rebuild it from ``delayed``)."""
        return self.num_sent == 0 and self.pos == 0 and not self.specs

    @property
    def lazy(self) -> bool:
        """Whether requests are still to be generated (``specs`` is only the current chunk)."""
        return self.num_sent + len(self.specs) < self.total

    def _advance(self) -> bool:
        """Move to the next non-empty chunk once this one is used up; False when none is left."""
        while self.pos >= len(self.specs):
            nxt = next(self._more, None)
            if nxt is None:
                return False
            self.num_sent += len(self.specs)
            self.specs, self.pos = nxt, 0
        return True

    def peek_time(self) -> float | None:
        if self.pos >= len(self.specs) and not self._advance():
            return None
        return self.specs[self.pos].arrival_time

    def pop_due(self, now: float) -> list[RequestSpec]:
        out: list[RequestSpec] = []
        while self.pos < len(self.specs) or self._advance():
            specs, i = self.specs, self.pos
            j = i
            while j < len(specs) and specs[j].arrival_time <= now:
                j += 1
            self.pos = j
            out.extend(specs[i:j])
            if j < len(specs):
                break
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        pass

    def num_remaining(self) -> int:
        return self.total - self.num_sent - self.pos

    def remaining(self) -> list[RequestSpec]:
        """Every request not handed out yet (generating the rest of a lazy workload)."""
        out = list(self.specs[self.pos :])
        for chunk in self._more:
            out.extend(chunk)
        self.num_sent, self.specs, self.pos = self.num_sent + self.pos, out, 0
        return list(out)


class ClosedSource:
    """Each client sends at t=0, then again ``think_time`` after its previous request ends."""

    def __init__(self, workload: ClosedWorkloadLike) -> None:
        self.w = workload
        self.issued = 0
        self.heap: list[tuple[float, int, int]] = []  # (time, order, client)
        self.client_of: dict[str, int] = {}
        self.think_of: dict[str, float] = {}  # taken when sent: the workload draws in issue order
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
            self.think_of[spec.request_id] = self.w.think_time(self.issued)
            self.issued += 1
            out.append(spec)
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        client = self.client_of.pop(spec.request_id, None)
        if client is not None:
            self._schedule(client, now + self.think_of.pop(spec.request_id))

    def response_delay(self, spec: RequestSpec) -> float | None:
        """Seconds from this request's end to the earliest arrival its end can cause (its client's next
        send after the think time drawn when it was sent), None if it causes none."""
        return self.think_of.get(spec.request_id)

    def num_remaining(self) -> int:
        return self.w.num_requests - self.issued

    def remaining(self) -> list[RequestSpec]:
        """Requests the clients would still send: specs are made with their due times for the report."""
        out = []
        issued = self.issued
        for t, _, client in sorted(self.heap):
            out.append(self.w.spec(issued, client, t))
            issued += 1
        return out
