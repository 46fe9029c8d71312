"""Per-request JSONL with engine timestamps (LLMServingSim's vLLM harness; ../shared/data/e2e/rtx4090-*/) as a
RealRun.

``requests.jsonl``: one object per request with ``input_toks``, ``output_toks``, ``arrival_time`` (the
client's wall clock when it sent the request) and the engine's monotonic ``queued_ts``, ``scheduled_ts``,
``first_token_ts``, ``last_token_ts``. Optional beside it: ``meta.json`` (``model``, ``vllm_version``,
``engine_kwargs``, ``kv_cache``, ``hardware.device_name``), ``timeseries.csv`` (vLLM's 1-second stats:
``t``, ``prompt_throughput``, ``gen_throughput``, ``running``, ``waiting``, ``kv_cache_pct``) and the
workload file as sent (``workload-*.jsonl``: ``input_toks``, ``output_toks``, ``arrival_time_ns`` from the
benchmark start, ``input_tok_ids``: real token ids, so prefix sharing is real).

Clocks. The engine clock = the client clock + min(queued_ts − arrival_time) over requests (the request
that reached an idle engine with the least front-end delay); with a workload file the run starts at
mean(arrival_time − scheduled send) on the client clock, else at the first send. TTFT = first token
(engine, aligned) − send, E2E = last token − send, TPOT = (last − first)/(output − 1): engine-side
timestamps against the client's send ("engine_aligned"); the replay aligns its own engine times the same
way.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import ServesimError, TraceFormatError
from sim.core.fields import load_json
from sim.core.request import RequestSpec
from sim.core.spec import MAX_ARRIVAL_S
from workloads.runs.model import (
    MAX_CLOCK_S,
    RealRun,
    Stage,
    check_served_prompts,
    integer,
    number,
    read_text,
    show,
    stats_from_requests,
)

FIELDS = ("input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts", "first_token_ts",
          "last_token_ts")  # fmt: skip
MEANING = {
    "ttft": "engine first-token timestamp (aligned to the client clock) - client send",
    "tpot": "(last token - first token) / (output_toks - 1), engine timestamps",
    "itl": "token-weighted mean of the same gaps (mean only)",
    "e2el": "engine last-token timestamp (aligned) - client send",
    "timeseries": "vLLM's 1-second stats log (timeseries.csv): running, waiting, kv_cache_pct",
}
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "auto": "auto", "fp8": "fp8", "float": "fp32",
           "float32": "fp32"}  # vLLM's --dtype values


def is_engine_jsonl(path: Path) -> bool:
    """A JSONL file (or a directory with requests.jsonl) whose first row has the engine timestamps."""
    f = path / "requests.jsonl" if path.is_dir() else path
    if not f.is_file():
        return False
    try:
        with open(f, "rb") as fh:  # only the first row is decoded: a bad byte further on is the loader's to name
            first = next((ln for ln in fh if ln.strip()), b"")
        obj = json.loads(first.decode("utf-8", errors="replace"))
        return isinstance(obj, dict) and set(FIELDS) <= set(obj)
    except (json.JSONDecodeError, RecursionError, TypeError, OSError):
        return False


TOKENS = ("input_toks", "output_toks")
TIMES = ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
# vLLM's RequestStateStats on the engine-core clock: queued, then first scheduled, then first and last token
ENGINE_ORDER = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def _row(obj: Any, where: str) -> dict[str, Any]:
    """One request, checked: token counts >= 1 (a request that produced no token has no first_token_ts),
    timestamps finite and in the clock's range, the engine's four in the order vLLM stamps them."""
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object (one request), got {show(obj)}")
    missing = [k for k in FIELDS if not isinstance(obj.get(k), int | float)]  # a bool is refused below, by name
    if missing:
        raise TraceFormatError(f"{where}: missing or non-numeric {', '.join(missing)} "
                               f"(per-request engine timestamps need {', '.join(FIELDS)})")
    for k in TOKENS:
        integer(where, k, obj[k], lo=1, what=" (tokens)")
    for k in TIMES:
        number(where, k, obj[k], lo=-MAX_CLOCK_S, hi=MAX_CLOCK_S, what=" (seconds, where a float64 resolves a microsecond)")
    for a, b in pairwise(ENGINE_ORDER):
        if obj[b] < obj[a]:
            raise TraceFormatError(f"{where}: field '{b}': {obj[b]} is before {a} {obj[a]}; expected "
                                   f"{' <= '.join(ENGINE_ORDER)} (vLLM's engine timestamps)")
    return obj


def _rows(path: Path) -> pd.DataFrame:
    rows = []
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory; expected per-request JSONL")
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read it ({e.strerror or e})") from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceFormatError(f"{path}:{lineno}: not UTF-8 text (byte {e.start}: {e.reason})") from None
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            except RecursionError:
                raise TraceFormatError(f"{path}:{lineno}: JSON nested too deeply to read") from None
            rows.append(_row(obj, f"{path}:{lineno}"))
    if not rows:
        raise TraceFormatError(f"{path}: no requests")
    df = pd.DataFrame(rows)
    for k in TOKENS:  # integral floats (12.0) as the integers they are
        df[k] = df[k].astype(np.int64)
    span = float(df["arrival_time"].max() - df["arrival_time"].min())
    if span > MAX_ARRIVAL_S:
        raise TraceFormatError(f"{path}: arrival_time spans {span:g} s; expected at most {MAX_ARRIVAL_S:g} s (the "
                               "clock's range at sub-microsecond resolution)")
    return df


def _table(meta: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = meta.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise TraceFormatError(f"{where}: field '{key}': expected a mapping or null, got {show(v)}")
    return v


def _meta(path: Path) -> dict[str, Any]:
    """meta.json beside requests.jsonl ({} when there is none): a mapping whose tables are mappings."""
    if not path.exists():
        return {}
    meta = load_json(path, "run metadata", TraceFormatError)
    if not isinstance(meta, dict):
        raise TraceFormatError(f"{path}: expected a JSON object (the run's metadata), got {show(meta)}")
    for key in ("engine_kwargs", "kv_cache", "hardware"):
        _table(meta, key, str(path))
    for key in ("model", "vllm_version"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise TraceFormatError(f"{path}: field '{key}': expected a string, got {show(meta[key])}")
    ek, kv, hw = (_table(meta, k, str(path)) for k in ("engine_kwargs", "kv_cache", "hardware"))
    if ek.get("model") is not None and not isinstance(ek["model"], str):
        raise TraceFormatError(f"{path}: field 'engine_kwargs.model': expected a string, got {show(ek['model'])}")
    if "tensor_parallel_size" in ek:
        integer(str(path), "engine_kwargs.tensor_parallel_size", ek["tensor_parallel_size"], lo=1, hi=4096)
    if kv.get("num_gpu_blocks") is not None:
        integer(str(path), "kv_cache.num_gpu_blocks", kv["num_gpu_blocks"], lo=1, hi=2**40)
    if ek.get("dtype") is not None and (not isinstance(ek["dtype"], str) or ek["dtype"].lower() not in _DTYPES):
        raise TraceFormatError(f"{path}: field 'engine_kwargs.dtype': got {show(ek['dtype'])}; expected one of "
                               f"{', '.join(_DTYPES)} (the vLLM --dtype values servesim models)")
    if hw.get("device_name") is not None and not isinstance(hw["device_name"], str):
        raise TraceFormatError(f"{path}: field 'hardware.device_name': expected a string, got {show(hw['device_name'])}")
    return meta


# The server settings servesim models, by vLLM's engine-arg names (the same as vllm_bench.ENGINE_KEYS), in the
# order the replay's settings show them.
SERVER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_dtype", "block_size",
               "gpu_memory_utilization", "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
               "scheduling_policy", "num_gpu_blocks_override")  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    """One value (a bool is not the number 1)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


