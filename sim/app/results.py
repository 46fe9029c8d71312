"""Results: a finished run's raw records → vLLM-named summary, DataFrames, time series and files.

Key names follow ``vllm bench serve --save-result`` (``vllm/benchmarks/serve.py``: ``duration``,
``completed``, ``request_goodput``, ``mean_<m>_ms``, ``p<q>_<m>_ms`` ...) so a simulated summary and a real
result JSON can be diffed key by key; the time series follows vLLM's 1-second stats log (the columns of
``data/e2e/*/timeseries.csv``). Semantics follow engines.md §1.7. Pure pandas/numpy: no SimPy here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sim.app.cost_metrics import cost_summary
from sim.app.slo import (  # noqa: F401  (re-exported: the SLO parsing callers import from here)
    LATENCY_METRICS,
    parse_slo,
    slo_from_args,
    slo_from_goodput_args,
)
from sim.app.stats import (  # noqa: F401  (weighted_percentiles is re-exported)
    clean_blocks,
    stats_ms,
    stats_ms_blocks,
    time_weighted_blocks,
    weighted_percentiles,
    weighted_percentiles_blocks,
)
from sim.app.timeseries import TIMESERIES_COLUMNS, time_series  # noqa: F401  (re-exported)
from sim.core.errors import ConfigError, ResultsIntegrityError
from sim.engine.gaps import GapTable
from sim.engine.recorder import FRAME_COLUMNS, StepTable
from sim.engine.request_log import REQUEST_COLUMNS

STEP_COLUMNS = (
    "step", "replica", "start", "duration", "num_prefill_tokens", "num_decode_tokens", "num_scheduled_tokens",
    "num_running", "num_waiting", "num_preempted", "num_finished", "kv_usage", "num_free_blocks",
)  # fmt: skip
STATUSES = ("finished", "rejected", "timed_out", "in_flight", "not_arrived")


@dataclass
class SimResult:
    """Everything a finished (or horizon-cut) simulation hands to the results layer.

    ``steps`` may be given as a StepTable (sim/engine/recorder.py): the frame is then built on first
    access, and the summary and the writers read the table's narrow columns instead (``step_columns``,
    ``step_slices``), so a run that only summarises never holds the int64 frame."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    itl_values: np.ndarray
    itl_weights: np.ndarray
    step_trace: list[dict] | None = None
    config: dict = field(default_factory=dict)
    horizon: float | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [("requests", list(self.requests.columns), REQUEST_COLUMNS)]
        s = self.__dict__["_steps"]
        checks.append(("steps", list(FRAME_COLUMNS if isinstance(s, StepTable) else s.columns), STEP_COLUMNS))
        for name, have, cols in checks:
            missing = [c for c in cols if c not in have]
            if missing:
                raise ResultsIntegrityError(f"SimResult.{name} lacks columns {missing}")
        if isinstance(self.__dict__["_itl_values"], GapTable):
            return  # built from the recorders: arrays of one length when read
        self.itl_values = np.asarray(self.itl_values, dtype=np.float64).ravel()
        self.itl_weights = np.asarray(self.itl_weights).ravel()
        if self.itl_values.shape != self.itl_weights.shape:
            raise ResultsIntegrityError(
                f"itl_values has {self.itl_values.size} entries but itl_weights {self.itl_weights.size}"
            )

    @property
    def num_steps(self) -> int:
        return len(self.__dict__["_steps"])

    def step_columns(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The named step columns' values, without building the frame when it is not built yet (counts
        may then be narrower than int64: compute with them, do not hand them out as the table). A
        given frame's columns only: an optional one it lacks is left out."""
        s = self.__dict__["_steps"]
        if isinstance(s, StepTable):
            return s.columns(tuple(names))
        return {c: s[c].to_numpy() for c in names if c in s.columns}

    def gap_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The inter-token gaps (values, weights) in consecutive blocks: ``itl_values`` / ``itl_weights``
        without building them when they are not built yet."""
        g = self.__dict__["_itl_values"]
        return g.blocks() if isinstance(g, GapTable) else iter([(self.itl_values, self.itl_weights)])

    def gap_count(self) -> int:
        """How many (value, weight) entries ``gap_blocks`` gives, without a pass over them."""
        g = self.__dict__["_itl_values"]
        return len(g) if isinstance(g, GapTable) else len(self.itl_values)

    def step_chunks(self, names: Sequence[str], rows: int = 1 << 18) -> Iterator[dict[str, np.ndarray]]:
        """``step_columns(names)`` in consecutive chunks of ``rows`` steps (a derived column is computed
        a chunk at a time)."""
        s = self.__dict__["_steps"]
        for i in range(0, len(s), rows):
            if isinstance(s, StepTable):
                yield s.columns(tuple(names), i, i + rows)
            else:
                yield {c: s[c].to_numpy()[i : i + rows] for c in names if c in s.columns}

    def step_slices(self, rows: int) -> Iterator[pd.DataFrame]:
        """The steps frame in slices of ``rows`` rows, each equal to ``steps.iloc[i : i + rows]`` (its
        index from 0 when the frame is not built: the slices are built one at a time)."""
        s = self.__dict__["_steps"]
        for i in range(0, len(s), rows):
            yield s.frame(i, i + rows) if isinstance(s, StepTable) else s.iloc[i : i + rows]

    def step_array_slices(self, rows: int) -> Iterator[dict[str, np.ndarray]]:
        """``step_slices`` as {column: array} (no frame built when the steps are still in their stores)."""
        s = self.__dict__["_steps"]
        for i in range(0, len(s), rows):
            if isinstance(s, StepTable):
                yield s.arrays(i, i + rows)
            else:
                yield {c: s[c].to_numpy()[i : i + rows] for c in s.columns}


def _get_steps(self: SimResult) -> pd.DataFrame:
    s = self.__dict__["_steps"]
    if isinstance(s, StepTable):
        _gaps(self)  # the decode runs' gaps are rebuilt from the step stores, which the frame empties
        s = self.__dict__["_steps"] = s.whole()
    return s


def _gaps(self: SimResult) -> tuple[np.ndarray, np.ndarray]:
    g = self.__dict__["_itl_values"]
    if isinstance(g, GapTable):
        self.__dict__["_itl_values"], self.__dict__["_itl_weights"] = g.arrays()
    return self.__dict__["_itl_values"], self.__dict__["_itl_weights"]


def _setter(name: str) -> Any:
    def put(self: SimResult, value: Any) -> None:
        self.__dict__[name] = value

    return put


# The dataclass fields ``steps``, ``itl_values`` and ``itl_weights``, read through properties (set after
# the class is made: a property in the class body would be the field's default): a StepTable becomes
# the frame, a GapTable the two arrays, on first access.
SimResult.steps = property(_get_steps, _setter("_steps"))  # type: ignore[assignment]
SimResult.itl_values = property(lambda self: _gaps(self)[0], _setter("_itl_values"))  # type: ignore[assignment]
SimResult.itl_weights = property(lambda self: _gaps(self)[1], _setter("_itl_weights"))  # type: ignore[assignment]


def empty_requests_frame() -> pd.DataFrame:
    """A zero-row requests frame with the right columns (for runs with no workload)."""
    return pd.DataFrame({c: pd.Series(dtype=object if c in ("request_id", "status", "finish_reason") else float)
                         for c in REQUEST_COLUMNS})  # fmt: skip


def empty_steps_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS})


# ---- per-request metrics --------------------------------------------------------------------------------
def request_metrics(requests: pd.DataFrame) -> pd.DataFrame:
    """Copy of ``requests`` with ttft_s, tpot_s, e2el_s, queue_time_s (seconds; NaN where not reached).

    Durations carry their unit (``_s``); timestamps (``arrival_time``, ``first_token_time``, ...) are
    seconds of simulated time since the start, as their ``_time`` names say.
    tpot = (finish − first token)/(num_output_tokens − 1), only for finished requests with more than one
    output token (engines.md §1.7, vllm bench semantics). ``ttft_engine_s``/``e2el_engine_s`` are always from
    the engine's arrival (vLLM's time_to_first_token / e2e_request_latency, engine side). With a
    ``[frontend]`` (``send_time`` etc. present, sim/app/frontend.py) ttft, tpot and e2el are client-side
    (send → parsed chunk, what ``vllm bench serve`` and inference-perf measure), also as
    ``ttft_client_s``/``e2el_client_s``, and ``input_path_time_s`` = engine arrival − send; queue_time_s stays
    engine-side.
    """
    df = requests.copy(deep=False)  # copy-on-write: the new columns leave ``requests`` as it is
    arrival = df["arrival_time"].astype(float)
    first = df["first_token_time"].astype(float)
    finish = df["finish_time"].astype(float)
    n_out = df["num_output_tokens"].astype(float)
    finished = df["status"] == "finished"
    df["ttft_s"] = first - arrival
    df["e2el_s"] = finish.where(finished) - arrival
    df["tpot_s"] = ((finish - first) / (n_out - 1)).where(finished & (n_out > 1))
    df["queue_time_s"] = df["scheduled_time"].astype(float) - arrival
    df["ttft_engine_s"], df["e2el_engine_s"] = df["ttft_s"], df["e2el_s"]
    if "client_first_token_time" in df.columns:
        send = df["send_time"].astype(float)
        cfirst, cfin = df["client_first_token_time"].astype(float), df["client_finish_time"].astype(float)
        df["ttft_s"] = df["ttft_client_s"] = cfirst - send
        df["e2el_s"] = df["e2el_client_s"] = cfin.where(finished) - send
        df["tpot_s"] = ((cfin - cfirst) / (n_out - 1)).where(finished & (n_out > 1))
        df["input_path_time_s"] = arrival - send
    return df


STEPS_RENAMED = {"duration": "duration_s"}  # steps_table's names for the frame's columns


def steps_table(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps as written to steps.parquet and shown by the Python API: ``duration`` (a step's length)
    becomes ``duration_s``; ``start`` stays, a timestamp in seconds like the requests' ``*_time``."""
    return steps.rename(columns=STEPS_RENAMED)


