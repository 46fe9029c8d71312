"""Build a workload from the ``[workload]`` table of a config: open loop, closed loop, or a JSONL trace.

Open loop (``kind = "open"``, the default)::

    arrival = "poisson" | "gamma" | "constant"   rate = 4.0   burstiness = 1.0   rescale = true
    num_requests = 1000
    prompt = {dist = "lognormal", mean = 1000, std = 400, max = 8192}     # see workloads.gen.lengths
    output = {dist = "uniform", low = 16, high = 512}
    shared_prefix = {num_groups = 4, prefix_len = 512}                     # optional
    priority = {levels = [0, 1], weights = [0.8, 0.2]}                     # optional

Closed loop (``kind = "closed"``): ``num_clients``, ``num_requests`` (total), ``think_time`` (mean
seconds, default 0), ``think_dist`` (``fixed`` | ``exponential``), and the same ``prompt``, ``output``,
``shared_prefix``, ``priority``. The frontend decides *when* request ``i`` is issued and by which client;
:class:`ClosedWorkload` only says *what* it is, from arrays drawn up front.

Trace: ``trace = "path.jsonl"`` (``time_scale`` multiplies the arrival times, ``rate_scale`` divides
them; ``num_requests`` keeps the first N; ``skip_bad_rows``).

Shared prefixes follow vLLM's random dataset (``--random-prefix-len``): the prompt is ``prefix_len``
tokens of segment ``("sys", group)`` followed by the sampled ``prompt`` length of unique tokens, so the
total prompt is ``prefix_len + sampled``. The group is drawn uniformly from ``num_groups``.

Random streams. The seed makes one ``SeedSequence``; child ``k`` of it (``spawn_key + (k,)``, exactly what
``SeedSequence.spawn`` would give, without mutating anything) seeds the stream ``STREAMS[k]``. Each random
quantity has its own stream, so changing one setting (the rate, the arrival kind, adding priorities,
switching open ↔ closed loop) leaves every other draw as it was: compared runs see the same requests
(common random numbers). New streams must be appended to ``STREAMS``, never inserted.

Request ids are ``r0, r1, ...`` in arrival order (for a closed loop: in issue order). With
``max_model_len`` every request is fitted into the context (workloads.gen.lengths.clip_to_context) and the
number of changed requests is reported as ``num_clipped``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import MAX_GENERATED, MAX_REQUESTS
from sim.core.request import RequestSpec
from sim.core.spec import MAX_ARRIVAL_S
from sim.engine.sources import OpenSource
from workloads.gen.arrivals import ARRIVAL_KINDS, ArrivalConfig, ArrivalStream, check_span
from workloads.gen.draws import Drawer, Draws
from workloads.gen.lengths import check_keys, check_think_dist, read_float, read_int
from workloads.plugins import build_named, register_workload

STREAMS = ("arrivals", "prompt", "output", "prefix_group", "priority", "think")

# client_timeout_s: the client's, read by the run (sim/app/simulate.py), not by the workload; listed among the
# keys a workload table takes (and passed over here) so an unknown key's message names it too
RUN_KEYS = ("client_timeout_s",)
_COMMON_KEYS = ("kind", "num_requests", "prompt", "output", "shared_prefix", "priority", *RUN_KEYS)
OPEN_KEYS = (*_COMMON_KEYS, "arrival", "rate", "burstiness", "rescale")
CLOSED_KEYS = (*_COMMON_KEYS, "num_clients", "think_time", "think_dist")


def spawn_streams(seed: int | np.random.SeedSequence) -> dict[str, np.random.Generator]:
    """One independent Generator per name in STREAMS, reproducible from ``seed`` alone."""
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return {
        name: np.random.Generator(
            np.random.PCG64(
                np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, k), pool_size=ss.pool_size)
            )
        )
        for k, name in enumerate(STREAMS)
    }


# ---- workloads ---------------------------------------------------------------------------------------


CHUNK = 4096  # requests per lazily generated chunk
MAX_LISTED = MAX_REQUESTS  # a workload this large can still be listed whole (rows, .specs)


class OpenWorkload:
    """A fixed list of requests in arrival order (a loaded trace, a merge of streams)."""

    def __init__(self, specs: list[RequestSpec], num_clipped: int = 0, num_skipped: int = 0,
                 notes: tuple[str, ...] = (), errors: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.specs = specs
        self.num_clipped = num_clipped
        self.num_skipped = num_skipped  # trace rows dropped by skip_bad_rows
        self.notes = tuple(notes)  # what the trace loader did (windows, sorting, raised lengths), one line each
        self.errors = tuple(errors)  # why the first skipped rows were skipped (file:line: field: why)

    def __len__(self) -> int:
        return len(self.specs)


class SyntheticOpenWorkload(OpenWorkload):
    """Open-loop requests generated as the run reaches them, a chunk at a time, from the seed alone: a
    horizon bounds the work and the memory, whatever ``num_requests`` says. ``specs`` lists them all
    (the same requests, bit for bit), for workloads of at most MAX_LISTED requests."""

    def __init__(self, n: int, seed: int | np.random.SeedSequence, arrivals: ArrivalConfig,
                 drawer: Drawer) -> None:  # fmt: skip
        self.n, self.seed, self.arrivals, self.drawer = n, seed, arrivals, drawer
        self.num_skipped = 0
        self._specs: list[RequestSpec] | None = None
        self._num_clipped: int | None = None

    def __len__(self) -> int:
        return self.n

    def _draws(self, size: int) -> Iterator[tuple[int, np.ndarray, Draws]]:
        """(first index, arrival times, draws) of every ``size`` requests; each call starts afresh from the seed."""
        streams = spawn_streams(self.seed)
        times = ArrivalStream(self.arrivals, self.n, streams["arrivals"])
        clipped = 0
        for i0 in range(0, self.n, size):
            k = min(size, self.n - i0)
            t, d = times.take(k), self.drawer.draw(k, streams)
            clipped += d.num_clipped
            if i0 + k == self.n:
                self._num_clipped = clipped
            yield i0, t, d

    def chunks(self, size: int = CHUNK) -> Iterator[list[RequestSpec]]:
        """Every request in arrival order, ``size`` at a time; each call starts afresh from the seed."""
        for i0, t, d in self._draws(size):
            yield d.specs(i0, t.tolist())

    def delayed_chunks(self, latency: Callable[[np.ndarray], np.ndarray],
                       size: int = CHUNK) -> Iterator[tuple[list[RequestSpec], list[float]]]:
        """The requests of ``chunks``, each arriving ``latency(prompt_len)`` after its time there (a front
        end's input path), with those times (the clients' sends): built once at the later time, rather than
        built and then copied (sim/app/frontend.py orders them by their new times)."""
        for i0, t, d in self._draws(size):
            yield d.specs(i0, (t + latency(d.prompt_lens)).tolist()), t.tolist()

    @property
    def specs(self) -> list[RequestSpec]:  # type: ignore[override]
        if self._specs is None:
            if self.n > MAX_LISTED:
                raise ConfigError(f"workload.num_requests: {self.n} requests are too many to list at once "
                                  f"(at most {MAX_LISTED}); they are generated as a run reaches them")
            self._specs = [s for chunk in self.chunks(CHUNK) for s in chunk]
        return self._specs

    @property
    def num_clipped(self) -> int:  # type: ignore[override]
        """Requests cut to fit max_model_len (a pass over the length draws, when not yet counted)."""
        if self._num_clipped is None:
            streams = spawn_streams(self.seed)
            self._num_clipped = sum(self.drawer.draw(min(CHUNK, self.n - i0), streams).num_clipped
                                    for i0 in range(0, self.n, CHUNK))  # fmt: skip
        return self._num_clipped

    def make_source(self) -> OpenSource:
        if self._specs is not None:
            return OpenSource(self._specs)
        return OpenSource(chunks=self.chunks(), total=self.n, delayed=self.delayed_chunks)


class ClosedWorkload:
    """``num_clients`` clients issue ``num_requests`` requests in total, each waiting for its previous
    answer plus a think time. Request ``i`` (lengths, group, priority, think time) is drawn from the seed
    by its number, so it is the same under every policy (common random numbers), whichever client
    happens to send it and whenever. Requests are drawn a chunk at a time as the clients reach them:
    ``spec`` and ``think_time`` are asked in (nearly) increasing order; an older index is drawn again."""

    def __init__(self, num_clients: int, num_requests: int, seed: int | np.random.SeedSequence,
                 drawer: Drawer, think: Callable[[int, np.random.Generator], np.ndarray]) -> None:  # fmt: skip
        self.num_clients, self.num_requests = num_clients, num_requests
        self.seed, self.drawer, self._think = seed, drawer, think
        self.prefix_len = drawer.prefix_len
        self.notes: tuple[str, ...] = ()  # said with the run's notes (num_clients past num_requests)
        self._rewind()

    def __len__(self) -> int:
        return self.num_requests

    def _rewind(self) -> None:
        self._streams = spawn_streams(self.seed)
        self._chunks: dict[int, tuple[Draws, np.ndarray]] = {}
        self._next = 0  # the next chunk to draw
        self._clipped = 0

    def _chunk(self, index: int) -> tuple[Draws, np.ndarray, int]:
        c = index // CHUNK
        if c not in self._chunks:
            if c < self._next:
                self._rewind()
            while self._next <= c:
                k = min(CHUNK, self.num_requests - self._next * CHUNK)
                d = self.drawer.draw(k, self._streams)
                self._clipped += d.num_clipped
                self._chunks[self._next] = (d, self._think(k, self._streams["think"]))
                self._chunks.pop(self._next - 2, None)  # keep two: in flight spans at most num_clients
                self._next += 1
        d, think = self._chunks[c]
        return d, think, index - c * CHUNK

    def _check_index(self, index: int) -> int:
        if not 0 <= index < self.num_requests:
            raise IndexError(f"request index {index} outside 0..{self.num_requests - 1}")
        return int(index)

    def spec(self, index: int, client: int, arrival_time: float) -> RequestSpec:
        """Request ``index`` as sent by ``client`` at ``arrival_time``; id ``r<index>``, session ``c<client>``."""
        i = self._check_index(index)
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} outside 0..{self.num_clients - 1}")
        d, _, j = self._chunk(i)
        return d.spec(i, j, float(arrival_time), session_id=f"c{client}")

    def think_time(self, index: int) -> float:
        _, think, j = self._chunk(self._check_index(index))
        return float(think[j])

    def _all(self) -> list[Draws]:
        if self.num_requests > MAX_LISTED:
            raise ConfigError(f"workload.num_requests: {self.num_requests} requests are too many to list "
                              f"at once (at most {MAX_LISTED})")
        streams = spawn_streams(self.seed)
        return [self.drawer.draw(min(CHUNK, self.num_requests - i0), streams)
                for i0 in range(0, self.num_requests, CHUNK)]  # fmt: skip

    @property
    def prompt_lens(self) -> np.ndarray:
        return np.concatenate([d.prompt_lens for d in self._all()])

    @property
    def output_lens(self) -> np.ndarray:
        return np.concatenate([d.output_lens for d in self._all()])

    @property
    def num_clipped(self) -> int:
        return sum(d.num_clipped for d in self._all())


def _build_open(cfg, seed, max_model_len, base_dir) -> SyntheticOpenWorkload:
    where = "workload"
    n = read_int(cfg, "num_requests", where, lo=1, hi=MAX_GENERATED)
    kind = cfg.get("arrival", "poisson")
    if kind not in ARRIVAL_KINDS:
        raise ConfigError(f"{where}.arrival: expected one of {', '.join(ARRIVAL_KINDS)}, got {kind!r}")
    rate = read_float(cfg, "rate", where, lo=0.0, lo_open=True, allow_inf=True)
    check_span(n, rate, f"{where}.rate")
    burstiness = read_float(cfg, "burstiness", where, default=1.0, lo=0.0, lo_open=True, allow_inf=True)
    rescale = cfg.get("rescale", True)
    if not isinstance(rescale, bool):
        raise ConfigError(f"{where}.rescale: expected true or false, got {rescale!r}")
    try:
        arrivals = ArrivalConfig(kind, rate, burstiness, rescale)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return SyntheticOpenWorkload(n, seed, arrivals, Drawer(cfg, where, max_model_len, base_dir))


def _build_closed(cfg, seed, max_model_len, base_dir) -> ClosedWorkload:
    where = "workload"
    n = read_int(cfg, "num_requests", where, lo=1, hi=MAX_GENERATED)
    clients = read_int(cfg, "num_clients", where, lo=1, hi=MAX_GENERATED)  # each client is a live sender
    # each client's requests follow one another: their thinks must stay within the clock's range
    mean = read_float(cfg, "think_time", where, default=0.0, lo=0.0, hi=MAX_ARRIVAL_S / -(-n // clients))
    dist = cfg.get("think_dist", "fixed")
    check_think_dist(cfg, where)  # the name first, then that there is a think time to shape
    if dist == "fixed":
        def think(k: int, rng: np.random.Generator) -> np.ndarray:
            return np.full(k, mean)
    else:
        def think(k: int, rng: np.random.Generator) -> np.ndarray:
            return rng.exponential(mean, size=k) if mean > 0 else np.zeros(k)
    w = ClosedWorkload(clients, n, seed, Drawer(cfg, where, max_model_len, base_dir), think)
    if clients > n:  # not refused: a sizing search over num_clients may pass num_requests
        w.notes = (f"num_clients = {clients} for num_requests = {n}: only {n} clients send a request (one each), "
                   f"the other {clients - n} none",)
    return w


TOO_LONG = ("error", "reject", "clip")


def _build_trace(cfg, max_model_len, base_dir) -> OpenWorkload:
    """A trace file in any format workloads.tracefmt knows; loader options pass straight through.

    ``too_long`` says what a request longer than max_model_len does: "error" (default: the run stops
    with a line naming the request), "reject" (it is rejected with a reason, as vLLM answers HTTP 400),
    or "clip" (prompt and output are cut to fit). A request is longer than max_model_len when its prompt
    does not fit (prompt >= max_model_len). One whose prompt fits but whose prompt + output does not runs
    under "error" and "reject" as the engine runs it, its output stopped at max_model_len (vLLM's engine
    caps it so; its OpenAI server would answer HTTP 400 to such a max_tokens): a note counts them, so a
    replay is never cut short unsaid ("clip" cuts them to fit instead). The trace's own ``max_model_len``
    option applies too: under "clip" the smaller of it and the engine's.
    """
    from workloads.tracefmt import load_trace

    where = "workload"
    opts = {k: v for k, v in cfg.items() if k not in ("kind", "trace", "format", "num_requests", "too_long", *RUN_KEYS)}
    raw = cfg["trace"]
    if not isinstance(raw, str | Path) or not str(raw).strip():
        raise ConfigError(f"{where}.trace: {raw!r}; expected the path of a trace file")
    path = Path(raw)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    too_long = cfg.get("too_long", "error")
    if too_long not in TOO_LONG:
        raise ConfigError(f"{where}.too_long: expected one of {', '.join(TOO_LONG)}, got {too_long!r}")
    if "num_requests" in cfg:
        if "limit" in cfg:  # the same cut under two names: one of them would be lost
            raise ConfigError(f"{where}: limit = {cfg['limit']!r} and num_requests = {cfg['num_requests']!r} both cut "
                              "the trace; allowed: one of them")
        opts["limit"] = read_int(cfg, "num_requests", where, lo=1, hi=MAX_REQUESTS)
    engine_cut = False  # whether the loader's max_model_len is the engine's (the run's summary names it)
    if too_long == "clip" and max_model_len is not None:
        from workloads.tracefmt.core import option_int

        own = opts.get("max_model_len")  # the workload's own cut is kept when it is the tighter one
        own = None if own is None else option_int("max_model_len", own, 2)
        engine_cut = own is None or max_model_len <= own
        opts["max_model_len"] = max_model_len if own is None else min(max_model_len, own)
    fmt = cfg.get("format", "auto")
    if not isinstance(fmt, str):
        raise ConfigError(f"{where}.format: expected a format name, got {fmt!r}")
    loaded = load_trace(path, format=fmt, **opts)
    specs = list(loaded.specs)
    notes = list(getattr(loaded, "notes", ()))
    if "seed" in opts:  # as `trace stats --seed` refuses it: a seed that draws nothing changes nothing
        from workloads.tracefmt.core import seed_unused

        if seed_unused(notes, opts["seed"]):
            raise ConfigError(f"{where}.seed = {opts['seed']!r}: nothing is drawn at random here (no sample, and the "
                              "file records its arrival times); allowed: seed with sample, or a file without times")
    cap = "num_requests" if "num_requests" in cfg else "limit" if "limit" in cfg else None
    if cap is not None and len(specs) < opts["limit"]:  # a cap, not a count: the run is shorter, and says so
        rows = getattr(loaded, "num_rows", len(specs))
        left = f"only {len(specs)} rows" if len(specs) == rows else f"only {len(specs)} requests left of its {rows} rows"
        notes.append(f"{cap} = {opts['limit']}, but the trace has {left}: {len(specs)} requests run")
    # the requests each cap cut: the run's summary names the engine's max_model_len for num_clipped, so only
    # those count there; a trace option's cut (or a tighter max_model_len of its own) is named in a note
    num_clipped = 0
    for name, value, count in getattr(loaded, "cuts", ()):
        if name == "max_model_len" and engine_cut:
            num_clipped = count
        elif count:
            what = {"max_prompt_len": "prompts", "max_output_len": "outputs"}.get(name, "requests")
            how = " to fit (the prompt first, then the output)" if name == "max_model_len" else ""
            notes.append(f"{count} {what} were cut by the trace option {name} = {value}{how}")
    if too_long != "clip" and max_model_len is not None:
        if too_long == "error":
            for spec in specs:
                if spec.prompt_len >= max_model_len:
                    raise TraceFormatError(
                        f"{path}: request {spec.request_id}: prompt of {spec.prompt_len} tokens does not fit "
                        f"max_model_len {max_model_len} (set workload.too_long = \"reject\" or \"clip\")"
                    )
        over = [s for s in specs if s.prompt_len < max_model_len < s.prompt_len + s.output_len]
        if over:
            notes.append(f"{len(over)} requests (first {over[0].request_id}: prompt {over[0].prompt_len} + output "
                         f"{over[0].output_len}) pass max_model_len {max_model_len}: the engine stops their output "
                         "there, as vLLM's engine does (its server would refuse such a max_tokens with HTTP 400; "
                         "too_long = \"clip\" cuts them to fit)")
    return OpenWorkload(specs, num_clipped=num_clipped, num_skipped=loaded.num_skipped,
                        notes=tuple(notes), errors=tuple(loaded.errors))  # fmt: skip


def build_workload(
    cfg: Mapping[str, Any],
    seed: int | np.random.SeedSequence,
    max_model_len: int | None = None,
    *,
    base_dir: str | Path | None = None,
) -> OpenWorkload | ClosedWorkload:
    """The workload a ``[workload]`` table describes (see module doc). Relative paths (trace, empirical
    CSVs) resolve against ``base_dir`` (the config file's folder, typically). Creates no files."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"workload: expected a table, got {type(cfg).__name__}")
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)):
        raise ConfigError(f"max_model_len: expected an integer, got {max_model_len!r}")
    kind = cfg.get("kind", "trace" if "trace" in cfg else "open")
    return build_named(kind, cfg, seed, max_model_len, base_dir)  # workloads/plugins.py


# The built-in kinds, registered as any plug-in's would be (workloads/plugins.py).
@register_workload("trace")
def _trace(cfg, seed, max_model_len, base_dir) -> OpenWorkload:
    if "trace" not in cfg:  # the trace loader validates its own options
        raise ConfigError("workload.trace: required when kind = 'trace' (path to a .jsonl file)")
    return _build_trace(cfg, max_model_len, base_dir)


@register_workload("open")
def _open(cfg, seed, max_model_len, base_dir) -> SyntheticOpenWorkload:
    check_keys(cfg, OPEN_KEYS, "workload (open loop)")
    return _build_open(cfg, seed, max_model_len, base_dir)


@register_workload("closed")
def _closed(cfg, seed, max_model_len, base_dir) -> ClosedWorkload:
    check_keys(cfg, CLOSED_KEYS, "workload (closed loop)")
    return _build_closed(cfg, seed, max_model_len, base_dir)


@register_workload("sessions")
def _sessions(cfg, seed, max_model_len, base_dir) -> ClosedWorkload:
    from workloads.gen.sessions import build_session_workload

    return build_session_workload(cfg, seed, max_model_len, base_dir=base_dir)