# Settings vLLM may change at start-up from what it was given (a block size the attention backend needs, as
# FlashMLA's 64; prefix caching off where the model does not support it): kv_cache holds the one it ran with.
RESOLVED_AT_START = ("block_size", "enable_prefix_caching")
# Values that ask vLLM to choose at start-up (max_model_len -1: the longest that fits; kv_cache_dtype auto:
# the model's): a resolved value beside one is what it ran with, not a contradiction.
_SOLVE: dict[str, Any] = {"max_model_len": -1, "kv_cache_dtype": "auto"}


def _server_settings(meta: dict[str, Any], path: Path, notes: list[str]) -> dict[str, Any]:
    """The server settings servesim models (SERVER_KEYS), from ``engine_kwargs`` (the arguments the engine
    was built with) and ``kv_cache`` (what it resolved; its ``num_gpu_blocks`` is the pool vLLM measured,
    replayed as ``num_gpu_blocks_override``, which vLLM takes as given). A null is vLLM's default, so not a
    setting. Both places with two values: for RESOLVED_AT_START the one vLLM ran with (kv_cache), said in a
    note; for the rest a file that contradicts itself, refused naming both."""
    ek, kv = meta.get("engine_kwargs") or {}, dict(meta.get("kv_cache") or {})
    if kv.get("num_gpu_blocks") is not None:
        kv["num_gpu_blocks_override"] = int(kv["num_gpu_blocks"])
    engine: dict[str, Any] = {}
    for k in SERVER_KEYS:
        a, b = ek.get(k), kv.get(k)
        if a is not None and b is not None and _SOLVE.get(k) == a:  # asked vLLM to resolve it: the resolved one, said
            notes.append(f"meta.json: engine_kwargs.{k} {show(a)}, resolved to {show(b)} (kv_cache.{k}): replayed")
            a = None
        if a is not None and b is not None and not _same(a, b):
            kb = "kv_cache.num_gpu_blocks" if k == "num_gpu_blocks_override" else f"kv_cache.{k}"
            if k not in RESOLVED_AT_START:
                raise TraceFormatError(f"{path}: field 'engine_kwargs.{k}' is {show(a)} but '{kb}' is {show(b)}; "
                                       "expected one value (vLLM runs with the one it is given)")
            notes.append(f"meta.json: engine_kwargs.{k} {show(a)} but {kb} {show(b)} (vLLM changed it at start-up): "
                         "the one it ran with replayed")
        if a is not None or b is not None:
            engine[k] = b if b is not None else a
    _resolved_scheduler(meta, path, engine, notes)
    return engine


