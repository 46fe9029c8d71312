"""Conversations as the engine reads them during a run: the next turn of each, sent a think time after the
previous one is answered (workloads/gen/sessions.py builds the conversations and documents the model).

Compiled with the engine (sim/native.py): the engine asks a source for its next time, its due requests,
and tells it of each finish, one call or more a turn, and a sessions run has about twice a plain run's
turns per wall second to serve.
"""

from __future__ import annotations

import heapq
from typing import Any

from mypy_extensions import mypyc_attr

from sim.core.request import PrefixHashes, RequestSpec
from sim.core.spec import HASH_ALL, MAX_ARRIVAL_S, SLOT_SETTERS, slot_defaults
from sim.engine.sources import RequestPath

# A turn's slots: these set from the conversation, every other one at the dataclass's declared default.
_TURN_ARGS = ("request_id", "arrival_time", "prompt_len", "output_len", "session_id", "segments", "output_key",
              "prefix_hashes", "private_from", "private_until_done", "shares_content", "hash_end")
_TURN_DEFAULTS = slot_defaults(_TURN_ARGS)
_S_ID, _S_T, _S_P, _S_O, _S_SESSION, _S_SEGMENTS, _S_OUT_KEY, _S_PREFIX, _S_PRIVATE, _S_UNTIL_DONE, _S_SHARES, \
    _S_HASH_END = (SLOT_SETTERS[n] for n in _TURN_ARGS)  # fmt: skip
