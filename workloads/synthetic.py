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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import MAX_REQUESTS
from sim.core.request import RequestSpec
from workloads.gen.arrivals import ARRIVAL_KINDS, ArrivalConfig
from workloads.gen.lengths import LengthDist, check_keys, clip_to_context, read_float, read_int

STREAMS = ("arrivals", "prompt", "output", "prefix_group", "priority", "think")

_COMMON_KEYS = ("kind", "num_requests", "prompt", "output", "shared_prefix", "priority")
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


# ---- parts -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    num_groups: int
    prefix_len: int

    @classmethod
    def from_config(cls, cfg: Any, where: str) -> SharedPrefix:
        if not isinstance(cfg, Mapping):
            raise ConfigError(
                f"{where}: expected a table {{num_groups = ..., prefix_len = ...}}, got {cfg!r}"
            )
        check_keys(cfg, ("num_groups", "prefix_len"), where)
        return cls(read_int(cfg, "num_groups", where, lo=1), read_int(cfg, "prefix_len", where, lo=1))


@dataclass(frozen=True, slots=True)
class PriorityMix:
    levels: tuple[int, ...]
    weights: tuple[float, ...]  # normalised to sum 1

    @classmethod
    def from_config(cls, cfg: Any, where: str) -> PriorityMix:
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{where}: expected a table {{levels = [...], weights = [...]}}, got {cfg!r}")
        check_keys(cfg, ("levels", "weights"), where)
        levels = cfg.get("levels")
        if not isinstance(levels, list | tuple) or not levels:
            raise ConfigError(f"{where}.levels: expected a non-empty list of integers, got {levels!r}")
        lv = tuple(read_int({"levels": x}, "levels", where) for x in levels)
        w_raw = cfg.get("weights", [1.0] * len(lv))
        if not isinstance(w_raw, list | tuple) or len(w_raw) != len(lv):
            raise ConfigError(
                f"{where}.weights: expected a list of {len(lv)} numbers (one per level), got {w_raw!r}"
            )
        w = [read_float({"weights": x}, "weights", where, lo=0.0) for x in w_raw]
        if sum(w) <= 0:
            raise ConfigError(f"{where}.weights: must not all be zero")
        return cls(lv, tuple(x / sum(w) for x in w))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        idx = rng.choice(len(self.levels), size=n, p=np.asarray(self.weights))
        return np.asarray(self.levels, dtype=np.int64)[idx]


@dataclass(frozen=True)
class _Draws:
    """Everything about request i except its arrival time; identical for any arrival setting."""

    prompt_lens: np.ndarray  # total prompt, prefix included
    output_lens: np.ndarray
    priorities: np.ndarray
    groups: np.ndarray | None
    prefix_len: int
    num_clipped: int


def _segments(rid: str, group: int, prefix_len: int, prompt_len: int) -> tuple:
    return ((("sys", group), prefix_len), (("u", rid), prompt_len - prefix_len))


def _draw(
    cfg: Mapping[str, Any],
    n: int,
    streams: dict[str, np.random.Generator],
    where: str,
    max_model_len: int | None,
    base_dir: str | Path | None,
) -> _Draws:
    for key in ("prompt", "output"):
        if key not in cfg:
            raise ConfigError(
                f'{where}.{key}: required (a length distribution, e.g. {{dist = "fixed", value = 128}})'
            )
    prompt = LengthDist.from_config(cfg["prompt"], f"{where}.prompt", base_dir).sample(n, streams["prompt"])
    output = LengthDist.from_config(cfg["output"], f"{where}.output", base_dir).sample(n, streams["output"])
    groups, prefix_len = None, 0
    if cfg.get("shared_prefix") is not None:
        sp = SharedPrefix.from_config(cfg["shared_prefix"], f"{where}.shared_prefix")
        groups = streams["prefix_group"].integers(0, sp.num_groups, size=n)
        prefix_len = sp.prefix_len
        prompt = prompt + prefix_len
    if cfg.get("priority") is not None:
        priorities = PriorityMix.from_config(cfg["priority"], f"{where}.priority").sample(
            n, streams["priority"]
        )
    else:
        priorities = np.zeros(n, dtype=np.int64)
    num_clipped = 0
    if max_model_len is not None:
        if prefix_len + 2 > max_model_len:
            raise ConfigError(
                f"{where}.shared_prefix.prefix_len: {prefix_len} leaves no room for a prompt and an output "
                f"within max_model_len {max_model_len}"
            )
        prompt, output, changed = clip_to_context(prompt, output, max_model_len, min_prompt=prefix_len + 1)
        num_clipped = int(changed.sum())
    return _Draws(prompt, output, priorities, groups, prefix_len, num_clipped)