# resolved_config.scheduler_config (vLLM's SchedulerConfig as the engine ran it, defaults filled in) -> the
# engine-arg names servesim takes: what a run that left them unset ran with (its version's defaults, which
# may not be the card defaults servesim would pick), or what vLLM changed at start-up.
RESOLVED_SCHEDULER = {"max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                      "enable_chunked_prefill": "enable_chunked_prefill", "async_scheduling": "async_scheduling",
                      "policy": "scheduling_policy"}  # fmt: skip


def _resolved_scheduler(meta: dict[str, Any], path: Path, engine: dict[str, Any], notes: list[str]) -> None:
    """Fill ``engine`` from ``resolved_config.scheduler_config`` where it has a value: the resolved one wins
    over the given one (said in a note where they differ). A table of another shape is ignored: the field is
    vLLM's dump of its config, not a format of its own."""
    rc = meta.get("resolved_config")
    sc = rc.get("scheduler_config") if isinstance(rc, dict) else None
    if not isinstance(sc, dict):
        return
    for src, k in RESOLVED_SCHEDULER.items():
        v = sc.get(src)
        if v is None:
            continue
        if k in ("enable_chunked_prefill", "async_scheduling") and not isinstance(v, bool):
            raise TraceFormatError(f"{path}: field 'resolved_config.scheduler_config.{src}': expected true or false, "
                                   f"got {show(v)}")
        if k in ("max_num_seqs", "max_num_batched_tokens"):
            v = integer(str(path), f"resolved_config.scheduler_config.{src}", v, lo=1, hi=2**31 - 1)
        if k == "scheduling_policy" and v not in ("fcfs", "priority"):
            raise TraceFormatError(f"{path}: field 'resolved_config.scheduler_config.policy': got {show(v)}; "
                                   "expected fcfs or priority")
        if k in engine and not _same(engine[k], v):
            notes.append(f"meta.json: {k} {show(engine[k])} given, {show(v)} resolved (the one vLLM ran with, replayed)")
        engine[k] = v


TS_NUMERIC = ("t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct")
TS_RANGE = {"kv_cache_pct": 100.0}  # a percentage; the others are counts or rates: finite and >= 0


