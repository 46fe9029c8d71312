"""The request path outside the engine: client → API server → engine core, and back out to the client.

A real vLLM V1 server (``vllm serve``) is two processes: the API server (FastAPI/uvicorn, tokenizer,
detokenizer, SSE streaming) and the engine core (scheduler + GPU), joined by msgpack over ZMQ. A benchmark
client (``vllm bench serve``, inference-perf) times from its HTTP send to the SSE chunks it parses. The
engine (sim/engine) models only the engine core; this module adds the rest above it, without touching
the engine:

* input path: the engine sees a request at ``client send + input_latency(prompt_len)`` (its arrivals are
  shifted in the source the app builds, so queueing and batching see the later arrival);
* output path: a token the engine emits at the end of a step with B output rows reaches the client
  ``output_latency(B)`` later (added to the first-token and finish times after the run).

Both are pure delays: they do not block the engine clock (the API server runs in its own process and
overlaps GPU work). The one serial term, ``output_s_per_request`` per running request per step, is
reported as a saturation flag when B × it exceeds the step time (the API server would then be the
bottleneck, as in vLLM ≤ 0.5.3: vLLM blog v0.6.0, 2024-09-05).

Priors (defaults) come from vLLM's architecture and published figures, *not* from a fit to one run; the
sources are in ``PRIORS`` below and in docs/frontend.md. They are meant for a vLLM V1 OpenAI-compatible
server with the prompt sent as text and a client on the same cluster network.
"""

from __future__ import annotations

import dataclasses
import heapq
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field

from sim.core.errors import ConfigError
from sim.core.request import RequestSpec
from sim.core.typed import build
from sim.engine.sources import OpenSource

if TYPE_CHECKING:  # pandas (and the pyarrow it loads) only where a frame is built: ~0.3 s of a run's start
    import pandas as pd

# field -> (prior, published range, source). The defaults below are these priors.
PRIORS: dict[str, tuple[float, str, str]] = {
    "request_overhead_s": (
        1.5e-3, "0.5-1.5 ms",
        "HTTP parse, FastAPI/pydantic CompletionRequest, the hop to the tokenizer thread "
        "(ThreadPoolExecutor(max_workers=1), vllm-project/vllm PR #10635, issue #25301), input processing "
        "and detokenizer set-up; HTTP API server = 33 % of the time of a Llama-3-8B H100 run before it moved "
        "to its own process (vLLM blog v0.6.0, PR #6883); docs/ttft_gap_analysis.md §1.4, §2",
    ),
    "tokenize_s_per_token": (
        1.5e-6, "1-2 us/token",
        "HF fast tokenizer 1.3-4.2 MB/s single thread (huggingface/tokenizers PR #1582, #1584) at ~4 B/token; "
        "vLLM PR #10635: a few hundred ms for 256K tokens (~1 us/token). 0 when prompts are sent as token ids",
    ),
    "engine_hop_s": (
        0.15e-3, "50-200 us",
        "one msgpack + ZMQ ipc hop between the API server and the engine core (vLLM V1 core_client.py), "
        "plus the engine core's input thread decode / output msgpack; no published benchmark "
        "(vllm-project/vllm issue #46121), generic ZMQ ipc round trips are tens of us",
    ),
    "output_s_per_request": (
        45e-6, "20-50 us",
        "API-server work per request with output in a step: output_handler decode, process_outputs "
        "(incremental detokenization: Rust DecodeStream 0.1-0.4 us/token + the Python call, PR #46723, "
        "#15137; 20-44 us/token in the old Python detokenizer, issue #5206), queue put, pydantic response "
        "build and model_dump_json (10-30 us); serial on one asyncio loop, so a chunk waits (B+1)/2 of them",
    ),
    "stream_chunk_s": (
        0.3e-3, "0.1-0.5 ms",
        "SSE out: generator wake-up, uvicorn/h11 write, client-side SSE parse and json.loads of the chunk "
        "(inference-perf apis/streaming_parser.py; docs/ttft_gap_analysis.md §1.4)",
    ),
    "network_rtt_s": (
        0.3e-3, "0.1-0.5 ms",
        "client <-> server round trip on a kept-alive connection inside one cluster; half of it on the way "
        "in, half on the way out",
    ),
}


# seconds, finite: the priors are µs to ms; 10 s for one step of the request path is a broken setup, not a
# server (and larger values only push every time past the clock's range)
Delay = Annotated[float, Field(ge=0, le=10)]


def _prior(key: str) -> Any:
    """The field's default: its prior, with the published range as its description (and schema's)."""
    prior, published, _ = PRIORS[key]
    return field(default=prior, metadata={"doc": f"seconds; prior {prior:g}, published range {published}"})