def steps_arrays(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``steps_table`` of a slice given as {column: array}."""
    return {STEPS_RENAMED.get(c, c): v for c, v in cols.items()}


def _check_counts(df: pd.DataFrame, meta: Mapping[str, Any]) -> dict[str, int]:
    """Every request is in exactly one of the five states; anything else means the engine lost one."""
    status = df["status"]
    counts = {s: int((status == s).sum()) for s in STATUSES}
    n = len(df)
    if sum(counts.values()) != n:
        bad = sorted({str(s) for s in status.unique()} - set(STATUSES))
        raise ResultsIntegrityError(f"request states {counts} add up to {sum(counts.values())}, not {n}: "
                                    f"unknown status values {bad}")  # fmt: skip
    dup = df["request_id"][df["request_id"].duplicated()]
    if len(dup):
        raise ResultsIntegrityError(f"request_id recorded twice: {list(dup.head(5))}")
    counts["not_arrived"] += int(meta.get("num_unlisted") or 0)  # never came, not listed as rows
    expected = meta.get("num_requests")
    if expected is not None and int(expected) != sum(counts.values()):
        raise ResultsIntegrityError(f"workload had {expected} requests but {n} were recorded")
    fin = _rows(df, status == "finished")
    bad_rows = fin["request_id"][~np.isfinite(fin["finish_time"].astype(float))
                                 | ~np.isfinite(fin["first_token_time"].astype(float))]  # fmt: skip
    if len(bad_rows):
        raise ResultsIntegrityError(f"finished requests without timestamps: {list(bad_rows.head(5))}")
    return counts


def _rows(df: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    """``df[mask]``, without a copy of every column when the mask keeps every row (a finished run)."""
    return df if bool(mask.all()) else df[mask]


def _good_mask(fin: pd.DataFrame, limits: Mapping[str, float]) -> np.ndarray:
    # serve.py: a request is good iff metric <= slo for every given SLO; tpot counts as 0 for <= 1 token
    tpot = fin["tpot_s"].fillna(0.0).to_numpy()
    per = {"ttft": fin["ttft_s"].to_numpy(), "tpot": tpot, "itl": tpot, "e2el": fin["e2el_s"].to_numpy()}
    good = np.ones(len(fin), dtype=bool)
    for metric, limit in limits.items():
        good &= per[metric] <= limit
    return good


# ---- summary --------------------------------------------------------------------------------------------
def _steps_end(result: SimResult) -> float:
    """When the last step ended (NaN with no steps)."""
    return max((float((c["start"] + c["duration"]).max()) for c in result.step_chunks(("start", "duration"))),
               default=float("nan"))  # fmt: skip


def _duration(df: pd.DataFrame, result: SimResult, horizon: float | None, remaining: int) -> float:
    """First arrival → last finish; the horizon instead when the run was cut with requests left."""
    arrived = df.loc[df["status"] != "not_arrived", "arrival_time"].astype(float)
    if arrived.empty:
        return 0.0
    t0 = float(arrived.min())
    if horizon is not None and remaining:
        end = float(horizon)
    else:
        ends = [float(df["finish_time"].astype(float).max(skipna=True) if len(df) else np.nan)]
        ends.append(_steps_end(result))
        ends = [e for e in ends if math.isfinite(e)]
        end = max(ends) if ends else t0
    return max(end - t0, 0.0)


def _peaks(fin: pd.DataFrame, result: SimResult) -> tuple[float, int]:
    """vllm bench's peak output tokens/s and peak concurrency over 1-s buckets from the first send.

    Token times come from the steps (decode tokens at each step's end) plus each first token. Only the
    buckets that hold something are kept (a run that idles for days would otherwise need an array of
    its seconds); the sums are of whole numbers, so exact in any order.
    """
    if fin.empty:
        return 0.0, 0
    t0 = float(fin["arrival_time"].min())
    n = int(math.ceil(float(fin["finish_time"].max()) - t0)) + 1
    keys: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for c in result.step_chunks(("start", "duration", "num_decode_tokens")):
        b = np.floor((c["start"] + c["duration"]) - t0)
        ok = (b >= 0) & (b < n)
        u, inv = np.unique(b[ok].astype(np.int64), return_inverse=True)
        keys.append(u)
        vals.append(np.bincount(inv, weights=c["num_decode_tokens"].astype(np.float64)[ok], minlength=len(u)))
    fb = np.floor(fin["first_token_time"].to_numpy(float) - t0)
    keys.append(fb[(fb >= 0) & (fb < n)].astype(np.int64))
    vals.append(np.ones(len(keys[-1])))
    _, inv = np.unique(np.concatenate(keys), return_inverse=True)
    tokens = np.bincount(inv, weights=np.concatenate(vals))
    # concurrency: +1 in a request's first bucket, -1 after its last; the running sum peaks at an event
    s = np.floor(fin["arrival_time"].to_numpy(float) - t0).astype(np.int64)
    e = np.floor(fin["finish_time"].to_numpy(float) - t0).astype(np.int64) + 1
    at, inv = np.unique(np.concatenate([s, e]), return_inverse=True)
    level = np.cumsum(np.bincount(inv, weights=np.concatenate([np.ones(len(s)), -np.ones(len(e))])))
    return float(tokens.max()) if len(tokens) else 0.0, int(level[at < n].max())


def summarize(result: SimResult, slo: Mapping[str, float] | None = None,
              percentiles: Sequence[float] = (50, 90, 95, 99)) -> dict[str, Any]:  # fmt: skip
    """The run's summary: vllm bench result keys first, then servesim's own (counts, KV, queue, SLOs)."""
    if not all(hasattr(result, a) for a in ("requests", "meta", "horizon")):  # an API caller's other object
        raise ConfigError(f"summarize: expected a run's result (servesim.run(...).raw, or what sim.app.simulate "
                          f"returns), got {type(result).__name__}")
    for q in percentiles:
        if not 0 <= float(q) <= 100:
            raise ConfigError(f"percentiles: {q} is outside [0, 100]")
    limits, pct_slos = parse_slo(slo)
    df = request_metrics(result.requests)
    counts = _check_counts(df, result.meta)
    fin = _rows(df, df["status"] == "finished")
    remaining = counts["in_flight"] + counts["not_arrived"]
    duration = _duration(df, result, result.horizon, remaining)
    completed = len(fin)
    total_in = int(fin["prompt_len"].sum())
    total_out = int(fin["num_output_tokens"].sum())

    def rate(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    good = _good_mask(fin, limits) if limits else None
    peak_tok, peak_conc = _peaks(fin, result)
    s: dict[str, Any] = {
        "num_prompts": sum(counts.values()),
        "duration": duration,
        "completed": completed,
        "failed": counts["rejected"] + counts["timed_out"],  # vllm bench / inference-perf count both
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": rate(completed),
        "request_goodput": rate(int(good.sum())) if good is not None else None,
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
        "max_output_tokens_per_s": peak_tok,
        "max_concurrent_requests": peak_conc,
    }
    qs = [float(q) for q in percentiles]
    for m in ("ttft", "tpot", "e2el"):
        s.update(stats_ms(m, fin[f"{m}_s"].to_numpy(float), qs))
    s.update(stats_ms_blocks("itl", result.gap_blocks, qs, size=result.gap_count()))  # engine-side gaps, a block at a time
    client = "ttft_client_s" in df.columns  # [frontend]: the headline ttft/tpot/e2el are client-side
    s["latency_basis"] = "client" if client else "engine"
    if client:
        for m in ("ttft_engine", "e2el_engine"):
            s.update(stats_ms(m, fin[f"{m}_s"].to_numpy(float), qs))
    # reorder to vllm's print order: ttft, tpot, itl, e2el
    for m in LATENCY_METRICS:
        for k in [k for k in s if k.endswith(f"_{m}_ms")]:
            s[k] = s.pop(k)

    s.update({f"num_{k}": v for k, v in counts.items()})
    s["num_requests"] = sum(counts.values())
    rej = df.loc[df["status"] == "rejected", "finish_reason"].fillna("unknown").astype(str)
    s["rejection_reasons"] = {str(k): int(v) for k, v in rej.value_counts().items()}
    s["num_preemptions"] = int(df["num_preemptions"].fillna(0).sum())
    if result.meta.get("num_clipped"):  # a workload's requests cut to fit max_model_len (sim/app/simulate.py)
        s["num_clipped"] = int(result.meta["num_clipped"])
    if result.meta.get("num_skipped"):  # trace rows dropped by skip_bad_rows (sim/app/simulate.py)
        s["num_skipped"] = int(result.meta["num_skipped"])
    if result.meta.get("trace_notes"):  # what the trace's loader did, one line each
        s["trace_notes"] = list(result.meta["trace_notes"])
    swap = result.meta.get("swap") or {}  # swap preemption (vLLM V0): requests copied out / back in
    s["num_swap_outs"] = int(swap.get("num_swap_outs", 0))
    s["num_swap_ins"] = int(swap.get("num_swap_ins", 0))
    s["prefix_cache_hit_rate"] = _prefix_hit_rate(df, result.meta)
    # from the stored step columns a chunk at a time (no frame, no whole-length temporaries)
    def mean(col: str) -> float | None:
        return time_weighted_blocks(result.num_steps, lambda: ((c[col], c["duration"])
                                                               for c in result.step_chunks((col, "duration"))))

    maxima = [(float(c["kv_usage"].max()), int(c["num_waiting"].max()))
              for c in result.step_chunks(("kv_usage", "num_waiting"))]  # fmt: skip
    s["mean_kv_cache_usage"] = mean("kv_usage")
    s["max_kv_cache_usage"] = max(m[0] for m in maxima) if maxima else None
    s["mean_num_running"] = mean("num_running")
    s["mean_num_waiting"] = mean("num_waiting")
    s["max_num_waiting"] = max(m[1] for m in maxima) if maxima else None
    s.update(stats_ms("queue_time", df["queue_time_s"].to_numpy(float), qs))

    s["slo"] = dict(slo) if slo else None
    s["slo_attainment"] = float(good.mean()) if good is not None and completed else None
    s["goodput"] = s["request_goodput"]
    s["slo_checks"] = _percentile_checks(pct_slos, fin, df, result) if pct_slos else None
    good_tok = int(fin["num_output_tokens"].to_numpy()[good].sum()) if good is not None else None
    s.update(cost_summary(result.config, result.meta, s, good_tok))  # sim/app/cost_metrics.py
    s["horizon"] = result.horizon
    s["config"] = result.config
    s["meta"] = result.meta
    return to_jsonable(s)


def _prefix_hit_rate(df: pd.DataFrame, meta: Mapping[str, Any]) -> float | None:
    """Token hit rate from the engine's counters (vLLM's queries/hits); else from first admissions."""
    pc = meta.get("prefix_cache")
    if isinstance(pc, Mapping) and pc.get("queries"):
        return float(pc["hits"]) / float(pc["queries"])
    admitted = df[df["num_cached_tokens"] >= 0]
    total = float(admitted["prompt_len"].sum())
    return float(admitted["num_cached_tokens"].sum()) / total if total > 0 else None


def _percentile_checks(pct_slos: Mapping[str, tuple[str, float, float]], fin: pd.DataFrame,
                       df: pd.DataFrame, result: SimResult) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per percentile SLO (``p99_ttft_ms``): its target and the run's value, both in ms, and whether met."""
    out: dict[str, dict[str, Any]] = {}
    for key, (metric, q, target) in pct_slos.items():
        if metric == "itl":
            some = any(len(v) for v, _ in clean_blocks(result.gap_blocks))
            value = float(weighted_percentiles_blocks(result.gap_blocks, [q])[0]) if some else None
        else:
            col = (df if metric == "queue_time" else fin)[f"{metric}_s"].to_numpy(float)
            col = col[np.isfinite(col)]
            value = float(np.percentile(col, q)) if col.size else None
        value = None if value is None else value * 1000.0
        out[key] = {"target": target, "value": value, "met": value is not None and value <= target}
    return out


# ---- files ----------------------------------------------------------------------------------------------
def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars → Python, NaN/inf → None, dataclasses → dicts, paths → str."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset | np.ndarray):
        return [to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str):
        return obj
    if obj is pd.NA or obj is pd.NaT:
        return None
    return str(obj)
