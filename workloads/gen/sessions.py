"""Multi-turn conversations with shared system prompts: the workload where prefix caching pays.

A ``[workload]`` table with ``kind = "sessions"``::

    num_sessions = 200                                   # conversations, drawn up front
    turns = {dist = "uniform", low = 2, high = 6}        # turns per conversation (a length dist)
    message = {dist = "lognormal", mean = 150, std = 100}  # new user tokens per turn
    first_message = {dist = "lognormal", mean = 600, std = 300}  # optional; turn 1 (default: message)
    output = {dist = "lognormal", mean = 250, std = 150}
    system_prompt = {num_prompts = 4, len = 512}         # optional: shared across users
    think_time = 10.0                                    # mean seconds from an answer to the next turn
    think_dist = "exponential"                           # or "fixed"
    # who starts conversations -- closed loop (users work back to back) ...
    num_clients = 8
    # ... or open loop of conversation starts (for rate-based sizing):
    rate = 0.5          arrival = "poisson"   burstiness = 1.0
    num_requests = 1000                                  # optional cap on the total number of turns

Turn k's prompt is turn k−1's prompt, then turn k−1's output (segment key = that request's
``output_key``), then the new message, so with prefix caching a turn hits the KV of everything the
conversation said before (as a chat frontend resends the history). A conversation's first segment is
one of ``num_prompts`` system prompts shared by every user who drew it.

Every turn is sent ``think`` seconds after the previous turn of its conversation *finished* (closed loop
within a conversation). With ``num_clients`` each client runs conversations one after another (the next
one starts a think time after its last answer); with ``rate`` conversations start by the arrival process.
The engine's :class:`sim.engine.sources.ClosedSource` cannot express this (it lets any client send request
``i``, so a client whose conversation ended would have to send another conversation's next turn), hence
:class:`SessionSource`, handed to the engine by :meth:`SessionWorkload.make_source`.

Context limit: with ``max_model_len`` a conversation ends before the first turn whose prompt + output
would not fit (``num_truncated`` counts the dropped turns); a first turn that alone does not fit is
clipped (``num_clipped``), as the synthetic workloads do.

Random streams come from the seed like ``workloads.synthetic.spawn_streams`` but on children
``64 + k`` of the seed (k indexing SESSION_STREAMS), so they never alias the synthetic streams; each
quantity has its own stream (common random numbers across compared configurations). Conversation j's
draws do not depend on ``num_sessions`` beyond j.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.fields import MAX_GENERATED, MAX_REQUESTS
from sim.core.request import PrefixHashes, RequestSpec, Segment
from sim.core.spec import MAX_ARRIVAL_S
from workloads.gen.arrivals import ARRIVAL_KINDS, ArrivalConfig, check_span
from workloads.gen.lengths import (
    MAX_LEN,
    LengthDist,
    check_keys,
    check_think_dist,
    clip_to_context,
    read_float,
    read_int,
)
from workloads.gen.session_source import SessionSource, Turns

SESSION_STREAMS = ("starts", "turns", "message", "first_message", "output", "system", "think")
_STREAM_OFFSET = 64  # children 0..63 are reserved for workloads.synthetic.STREAMS
SESSION_KEYS = (
    "kind", "num_sessions", "turns", "message", "first_message", "output", "system_prompt", "think_time",
    "think_dist", "num_clients", "rate", "arrival", "burstiness", "num_requests",
    "client_timeout_s",  # read by the run (sim/app/simulate.py); listed so an unknown key's message names it
)  # fmt: skip


def session_streams(seed: int | np.random.SeedSequence) -> dict[str, np.random.Generator]:
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return {
        name: np.random.Generator(
            np.random.PCG64(
                np.random.SeedSequence(
                    ss.entropy, spawn_key=(*ss.spawn_key, _STREAM_OFFSET + k), pool_size=ss.pool_size
                )
            )
        )
        for k, name in enumerate(SESSION_STREAMS)
    }


@dataclass(frozen=True)
class Conversation:
    """One user's conversation: lengths per turn, the pause after each answer, an optional start time."""

    index: int
    system: int  # system prompt id, -1 for none
    system_len: int
    messages: tuple[int, ...]
    outputs: tuple[int, ...]
    thinks: tuple[float, ...]  # thinks[k]: pause after turn k's answer
    start: float = 0.0  # open loop: when turn 0 is sent

    @property
    def num_turns(self) -> int:
        return len(self.messages)

    def prompt_len(self, k: int) -> int:
        return self.prompt_lens[k]

    @cached_property
    def prompt_lens(self) -> tuple[int, ...]:
        """Every turn's prompt length (each turn's: the last one's, its answer, then a message)."""
        out, n = [], self.system_len
        for k, m in enumerate(self.messages):
            n += m + (self.outputs[k - 1] if k else 0)
            out.append(n)
        return tuple(out)

    def output_key(self, k: int) -> tuple:
        return ("sess-out", self.index, k)

    def segments(self, k: int) -> tuple[Segment, ...]:
        """Turn k's prompt: the system prompt, then each earlier turn's message and answer, then its message."""
        return self.content()[: (1 if self.system_len else 0) + 2 * k + 1]

    def content(self) -> tuple[Segment, ...]:
        """The whole conversation as content segments: every turn's prompt + output is a prefix of it."""
        return self._content

    @cached_property
    def _content(self) -> tuple[Segment, ...]:
        """Built once per conversation: each turn's prompt is a slice of it."""
        segs: list[Segment] = [(("sys", self.system), self.system_len)] if self.system_len else []
        index = self.index
        for i, (m, o) in enumerate(zip(self.messages, self.outputs, strict=True)):
            segs.append((("sess-msg", index, i), m))
            segs.append((("sess-out", index, i), o))  # output_key(i)
        return tuple(segs)

    def spec(self, k: int, arrival_time: float, prefix_hashes: PrefixHashes | None = None) -> RequestSpec:
        """Turn k arriving at ``arrival_time`` (workloads/gen/session_source.py ``Turns.spec``)."""
        return Turns(self).spec(k, float(arrival_time), prefix_hashes)