# ---- workloads ---------------------------------------------------------------------------------------


@dataclass
class OpenWorkload:
    """A fixed list of requests in arrival order (synthetic open loop, or a loaded trace)."""

    specs: list[RequestSpec]
    num_clipped: int = 0
    num_skipped: int = 0  # trace rows dropped by skip_bad_rows

    def __len__(self) -> int:
        return len(self.specs)


@dataclass
class ClosedWorkload:
    """``num_clients`` clients issue ``num_requests`` requests in total, each waiting for its previous
    answer plus a think time. Lengths, groups, priorities and think times are drawn at construction and
    indexed by request number, so request ``i`` is the same under every policy (common random numbers),
    whichever client happens to send it and whenever.
    """

    num_clients: int
    num_requests: int
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    think_times: np.ndarray  # think_times[i]: pause after request i finishes, before its client's next
    priorities: np.ndarray
    groups: np.ndarray | None = None
    prefix_len: int = 0
    num_clipped: int = 0

    def _check_index(self, index: int) -> int:
        if not 0 <= index < self.num_requests:
            raise IndexError(f"request index {index} outside 0..{self.num_requests - 1}")
        return int(index)

    def spec(self, index: int, client: int, arrival_time: float) -> RequestSpec:
        """Request ``index`` as sent by ``client`` at ``arrival_time``; id ``r<index>``, session ``c<client>``."""
        i = self._check_index(index)
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} outside 0..{self.num_clients - 1}")
        rid = f"r{i}"
        p = int(self.prompt_lens[i])
        segs = None if self.groups is None else _segments(rid, int(self.groups[i]), self.prefix_len, p)
        return RequestSpec(
            request_id=rid,
            arrival_time=float(arrival_time),
            prompt_len=p,
            output_len=int(self.output_lens[i]),
            priority=int(self.priorities[i]),
            session_id=f"c{client}",
            segments=segs,
        )

    def think_time(self, index: int) -> float:
        return float(self.think_times[self._check_index(index)])


def _build_open(cfg, streams, max_model_len, base_dir) -> OpenWorkload:
    where = "workload"
    n = read_int(cfg, "num_requests", where, lo=1, hi=MAX_REQUESTS)
    kind = cfg.get("arrival", "poisson")
    if kind not in ARRIVAL_KINDS:
        raise ConfigError(f"{where}.arrival: expected one of {', '.join(ARRIVAL_KINDS)}, got {kind!r}")
    rate = read_float(cfg, "rate", where, lo=0.0, lo_open=True, allow_inf=True)
    burstiness = read_float(cfg, "burstiness", where, default=1.0, lo=0.0, lo_open=True, allow_inf=True)
    rescale = cfg.get("rescale", True)
    if not isinstance(rescale, bool):
        raise ConfigError(f"{where}.rescale: expected true or false, got {rescale!r}")
    try:
        arrivals = ArrivalConfig(kind, rate, burstiness, rescale)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    times = arrivals.sample(n, streams["arrivals"])
    d = _draw(cfg, n, streams, where, max_model_len, base_dir)
    specs = []
    for i in range(n):
        rid = f"r{i}"
        p = int(d.prompt_lens[i])
        segs = None if d.groups is None else _segments(rid, int(d.groups[i]), d.prefix_len, p)
        specs.append(
            RequestSpec(
                request_id=rid,
                arrival_time=float(times[i]),
                prompt_len=p,
                output_len=int(d.output_lens[i]),
                priority=int(d.priorities[i]),
                segments=segs,
            )
        )
    return OpenWorkload(specs, num_clipped=d.num_clipped)