@dataclass(frozen=True)
class FrontendConfig:
    """``[frontend]``: the request path around the engine (seconds). An empty table = the priors."""

    enabled: bool = True
    request_overhead_s: Delay = _prior("request_overhead_s")
    tokenize_s_per_token: Delay = _prior("tokenize_s_per_token")
    engine_hop_s: Delay = _prior("engine_hop_s")
    output_s_per_request: Delay = _prior("output_s_per_request")
    stream_chunk_s: Delay = _prior("stream_chunk_s")
    network_rtt_s: Delay = _prior("network_rtt_s")

    def input_latency(self, prompt_len: int | np.ndarray) -> Any:
        """Client send → the engine core holds the request."""
        return (self.network_rtt_s / 2 + self.request_overhead_s + self.tokenize_s_per_token * prompt_len
                + self.engine_hop_s)  # fmt: skip

    def output_latency(self, batch: int | np.ndarray) -> Any:
        """A token the engine emitted in a step with ``batch`` output rows → parsed by the client."""
        b = float(batch) if isinstance(batch, int) else np.asarray(batch, float)  # one request: no array
        return (self.engine_hop_s + self.output_s_per_request * (b + 1) / 2
                + self.stream_chunk_s + self.network_rtt_s / 2)  # fmt: skip


# Presets whose server the priors describe: an absent ``[frontend]`` means these priors for them (a vLLM
# user compares with what `vllm bench serve` measures, client-side), and no front end for the others.
DEFAULT_ON = ("vllm",)


CLIENT_COLUMNS = ("send_time", "client_first_token_time", "client_finish_time")  # what annotate() adds
ABSENT = object()  # no [frontend] key at all (None is a run without a front end, as RunConfig.to_dict writes it)


def frontend_from_dict(raw: Any, policy: str | None = None) -> FrontendConfig | None:
    """The ``[frontend]`` table; ABSENT: the priors for a preset in DEFAULT_ON, else no front end; None or
    ``enabled = false``: none."""
    if raw is ABSENT:
        return FrontendConfig() if policy in DEFAULT_ON else None
    if raw is None:
        return None
    fe = build(FrontendConfig, "[frontend]", raw)
    if not fe.enabled and (extra := sorted(k for k in raw if k != "enabled")):  # a value that would do nothing
        raise ConfigError(f"[frontend] {', '.join(extra)} with enabled = false: no front end is modelled, so "
                          "they would be ignored; allowed: drop them or enabled = true")
    return fe if fe.enabled else None


# ---- the input path: shifted arrivals -----------------------------------------------------------------
class FrontendSource:
    """Wraps a dynamic source (closed loop; sessions time their own arrivals, ``SessionSource.with_path``),
    or a lazy open one that cannot make its requests delayed itself (``OpenSource.delayed``): a spec the
    client sends at t reaches the engine at t + input latency; a finish reaches the client (and so its
    next send) after the output path."""

    def __init__(self, inner: Any, fe: FrontendConfig, send_time: dict[str, float]) -> None:
        self.inner, self.fe, self.send_time = inner, fe, send_time
        # Send times no finish moves (an open source generated as the clock goes): the next arrival is known
        # exactly, so peek_time says it instead of the next send (which would wake the engine, and end its
        # decode runs, once more per request).
        self.arrivals_ignore_finishes = getattr(inner, "arrivals_ignore_finishes", False)
        if callable(getattr(inner, "response_delay", None)):  # only a source that can say it
            self.response_delay = self._response_delay
        self.heap: list[tuple[float, int, RequestSpec]] = []
        self.n = 0

    def _pull(self, now: float) -> None:
        for spec in self.inner.pop_due(now):
            arrived = _arrived(spec, self.fe, self.send_time)
            heapq.heappush(self.heap, (arrived.arrival_time, self.n, arrived))
            self.n += 1

    def peek_time(self) -> float | None:
        nxt = self.inner.peek_time()
        if self.arrivals_ignore_finishes:  # a later send cannot arrive before the earliest in transit
            while nxt is not None and (not self.heap or nxt <= self.heap[0][0]):
                self._pull(nxt)
                nxt = self.inner.peek_time()
            return self.heap[0][0] if self.heap else None
        if not self.heap:
            return nxt
        return self.heap[0][0] if nxt is None or self.heap[0][0] < nxt else nxt

    def pop_due(self, now: float) -> list[RequestSpec]:
        self._pull(now)
        out = []
        while self.heap and self.heap[0][0] <= now:
            out.append(heapq.heappop(self.heap)[2])
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        self.inner.on_done(spec, now + self.fe.output_latency(1))  # B = 1: the batch is not known here

    def _response_delay(self, spec: RequestSpec) -> float | None:
        """The inner source's, plus the way back to the client and the next request's way in (at least
        its prompt-independent part)."""
        d = self.inner.response_delay(spec)
        return None if d is None else d + float(self.fe.output_latency(1)) + float(self.fe.input_latency(0))

    def remaining(self) -> list[RequestSpec]:
        """Sent but still on the input path, and not sent yet, at the engine-side time they would come, in
        the order they would (by that time, then send: the order of every other path's rows)."""
        later = [_arrived(s, self.fe, self.send_time) for s in self.inner.remaining()]
        return sorted([s for _, _, s in sorted(self.heap)] + later, key=_arrival)

    def num_remaining(self) -> int:
        return len(self.heap) + self.inner.num_remaining()