@dataclass
class SessionWorkload:
    """Conversations plus who starts them: ``num_clients`` (closed loop) or each one's ``start`` (open)."""

    conversations: list[Conversation]
    num_clients: int | None = None  # None: open loop of conversation starts
    num_clipped: int = 0
    num_truncated: int = 0  # turns dropped because the conversation outgrew max_model_len
    num_skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # said with the run's notes (clients or a num_requests cap past what is drawn)

    @property
    def num_requests(self) -> int:
        return sum(c.num_turns for c in self.conversations)

    def __len__(self) -> int:
        return self.num_requests

    @property
    def mean_turns(self) -> float:
        return self.num_requests / len(self.conversations) if self.conversations else 0.0

    def make_source(self) -> SessionSource:
        return SessionSource(self)


# ---- building ------------------------------------------------------------------------------------


def _system_prompts(cfg: Any, where: str) -> tuple[int, int]:
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: expected a table {{num_prompts = ..., len = ...}}, got {cfg!r}")
    check_keys(cfg, ("num_prompts", "len"), where)
    return (read_int(cfg, "num_prompts", where, default=1, lo=1, hi=MAX_GENERATED),
            read_int(cfg, "len", where, lo=1, hi=MAX_LEN))


def _think_times(cfg: Mapping[str, Any], n: int, rng: np.random.Generator, where: str) -> np.ndarray:
    mean = read_float(cfg, "think_time", where, default=0.0, lo=0.0, hi=MAX_ARRIVAL_S / n)  # n: every turn
    dist = cfg.get("think_dist", "exponential")
    check_think_dist(cfg, where)
    if dist == "fixed":
        return np.full(n, mean)
    if dist == "exponential":
        return rng.exponential(mean, size=n) if mean > 0 else np.zeros(n)
    raise ConfigError(f"{where}.think_dist: expected 'fixed' or 'exponential', got {dist!r}")