def _timeseries(path: Path) -> pd.DataFrame | None:
    """timeseries.csv beside requests.jsonl (None when there is none): a 't' column and numeric gauges."""
    if not path.exists():
        return None
    text = read_text(path)
    if not text.strip():
        raise TraceFormatError(f"{path}: empty; expected a header with 't' and vLLM's stats columns "
                               f"({', '.join(TS_NUMERIC[1:])})")
    import io

    try:
        ts = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise TraceFormatError(f"{path}: not valid CSV ({str(e).strip().splitlines()[0] if str(e).strip() else e!r})") from None
    if "t" not in ts.columns:
        raise TraceFormatError(f"{path}: no 't' column (seconds from the start)")
    for col in (c for c in TS_NUMERIC if c in ts.columns):
        num = pd.to_numeric(ts[col], errors="coerce")
        bad = np.flatnonzero(num.isna().to_numpy() & ts[col].notna().to_numpy())
        if col == "t":
            bad = np.flatnonzero(~np.isfinite(num.to_numpy(float)))
        if len(bad):
            i = int(bad[0])
            raise TraceFormatError(f"{path}: row {i + 1}: field '{col}': expected a number, got {show(ts[col].iloc[i])}")
        v = num.to_numpy(float)
        hi = TS_RANGE.get(col, np.inf)
        out = np.flatnonzero(~np.isnan(v) & ~((v >= 0) & (v <= hi) & np.isfinite(v))) if col != "t" else []
        if len(out):
            i = int(out[0])
            raise TraceFormatError(f"{path}: row {i + 1}: field '{col}': got {v[i]:g}; expected a finite number >= 0"
                                   + (f" and <= {hi:g}" if np.isfinite(hi) else "") + " (or empty)")
        ts[col] = num
    return ts


def _workload_file(d: Path, req: pd.DataFrame) -> Path | None:
    for p in sorted(d.glob("workload*.jsonl")):
        try:
            with open(p, "rb") as fh:
                n = sum(1 for ln in fh if ln.strip())
        except OSError:
            continue
        if n == len(req):
            return p
    return None