def with_frontend(source: Any, fe: FrontendConfig | None) -> tuple[Any, dict[str, float]]:
    """(the source the engine reads, request_id -> client send time). Without a front end: unchanged."""
    send_time: dict[str, float] = {}
    if fe is None:
        return source, send_time
    if type(source) is OpenSource and source.delayed is not None and source.untouched:
        # a generated workload: its requests made at their engine-side times as the run reaches them
        chunks = in_arrival_order(source.delayed(fe.input_latency), float(fe.input_latency(0)), send_time)
        return OpenSource(chunks=chunks, total=source.total), send_time
    if type(source) is OpenSource and not source.lazy:  # a listed workload: shift it once
        return OpenSource([_arrived(s, fe, send_time) for s in source.specs[source.pos :]]), send_time
    with_path = getattr(source, "with_path", None)  # a source that times its arrivals itself (sessions)
    if callable(with_path) and (own := with_path(fe, send_time)) is not None:
        return own, send_time
    return FrontendSource(source, fe, send_time), send_time


def in_arrival_order(chunks: Iterable[tuple[list[RequestSpec], list[float]]], least: float,
                     send_time: dict[str, float]) -> Iterator[list[RequestSpec]]:
    """Delayed requests (chunks of (specs at their engine-side times, their send times), sends ascending)
    as chunks in engine-side order: by arrival, then send (FrontendSource's heap order). No request sent
    at s or later arrives before ``s + least`` (the least input latency: the float sums are monotone), so
    the held ones arriving by then, once the next chunk's first send s is known, are final."""
    held: list[RequestSpec] = []  # not handed out yet, in order
    for specs, sends in chunks:
        send_time.update(zip([s.request_id for s in specs], sends, strict=True))
        if not specs:
            continue
        bound = sends[0] + least
        cut = bisect_right(held, bound, key=_arrival)
        if cut:
            yield held[:cut]
        held = held[cut:] + specs
        held.sort(key=_arrival)  # stable: ties keep send order
    if held:
        yield held


_arrival = attrgetter("arrival_time")


def _arrived(spec: RequestSpec, fe: FrontendConfig, send_time: dict[str, float]) -> RequestSpec:
    """``spec`` as the engine core receives it (after the input path); its client send time is noted."""
    send_time[spec.request_id] = spec.arrival_time
    return spec.arriving_at(spec.arrival_time + fe.input_latency(spec.prompt_len))


# ---- the output path: client-side times -----------------------------------------------------------------
STEP_COLUMNS = ("start", "duration", "num_running", "replica")  # what the output path reads of the steps