def build_session_workload(
    cfg: Mapping[str, Any],
    seed: int | np.random.SeedSequence,
    max_model_len: int | None = None,
    *,
    base_dir: str | Path | None = None,
) -> SessionWorkload:
    """The conversations a ``kind = "sessions"`` table describes (module doc). Creates no files."""
    where = "workload (sessions)"
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"workload: expected a table, got {type(cfg).__name__}")
    check_keys(cfg, SESSION_KEYS, where)
    if cfg.get("kind", "sessions") != "sessions":
        raise ConfigError(f"workload.kind: expected 'sessions', got {cfg.get('kind')!r}")
    n = num_sessions = read_int(cfg, "num_sessions", where, lo=1, hi=MAX_REQUESTS)
    has_clients, has_rate = "num_clients" in cfg, "rate" in cfg
    if has_clients == has_rate:
        raise ConfigError(
            f"{where}: give exactly one of num_clients (closed loop: users run conversations back to back) "
            "or rate (open loop: conversations start per second)"
        )
    for key in ("message", "output"):
        if key not in cfg:
            raise ConfigError(
                f'{where}.{key}: required (a length distribution, e.g. {{dist = "fixed", value = 128}})'
            )
    if "turns" not in cfg:
        raise ConfigError(
            f'{where}.turns: required (turns per conversation, e.g. {{dist = "uniform", low = 2, high = 6}})'
        )
    rng = session_streams(seed)
    turns = LengthDist.from_config(cfg["turns"], "workload.turns", base_dir).sample(n, rng["turns"])
    total = int(turns.sum())
    if "num_requests" in cfg:
        cap = read_int(cfg, "num_requests", where, lo=1, hi=MAX_REQUESTS)
        if cap < total:  # keep whole conversations first, cut the last one short
            ends = np.cumsum(turns)
            keep = int(np.searchsorted(ends, cap, side="left")) + 1
            turns = turns[:keep].copy()
            turns[-1] -= int(ends[keep - 1] - cap)
            n, total = keep, cap
    if total > MAX_REQUESTS:  # every turn is a listed request (a row of the results)
        raise ConfigError(f"{where}: num_sessions x turns gives {total:,} requests; allowed at most "
                          f"{MAX_REQUESTS:,} (fewer sessions or turns, or num_requests to cut them)")
    msg_dist = LengthDist.from_config(cfg["message"], "workload.message", base_dir)
    messages = msg_dist.sample(total, rng["message"])
    if cfg.get("first_message") is not None:
        firsts = LengthDist.from_config(cfg["first_message"], "workload.first_message", base_dir).sample(
            n, rng["first_message"]
        )
    else:
        firsts = None
    outputs = LengthDist.from_config(cfg["output"], "workload.output", base_dir).sample(total, rng["output"])
    thinks = _think_times(cfg, total, rng["think"], where)
    systems = np.full(n, -1, dtype=np.int64)
    sys_len = 0
    if cfg.get("system_prompt") is not None:
        num_prompts, sys_len = _system_prompts(cfg["system_prompt"], "workload.system_prompt")
        systems = rng["system"].integers(0, num_prompts, size=n)
    starts = np.zeros(n)
    clients = None
    if has_clients:
        clients = read_int(cfg, "num_clients", where, lo=1, hi=MAX_REQUESTS)
        for key in ("arrival", "burstiness"):
            if key in cfg:
                raise ConfigError(f"{where}.{key}: only applies with rate (open loop), not num_clients")
    else:
        kind = cfg.get("arrival", "poisson")
        if kind not in ARRIVAL_KINDS:
            raise ConfigError(f"{where}.arrival: expected one of {', '.join(ARRIVAL_KINDS)}, got {kind!r}")
        rate = read_float(cfg, "rate", where, lo=0.0, lo_open=True, allow_inf=True)
        check_span(n, rate, f"{where}.rate")
        burst = read_float(cfg, "burstiness", where, default=1.0, lo=0.0, lo_open=True, allow_inf=True)
        try:
            starts = ArrivalConfig(kind, rate, burst).sample(n, rng["starts"])
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    if max_model_len is not None and sys_len + 2 > max_model_len:
        raise ConfigError(
            f"workload.system_prompt.len: {sys_len} leaves no room for a message and an output within "
            f"max_model_len {max_model_len}"
        )
    convs: list[Conversation] = []
    clipped = truncated = 0
    pos = 0
    for j in range(n):
        t = int(turns[j])
        msg = [int(x) for x in messages[pos : pos + t]]
        out = [int(x) for x in outputs[pos : pos + t]]
        th = [float(x) for x in thinks[pos : pos + t]]
        pos += t
        if firsts is not None:
            msg[0] = int(firsts[j])
        if max_model_len is not None:
            # turn 0 alone must fit; later turns that would overflow end the conversation
            p, o, changed = clip_to_context(
                np.array([sys_len + msg[0]]), np.array([out[0]]), max_model_len, min_prompt=sys_len + 1
            )
            if changed[0]:
                clipped += 1
                msg[0], out[0] = int(p[0]) - sys_len, int(o[0])
            ctx = sys_len + msg[0] + out[0]
            keep = 1
            while keep < t and ctx + msg[keep] + out[keep] <= max_model_len:
                ctx += msg[keep] + out[keep]
                keep += 1
            truncated += t - keep
            msg, out, th = msg[:keep], out[:keep], th[:keep]
        convs.append(
            Conversation(
                index=j,
                system=int(systems[j]),
                system_len=sys_len if systems[j] >= 0 else 0,
                messages=tuple(msg),
                outputs=tuple(out),
                thinks=tuple(th),
                start=float(starts[j]),
            )
        )
    w = SessionWorkload(convs, num_clients=clients, num_clipped=clipped, num_truncated=truncated)
    w.notes = _notes(cfg, num_sessions, w)
    return w


def _notes(cfg: Mapping[str, Any], num_sessions: int, w: SessionWorkload) -> tuple[str, ...]:
    """What the closed loop and a trace say too: clients with no conversation to run, and a num_requests cap
    above the turns drawn (not refused: a sizing search over num_clients may pass the conversations)."""
    notes = []
    n, clients = len(w.conversations), w.num_clients
    if clients is not None and clients > n:
        cut = "" if n == num_sessions else f", cut from num_sessions = {num_sessions} by num_requests"
        notes.append(f"num_clients = {clients} for {n} conversations{cut}: only {n} clients run a conversation "
                     f"(one each), the other {clients - n} none")
    cap = cfg.get("num_requests")
    if cap is not None and cap > w.num_requests + w.num_truncated:
        notes.append(f"num_requests = {cap}, but the {n} conversations drawn have only "
                     f"{w.num_requests + w.num_truncated} turns: {w.num_requests} requests run")
    return tuple(notes)


def expected_cached_tokens(conv: Conversation, k: int, block_size: int) -> int:
    """The most prefix-cache hit turn k can get: its history up to the previous output's last full block
    (vLLM caches full blocks only, and the final sampled token never enters the KV cache)."""
    if k == 0:
        return (conv.system_len // block_size) * block_size
    history = conv.prompt_len(k - 1) + conv.outputs[k - 1] - 1
    return int(math.floor(history / block_size)) * block_size