def _build_closed(cfg, streams, max_model_len, base_dir) -> ClosedWorkload:
    where = "workload"
    n = read_int(cfg, "num_requests", where, lo=1, hi=MAX_REQUESTS)
    clients = read_int(cfg, "num_clients", where, lo=1)
    mean = read_float(cfg, "think_time", where, default=0.0, lo=0.0)
    dist = cfg.get("think_dist", "fixed")
    if dist == "fixed":
        think = np.full(n, mean)
    elif dist == "exponential":
        think = streams["think"].exponential(mean, size=n) if mean > 0 else np.zeros(n)
    else:
        raise ConfigError(f"{where}.think_dist: expected 'fixed' or 'exponential', got {dist!r}")
    d = _draw(cfg, n, streams, where, max_model_len, base_dir)
    return ClosedWorkload(
        clients, n, d.prompt_lens, d.output_lens, think, d.priorities, d.groups, d.prefix_len, d.num_clipped
    )


TOO_LONG = ("error", "reject", "clip")


def _build_trace(cfg, max_model_len, base_dir) -> OpenWorkload:
    """A trace file in any format workloads.tracefmt knows; loader options pass straight through.

    ``too_long`` says what a request longer than max_model_len does: "error" (default: the run stops
    with a line naming the request), "reject" (it is rejected with a reason, as vLLM answers HTTP 400),
    or "clip" (prompt and output are cut to fit).
    """
    from workloads.tracefmt import load_trace

    where = "workload"
    opts = {k: v for k, v in cfg.items() if k not in ("kind", "trace", "format", "num_requests", "too_long")}
    path = Path(str(cfg["trace"]))
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    too_long = cfg.get("too_long", "error")
    if too_long not in TOO_LONG:
        raise ConfigError(f"{where}.too_long: expected one of {', '.join(TOO_LONG)}, got {too_long!r}")
    if "num_requests" in cfg:
        opts["limit"] = read_int(cfg, "num_requests", where, lo=1, hi=MAX_REQUESTS)
    if too_long == "clip" and max_model_len is not None:
        opts["max_model_len"] = max_model_len
    fmt = cfg.get("format", "auto")
    if not isinstance(fmt, str):
        raise ConfigError(f"{where}.format: expected a format name, got {fmt!r}")
    loaded = load_trace(path, format=fmt, **opts)
    specs = list(loaded.specs)
    if too_long == "error" and max_model_len is not None:
        for spec in specs:
            if spec.prompt_len >= max_model_len:
                raise TraceFormatError(
                    f"{path}: request {spec.request_id}: prompt of {spec.prompt_len} tokens does not fit "
                    f"max_model_len {max_model_len} (set workload.too_long = \"reject\" or \"clip\")"
                )
    return OpenWorkload(specs, num_clipped=loaded.num_clipped, num_skipped=loaded.num_skipped)


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
    if kind == "trace":  # the trace loader validates its own options
        if "trace" not in cfg:
            raise ConfigError("workload.trace: required when kind = 'trace' (path to a .jsonl file)")
        return _build_trace(cfg, max_model_len, base_dir)
    if kind == "open":
        check_keys(cfg, OPEN_KEYS, "workload (open loop)")
        return _build_open(cfg, spawn_streams(seed), max_model_len, base_dir)
    if kind == "closed":
        check_keys(cfg, CLOSED_KEYS, "workload (closed loop)")
        return _build_closed(cfg, spawn_streams(seed), max_model_len, base_dir)
    if kind == "sessions":
        from workloads.gen.sessions import build_session_workload

        return build_session_workload(cfg, seed, max_model_len, base_dir=base_dir)
    raise ConfigError(f"workload.kind: expected 'open', 'closed', 'trace' or 'sessions', got {kind!r}")