_new = object.__new__


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)  # compiled (sim/native.py); a plug-in may extend it
class Turns:
    """One conversation's turns: its lengths as lists (read in place by compiled code), and each turn's
    spec. Turn k's prompt is the system prompt, each earlier turn's message and answer, then its own
    message (``content[:first + 2k + 1]``; ``first``: 1 with a system prompt); its output is the
    content's next segment."""

    def __init__(self, conv: Any) -> None:
        self.index: Any = conv.index
        self.session_id = f"s{conv.index}"
        self.content: Any = conv.content()  # checked below (a plug-in's may be a list, hold anything)
        self.first = 1 if conv.system_len else 0
        self.messages: list[Any] = list(conv.messages)
        self.outputs: list[Any] = list(conv.outputs)
        self.thinks = [float(t) for t in conv.thinks]
        self.num_turns = len(self.messages)
        self.prompt_lens: list[Any] = list(conv.prompt_lens)
        self.start = float(conv.start)
        self.plain = self._plain()

    def _plain(self) -> bool:
        """Whether every turn's spec can be built slot by slot: the content is (key, int) segments, each
        turn's segments add up to its prompt, and every length is a plain int >= 1 (what the dataclass's
        checks would find, once per conversation instead of once per turn). If not, each turn goes
        through the constructor, which names what it refuses."""
        if type(self.index) is not int or type(self.content) is not tuple or not self.num_turns:
            return False
        if len(self.content) != self.first + 2 * self.num_turns or len(self.prompt_lens) != self.num_turns:
            return False
        total = 0
        for i, seg in enumerate(self.content):
            if type(seg) is not tuple or len(seg) != 2 or type(seg[1]) is not int or seg[1] < 0:
                return False
            total += seg[1]
            if i >= self.first and (i - self.first) % 2 == 0 and total != self.prompt_lens[(i - self.first) // 2]:
                return False  # the end of a turn's prompt
        for vals in (self.messages, self.outputs, self.prompt_lens):
            if any(type(v) is not int or v < 1 for v in vals):
                return False
        return True

    def spec(self, k: int, arrival_time: float, prefix_hashes: PrefixHashes | None) -> RequestSpec:
        """Turn k arriving at ``arrival_time``."""
        plen = self.prompt_lens[k]
        end = self.first + 2 * k + 1
        rid = f"s{self.index}t{k}"
        # from its new message on, the turn is this conversation's alone until it is answered: the next
        # turn (sent after the answer) repeats it, and the last one's is never repeated
        private_from = plen - self.messages[k]
        until_done = k < self.num_turns - 1
        if not (self.plain and type(arrival_time) is float and 0.0 <= arrival_time <= MAX_ARRIVAL_S):
            return RequestSpec(request_id=rid, arrival_time=arrival_time, prompt_len=plen, output_len=self.outputs[k],
                               session_id=self.session_id, segments=self.content[:end],
                               output_key=self.content[end][0], prefix_hashes=prefix_hashes,
                               private_from=private_from, private_until_done=until_done)  # fmt: skip
        spec = _new(RequestSpec)
        _S_ID(spec, rid)
        _S_T(spec, arrival_time)
        _S_P(spec, plen)
        _S_O(spec, self.outputs[k])
        _S_SESSION(spec, self.session_id)
        _S_SEGMENTS(spec, self.content[:end])
        _S_OUT_KEY(spec, self.content[end][0])
        _S_PREFIX(spec, prefix_hashes)
        _S_PRIVATE(spec, private_from)
        _S_UNTIL_DONE(spec, until_done)
        _S_SHARES(spec, True)  # segments are content
        _S_HASH_END(spec, private_from if private_from < HASH_ALL else HASH_ALL)
        for setter, value in _TURN_DEFAULTS:
            setter(spec, value)
        return spec


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class SessionSource:
    """Engine-facing source (peek_time / pop_due / on_done / remaining, as in sim.engine.sources).

    ``due`` holds (send time, order, conversation, turn); a turn is pushed when the previous one is done.
    With a request path (``with_path``: a front end's input and output latencies, sim/app/frontend.py), a
    turn sent by ``now`` moves to ``transit`` at its engine-side arrival (send + input latency, its send
    noted in ``send_time``), ordered by arrival then the order it moved in, and a finish reaches the user
    after the output latency: what ``FrontendSource`` does around any source, without building each turn
    twice (once at its send, once at its arrival) or a wrapper's calls per request."""

    def __init__(self, workload: Any, path: RequestPath | None = None, send_time: dict[str, float] | None = None,
                 turns: list[Turns] | None = None) -> None:  # fmt: skip
        self.w = workload
        self.turns = [Turns(c) for c in workload.conversations] if turns is None else turns
        clients = workload.num_clients
        self.num_clients: int | None = None if clients is None else int(clients)
        self.due: list[tuple[float, int, int, int]] = []
        self.order = 0
        self.path = path
        self.send_time: dict[str, float] = {} if send_time is None else send_time
        self.transit: list[tuple[float, int, float, int, int]] = []  # (arrival, moved, send, conversation, turn)
        self.moved = 0
        # a finish reaches its user after the output path (B = 1: the batch is not known here); the next
        # turn then takes at least the prompt-independent part of the way in
        self.back = 0.0 if path is None else float(path.output_latency(1))
        self.least_in = 0.0 if path is None else float(path.input_latency(0))
        self.next_conv = 0  # closed loop: next conversation not yet given to a client
        self.sent: dict[str, tuple[int, int]] = {}  # request id -> (conversation, turn) in flight
        self.done_turns = [0] * len(self.turns)  # turns of each conversation sent so far
        # Block hashes of each conversation in flight, shared by its turns (dropped after its last turn).
        self.hashes: dict[int, PrefixHashes] = {}
        self.last_time = 0.0
        if self.num_clients is None:
            for j, c in enumerate(self.turns):
                self._push(c.start, j, 0)
        else:
            for _ in range(min(self.num_clients, len(self.turns))):
                self._push(0.0, self.next_conv, 0)
                self.next_conv += 1

    def with_path(self, path: RequestPath, send_time: dict[str, float]) -> SessionSource | None:
        """This source's turns through ``path`` (None once it has handed out a turn)."""
        if any(self.done_turns):
            return None
        return SessionSource(self.w, path, send_time, self.turns)

    def _push(self, t: float, j: int, k: int) -> None:
        heapq.heappush(self.due, (t, self.order, j, k))
        self.order += 1

    def peek_time(self) -> float | None:
        """The next arrival, or the next send when it is earlier (then no turn is due yet; as the front
        end's wrapper answers, so the engine wakes at the same times)."""
        due, transit = self.due, self.transit
        if not transit:
            return due[0][0] if due else None
        a = transit[0][0]
        if not due:
            return a
        s = due[0][0]
        return a if a < s else s

    def pop_due(self, now: float) -> list[RequestSpec]:
        out: list[RequestSpec] = []
        due = self.due
        path = self.path
        if path is None:
            while due and due[0][0] <= now:
                t, _, j, k = heapq.heappop(due)
                self.done_turns[j] = k + 1
                out.append(self._spec(t, j, k))
        else:
            transit = self.transit
            while due and due[0][0] <= now:  # sent by now: on the way in
                t, _, j, k = heapq.heappop(due)
                self.done_turns[j] = k + 1
                arrival = t + path.input_latency(self.turns[j].prompt_lens[k])
                heapq.heappush(transit, (arrival, self.moved, t, j, k))
                self.moved += 1
            while transit and transit[0][0] <= now:
                arrival, _, t, j, k = heapq.heappop(transit)
                spec = self._spec(arrival, j, k)
                self.send_time[spec.request_id] = t
                out.append(spec)
        if now > self.last_time:
            self.last_time = now
        return out

    def _spec(self, arrival: float, j: int, k: int) -> RequestSpec:
        """Turn k of conversation j as it reaches the engine (at ``arrival``), now in flight."""
        spec = self.turns[j].spec(k, arrival, self._hashes(j))
        self.sent[spec.request_id] = (j, k)
        return spec

    def _hashes(self, j: int) -> PrefixHashes | None:
        """Conversation j's block hashes, shared by its turns (made when its first turn is on its way)."""
        ph = self.hashes.get(j)
        c = self.turns[j]
        if ph is None and c.num_turns > 1:
            ph = self.hashes[j] = PrefixHashes(c.content)
        return ph

    def on_done(self, spec: RequestSpec, now: float) -> None:
        """Next turn after the think time; a closed-loop client whose conversation ended starts another.

        A rejected turn also counts as done: the user moves on (its output is then never cached)."""
        jk = self.sent.pop(spec.request_id, None)
        if jk is None:
            return
        j, k = jk
        c = self.turns[j]
        t = (now + self.back if self.path is not None else now) + c.thinks[k]
        if k + 1 < c.num_turns:
            self._push(t, j, k + 1)
            return
        self.hashes.pop(j, None)
        if self.num_clients is not None and self.next_conv < len(self.turns):
            self._push(t, self.next_conv, 0)
            self.next_conv += 1

    def response_delay(self, spec: RequestSpec) -> float | None:
        """Seconds from this turn's end to the arrival it causes (the think time after it: the next turn,
        or a closed-loop client's next conversation; through a path also the way back and at least the
        way in), None if it causes none."""
        jk = self.sent.get(spec.request_id)
        if jk is None:
            return None
        j, k = jk
        c = self.turns[j]
        if k + 1 < c.num_turns or (self.num_clients is not None and self.next_conv < len(self.turns)):
            d = c.thinks[k]
            return d if self.path is None else d + self.back + self.least_in
        return None

    def remaining(self) -> list[RequestSpec]:
        """Every turn never sent: due ones with their due time, later ones stamped with the last time seen;
        through a path, at their engine-side times (sends noted), those on their way in first, all in
        order of that time."""
        due = {(j, k): t for t, _, j, k in self.due}
        later: list[RequestSpec] = []
        for j, c in enumerate(self.turns):
            for k in range(self.done_turns[j], c.num_turns):
                later.append(c.spec(k, due.get((j, k), self.last_time), None))
        path = self.path
        if path is None:
            return later
        for i, s in enumerate(later):
            self.send_time[s.request_id] = s.arrival_time
            later[i] = s.arriving_at(s.arrival_time + path.input_latency(s.prompt_len))
        coming: list[RequestSpec] = []
        for arrival, _, t, j, k in sorted(self.transit):
            s = self.turns[j].spec(k, arrival, self._hashes(j))  # as a turn in flight has them
            self.send_time[s.request_id] = t
            coming.append(s)
        return sorted(coming + later, key=_arrival)


def _arrival(spec: RequestSpec) -> float:
    return spec.arrival_time