def load_engine_jsonl(path: str | Path, seed: int = 0) -> RealRun:
    """``seed`` is accepted for a uniform loader signature; nothing here is random (the arrivals are recorded)."""
    path = Path(path)
    f = path / "requests.jsonl" if path.is_dir() else path
    d = f.parent
    req = _rows(f)
    notes: list[str] = []
    wl_path = _workload_file(d, req)
    if wl_path is not None:
        from workloads.tracefmt import load_vllm_bench

        try:
            wl = load_vllm_bench(wl_path)
        except ServesimError as e:  # its reader's message, with the file it read in front
            raise (e if str(wl_path) in str(e) else type(e)(f"{wl_path}: {e}")) from None
        wl_rows = pd.DataFrame([json.loads(x) for x in wl_path.read_text().splitlines() if x.strip()])
        for col in ("input_toks", "output_toks", "arrival_time_ns"):
            if col not in wl_rows:
                raise TraceFormatError(f"{wl_path}: no '{col}' field; expected the workload as sent (input_toks, "
                                       "output_toks, arrival_time_ns per request)")
        # The prompts sent are the prompts served: a row that differs is another run's workload file. Outputs
        # may differ (a stop string, EOS without ignore_eos, max_model_len): the engine's are replayed, and said.
        diff = np.flatnonzero(wl_rows["input_toks"].to_numpy() != req["input_toks"].to_numpy())
        if len(diff):
            i = int(diff[0])
            raise TraceFormatError(f"{wl_path}: row {i + 1}: input_toks {wl_rows['input_toks'].iloc[i]} but {f} row "
                                   f"{i + 1} has {req['input_toks'].iloc[i]} ({len(diff)} rows differ); expected the "
                                   "workload this run was sent, row by row")
        send = wl_rows["arrival_time_ns"].to_numpy(float) / 1e9
        specs = sorted(wl.specs, key=lambda s: int(s.request_id))  # ids are row numbers: requests.jsonl order
        served = req["output_toks"].to_numpy()
        short = np.flatnonzero(wl_rows["output_toks"].to_numpy() != served)
        if len(short):
            specs = [s if s.output_len == max(int(o), 1) else replace(s, output_len=max(int(o), 1))
                     for s, o in zip(specs, served, strict=True)]
            notes.append(f"{len(short)} requests generated another output length than the workload asked for: the "
                         "engine's (requests.jsonl output_toks) replayed")
        notes.append(f"workload {wl_path.name}: scheduled send times and token ids (prefix sharing as sent)")
    else:
        send = None
        notes.append("no workload file beside it: prompts replayed as unique; send times from arrival_time")
    offset = float((req.queued_ts - req.arrival_time).min())  # engine clock - client clock
    t0 = float((req.arrival_time - send).mean()) if send is not None else float(req.arrival_time.min())
    sent = req.arrival_time.to_numpy(float) - t0  # when the client actually sent it, on the run's clock
    if send is None:
        specs = [RequestSpec(request_id=str(i), arrival_time=float(t), prompt_len=int(p), output_len=max(int(o), 1))
                 for i, (t, p, o) in enumerate(zip(sent, req.input_toks, req.output_toks, strict=True))]  # fmt: skip

    def eng(col: str) -> np.ndarray:
        return req[col].to_numpy(float) - offset - t0

    out = req.output_toks.to_numpy(float)
    df = pd.DataFrame({"request_id": [s.request_id for s in specs], "stage": 0, "send": sent,
                       "prompt_len": req.input_toks.to_numpy(), "output_len": req.output_toks.to_numpy(),
                       "queued": eng("queued_ts"), "first": eng("first_token_ts"), "last": eng("last_token_ts")})
    df["ttft"] = df["first"] - df["send"]
    df["e2el"] = df["last"] - df["send"]
    df["tpot"] = np.where(out > 1, (df["last"] - df["first"]) / np.maximum(out - 1, 1), np.nan)
    lag = df["queued"] - df["send"]
    clocks = {"engine_minus_client_s": offset, "client_start_s": t0,
              "frontend_lag_mean_ms": 1e3 * float(lag.mean()), "frontend_lag_max_ms": 1e3 * float(lag.max())}
    if send is not None:
        clocks["send_jitter_ms"] = 1e3 * float(np.abs(sent - send).max())
    measured = stats_from_requests(df)
    dur = float(df["last"].max() - min(df["send"].min(), 0.0))
    if not dur > 0:
        raise TraceFormatError(f"{f}: the run spans {dur:g} s (no last_token_ts after the first send); expected "
                               "the engine's timestamps to move on from the client's sends")
    measured.update(completed=float(len(df)), failed=0.0, request_throughput=len(df) / dur,
                    output_throughput=float(out.sum()) / dur)  # fmt: skip
    meta = _meta(d / "meta.json")
    ek = meta.get("engine_kwargs") or {}
    engine = _server_settings(meta, d / "meta.json", notes)
    mml_key = "engine_kwargs.max_model_len" if ek.get("max_model_len") is not None else "kv_cache.max_model_len"
    check_served_prompts(str(d / "meta.json"), mml_key, engine, specs)
    hardware = {}
    if (meta.get("hardware") or {}).get("device_name"):
        hardware["gpu"] = meta["hardware"]["device_name"]
    if "tensor_parallel_size" in ek:
        hardware["tensor_parallel_size"] = int(ek["tensor_parallel_size"])
    if not meta:
        notes.append("no meta.json beside it: servesim's [engine] defaults unless --set")
    ts = _timeseries(d / "timeseries.csv")
    return RealRun(
        source=path, format="engine-jsonl", basis="engine_aligned", specs=specs, stage_of=np.zeros(len(specs)),
        stages=[Stage(0, None, dur, 0.0, len(specs))], measured=[dict(measured)], overall=dict(measured),
        meaning=dict(MEANING), model=meta.get("model") or ek.get("model"),
        dtype=_DTYPES.get(str(ek.get("dtype", "")).lower()) if ek.get("dtype") else None, engine=engine,
        hardware=hardware, vllm_version=meta.get("vllm_version"),
        arrivals="recorded" if wl_path is not None else "recorded (arrival_time)", requests=df,
        timeseries=ts, notes=notes, clocks=clocks, settings_file=d / "meta.json" if meta else None,
    )  # fmt: skip