def _segments(chunk: dict[str, np.ndarray]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(replica, step ends, num_running) of each replica's consecutive steps in a chunk (its ends ascend)."""
    ends = chunk["start"] + chunk["duration"]
    if not len(ends):
        return []
    rep = chunk.get("replica")
    if rep is None:
        return [(0, ends, chunk["num_running"])]
    cuts = [0, *(np.flatnonzero(np.diff(rep)) + 1).tolist(), len(rep)]
    return [(int(rep[a]), ends[a:b], chunk["num_running"][a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


class _Lookup:
    """Output rows (num_running, at least 1) of the step that ended at each query time, found a chunk of
    steps at a time (a big run's step table is never held whole): first among the query's own replica's
    steps, then (``fallback``) among any replica's (a P/D request's first token comes from its prefill
    replica). A time no step ends at within 1e-9 s keeps 1."""

    def __init__(self, times: np.ndarray, replica: np.ndarray) -> None:
        self.out = np.ones(len(times))
        self.found = np.zeros(len(times), bool)
        ok = np.flatnonzero(np.isfinite(times))
        self.times = times
        self.by_replica: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        order = ok[np.lexsort((times[ok], replica[ok]))]
        reps = replica[order]
        for r in np.unique(reps).tolist():
            idx = order[reps == r]
            self.by_replica[r] = (idx, times[idx])

    def _match(self, idx: np.ndarray, t: np.ndarray, ends: np.ndarray, running: np.ndarray) -> None:
        a = int(np.searchsorted(t, ends[0] - 1e-9, side="left"))
        b = int(np.searchsorted(t, ends[-1] + 1e-9, side="right"))
        if a >= b:
            return
        sub, rows = t[a:b], idx[a:b]
        i = np.clip(np.searchsorted(ends, sub - 1e-12, side="left"), 0, len(ends) - 1)
        hit = (np.abs(ends[i] - sub) <= 1e-9) & ~self.found[rows]
        self.out[rows[hit]] = np.maximum(running[i[hit]], 1)
        self.found[rows[hit]] = True

    def own(self, replica: int, ends: np.ndarray, running: np.ndarray) -> None:
        if replica in self.by_replica:
            self._match(*self.by_replica[replica], ends, running)

    def pending(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The finite query times not found in their own replica's steps, sorted (None: none)."""
        idx = np.flatnonzero(np.isfinite(self.times) & ~self.found)
        if not len(idx):
            return None
        idx = idx[np.argsort(self.times[idx], kind="stable")]
        return idx, self.times[idx]


def output_batches(chunks: Callable[[], Iterable[dict[str, np.ndarray]]], times: list[np.ndarray],
                   replica: np.ndarray, fe: FrontendConfig) -> tuple[list[np.ndarray], float]:  # fmt: skip
    """(for each array of ``times``, the output rows of the step that emitted each token; the fraction of
    steps whose serial API-server output work outran the step), in one pass over the steps' ``chunks``
    (a second only for tokens not found on their own replica)."""
    looks = [_Lookup(t, replica) for t in times]
    over = total = 0
    for chunk in chunks():
        if len(chunk["duration"]):
            over += int(np.count_nonzero(fe.output_s_per_request * chunk["num_running"] > chunk["duration"]))
            total += len(chunk["duration"])
        for r, ends, running in _segments(chunk):
            for lk in looks:
                lk.own(r, ends, running)
    rest = [(lk, p) for lk in looks if (p := lk.pending()) is not None]
    if rest:
        for chunk in chunks():
            for _, ends, running in _segments(chunk):
                for lk, (idx, t) in rest:
                    lk._match(idx, t, ends, running)
    return [lk.out for lk in looks], (over / total if total else 0.0)


def annotate(requests: pd.DataFrame, chunks: Callable[[], Iterable[dict[str, np.ndarray]]], fe: FrontendConfig,
             send_time: dict[str, float]) -> tuple[pd.DataFrame, float]:  # fmt: skip
    """Adds ``send_time`` (client send), ``client_first_token_time`` and ``client_finish_time`` (the first
    and last token as the client parses them) to ``requests`` in place; engine-side columns keep their
    meaning. Also returns the saturated-step fraction (frontend_meta)."""
    df = requests
    arrival = df["arrival_time"].astype(float)
    df["send_time"] = df["request_id"].map(send_time).astype(float).fillna(arrival)
    rep = df["replica"].to_numpy(np.int64) if "replica" in df.columns else np.zeros(len(df), np.int64)
    first = df["first_token_time"].to_numpy(float)
    done = (df["status"] == "finished").to_numpy()
    fin = np.where(done, df["finish_time"].to_numpy(float), np.nan)
    (b_first, b_fin), saturated = output_batches(chunks, [first, fin], rep, fe)
    df["client_first_token_time"] = first + fe.output_latency(b_first)
    df["client_finish_time"] = np.where(done, fin + fe.output_latency(b_fin), np.nan)
    return df, saturated


def frontend_meta(fe: FrontendConfig, saturated_step_fraction: float) -> dict[str, Any]:
    """The parameters, plus how often the API server's serial output work would outrun the GPU step."""
    return {**dataclasses.asdict(fe), "saturated_step_fraction": saturated_step_fraction}


def apply_frontend(result: Any, fe: FrontendConfig | None, send_time: dict[str, float]) -> Any:
    """A SimResult with the client-side columns and ``meta["frontend"]`` (unchanged without a front end)."""
    if fe is not None:
        # the steps' narrow columns a chunk at a time: a big run's frame is never built for this
        result.requests, saturated = annotate(result.requests, lambda: result.step_chunks(STEP_COLUMNS), fe, send_time)
        result.meta["frontend"] = frontend_meta(fe, saturated)
    return result
