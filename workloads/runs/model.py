"""A real run as servesim reads it: the workload that was sent and what was measured, with what each number means.

Every importer (vllm bench result JSON, inference-perf results, per-request engine JSONL, Prometheus scrapes)
returns a :class:`RealRun`. Latency metrics are named ``<metric>_<stat>_ms`` (``ttft_mean_ms``,
``e2el_p99_ms``, ``itl_mean_ms``: vLLM's metric spellings, stat after metric) in milliseconds; throughputs
keep vLLM's keys (``request_throughput`` req/s, ``output_throughput`` tok/s); counts are ``completed`` and
``failed``. A stat the file does not give is absent, never guessed.

``basis`` says whose clock the latencies are on: ``"client"`` (send → first / last chunk parsed by the
benchmark client, what ``vllm bench serve`` and inference-perf report), ``"engine"`` (vLLM's ``/metrics``
histograms, which start when the server received the request) or ``"engine_aligned"`` (the engine's own
first / last token timestamps minus the client's send time, the two clocks aligned by the least
queued − sent lag, see ``clocks``).
``meaning`` says, per metric, exactly what the file measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError
from sim.core.fields import is_finite, missing_file, read_utf8
from sim.core.request import RequestSpec
from workloads.tracefmt.benchresult import MAX_CLOCK_S, MAX_TOKENS, show  # noqa: F401  (the importers take them from here)

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p90", "p99")
QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
THROUGHPUTS = ("request_throughput", "output_throughput")
BASES = ("client", "engine", "engine_aligned")


def metric_name(metric: str, stat: str) -> str:
    """``ttft``, ``p99`` -> ``ttft_p99_ms``."""
    return f"{metric}_{stat}_ms"


def latency_stats(metric: str, seconds: Iterable[float] | np.ndarray) -> dict[str, float]:
    """Mean and P50/P90/P99 in ms of the finite values, as ``vllm bench serve`` computes them (numpy's
    mean and linear-interpolation percentiles). Empty: {}."""
    a = np.asarray(seconds if isinstance(seconds, np.ndarray) else list(seconds), dtype=float)
    a = a[np.isfinite(a)]
    if not a.size:
        return {}
    out = {"mean": float(a.mean()), **{s: float(np.percentile(a, q)) for s, q in QUANTILES.items()}}
    return {metric_name(metric, s): 1e3 * v for s, v in out.items()}


@dataclass(frozen=True)
class Stage:
    """One load level of a run (inference-perf stages; one stage for the other formats)."""

    index: int
    rate: float | None  # offered requests/s (None: not a rate-driven load)
    duration_s: float | None
    start_s: float  # when its first request is sent, seconds from the run start
    num_requests: int


@dataclass
class RealRun:
    """A measured run: the workload as sent, the engine settings it records and what was measured.

    ``specs`` are in send order with ``arrival_time`` = the client's send time in seconds from the run
    start (empty when the format has no per-request workload: a Prometheus scrape); ``stage_of[i]`` is
    the stage of ``specs[i]``. ``measured[k]`` / ``overall``: metric name -> value (see module doc).
    ``requests``: per-request real latencies in seconds where the file has them (columns ``stage``,
    ``prompt_len``, ``output_len``, ``ttft``, ``tpot``, ``e2el``; ``send`` when known). ``itl``: the file's
    inter-token gaps in seconds (vllm bench's per-chunk gaps). ``timeseries``: ``t`` (s from the start) and
    any of ``running``, ``waiting``, ``kv_cache_pct`` (0-100), ``gen_throughput``, ``prompt_throughput``.
    ``engine``: ``[engine]`` keys in vLLM's names; ``hardware``: ``gpu`` / ``tensor_parallel_size``.
    """

    source: Path
    format: str
    basis: str
    specs: list[RequestSpec]
    stage_of: np.ndarray
    stages: list[Stage]
    measured: list[dict[str, float]]
    overall: dict[str, float]
    meaning: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    dtype: str | None = None  # vLLM --dtype as servesim spells it (bf16, fp16, ...)
    engine: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    vllm_version: str | None = None
    max_concurrency: int | None = None
    client_timeout_s: float | None = None
    arrivals: str = "recorded"  # "recorded" (the file's send times) or how they were rebuilt
    requests: pd.DataFrame | None = None
    itl: np.ndarray | None = None
    timeseries: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    # Engine-side clock alignment the real latencies were computed with (per-request engine JSONL).
    clocks: dict[str, float] = field(default_factory=dict)
    # The file the run's [engine] / [hardware] settings were read from (meta.json, exp-config.yaml, the bench
    # JSON, the last scrape): a config error about one of them names it. None: ``source``.
    settings_file: Path | None = None
    # The seed the loader drew with (a Prometheus scrape's lengths, rebuilt or redrawn arrivals); None: the
    # file gave everything, nothing was drawn. A replay's --set simulation.seed is used only where something is.
    seed: int | None = None

    def __post_init__(self) -> None:
        self.stage_of = np.asarray(self.stage_of, dtype=np.int64)
        if len(self.stage_of) != len(self.specs):
            raise ValueError(f"{len(self.specs)} specs but {len(self.stage_of)} stage indices")
        if len(self.measured) != len(self.stages):
            raise ValueError(f"{len(self.stages)} stages but {len(self.measured)} measured tables")
        if self.basis not in BASES:
            raise ValueError(f"basis {self.basis!r} not in {BASES}")

    @property
    def name(self) -> str:
        return self.source.name or str(self.source)

    def describe(self) -> dict[str, Any]:
        """What was read, for reports and ``--json``."""
        return {"source": str(self.source), "format": self.format, "basis": self.basis, "model": self.model,
                "engine": self.engine, "hardware": self.hardware, "vllm_version": self.vllm_version,
                "num_requests": len(self.specs), "arrivals": self.arrivals,
                "max_concurrency": self.max_concurrency, "client_timeout_s": self.client_timeout_s,
                "stages": [s.__dict__ for s in self.stages], "meaning": self.meaning, "notes": self.notes}  # fmt: skip


def stats_from_requests(df: pd.DataFrame, itl: np.ndarray | None = None) -> dict[str, float]:
    """The latency metrics of the successful rows of a per-request frame (seconds): TTFT and E2E over
    requests, TPOT over requests with more than one output token, ITL over the gaps when given, else the
    token-weighted per-request mean gap (mean only)."""
    out: dict[str, float] = {}
    for m in ("ttft", "tpot", "e2el"):
        if m in df.columns:
            out.update(latency_stats(m, df[m].to_numpy(float)))
    if itl is not None and len(itl):
        out.update(latency_stats("itl", itl))
    elif {"e2el", "ttft", "output_len"} <= set(df.columns):
        k = df["output_len"].to_numpy(float) > 1
        span = (df["e2el"] - df["ttft"]).to_numpy(float)[k]
        ok = np.isfinite(span)
        if ok.any():
            out["itl_mean_ms"] = 1e3 * float(span[ok].sum() / (df["output_len"].to_numpy(float)[k][ok] - 1).sum())
    return out


def check_keys(where: str, obj: Mapping[str, Any], keys: Iterable[str], what: str) -> None:
    """A TraceFormatError naming every missing key at once (and one for something that is not a mapping)."""
    if not isinstance(obj, Mapping):
        raise TraceFormatError(f"{where}: expected a mapping ({what}), got {show(obj)}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise TraceFormatError(f"{where}: missing {', '.join(missing)} ({what})")


# ---- field checks the importers share: one line naming the file, the record, the field and the value -------

# MAX_TOKENS (every token count) and MAX_CLOCK_S (every timestamp) are the trace readers' bounds; show() their
# one-line rendering of a value (workloads/tracefmt/benchresult.py)


def read_text(path: Path) -> str:
    """A run file's UTF-8 text (sim/core/fields.py read_utf8); missing, a directory, unreadable or not UTF-8
    is one line naming the file."""
    if (why := missing_file(path, "run file")) is not None:
        raise TraceFormatError(why)
    return read_utf8(path, "text", TraceFormatError)


def number(where: str, key: str, v: Any, *, lo: float | None = None, lo_open: bool = False,
           hi: float | None = None, what: str = "") -> float:  # fmt: skip
    """A finite number (not a bool) within [lo, hi] (``lo_open``: > lo), else one line naming the field."""
    ok = not isinstance(v, bool) and isinstance(v, int | float) and is_finite(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v <= hi
    if not ok:
        rng = "" if lo is None else (f" > {lo:g}" if lo_open else f" >= {lo:g}")
        rng += "" if hi is None else (f" and <= {hi:g}" if rng else f" <= {hi:g}")
        raise TraceFormatError(f"{where}: field '{key}': expected a finite number{rng}{what}, got {show(v)}")
    return float(v)


def integer(where: str, key: str, v: Any, *, lo: int = 0, hi: int = MAX_TOKENS, what: str = "") -> int:
    """An integer (an integral float too, not a bool) within [lo, hi], else one line naming the field."""
    ok = not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
    if not ok or not lo <= v <= hi:
        raise TraceFormatError(f"{where}: field '{key}': expected an integer from {lo} to {hi}{what}, got {show(v)}")
    return int(v)


def check_served_prompts(where: str, key: str, engine: Mapping[str, Any], specs: list[RequestSpec],
                         slack: int = 0) -> None:
    """A run that records its server's max_model_len served no prompt longer than it: vLLM refuses one ("The
    decoder prompt (length N) is longer than the maximum model length of M"). One that did is a file that
    contradicts itself (a wrong --metadata, or another run's), refused naming the longest prompt. Prompt plus
    output over it is not refused: an output count from re-tokenized text may run a few tokens over.
    ``slack``: tokens a prompt may run over where the counts are the client's (vllm bench counts with its own
    --tokenizer, or a random dataset's target length after decode and re-encode), not the server's; the
    replay cuts such a request to fit, in a note."""
    mml = engine.get("max_model_len")
    if isinstance(mml, bool) or not isinstance(mml, int) or mml < 1 or not specs:
        return
    s = max(specs, key=lambda r: r.prompt_len)
    if s.prompt_len > mml + slack:
        n = sum(1 for r in specs if r.prompt_len > mml + slack)
        raise TraceFormatError(f"{where}: field '{key}': {mml}, but served request {s.request_id} has a "
                               f"{s.prompt_len}-token prompt (+ {s.output_len} output tokens; {n} served prompts are "
                               f"longer than {mml + slack}); vLLM refuses a prompt longer than max_model_len, so expected the server's "
                               f"max_model_len, at least {s.prompt_len}")
