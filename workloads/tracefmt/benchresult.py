"""``vllm bench serve --save-result --save-detailed`` result JSON: the requests it sent and what it measured.

Keys as ``vllm/benchmarks/serve.py`` writes them (``main_async`` → ``result_json``, ``benchmark`` →
``result``): run metadata ``date``, ``backend``, ``label``, ``model_id``, ``tokenizer_id``, ``num_prompts``,
``request_rate`` (a number or the string ``"inf"``), ``burstiness``, ``max_concurrency``, optional
``ramp_up_strategy`` / ``ramp_up_start_rps`` / ``ramp_up_end_rps``, any ``--metadata KEY=VALUE`` pairs as
top-level strings; totals ``duration``, ``completed``, ``failed``, ``total_input_tokens``,
``total_output_tokens``, ``request_throughput``, ``output_throughput``, ...; ``mean_<m>_ms``,
``median_<m>_ms``, ``std_<m>_ms``, ``p<q>_<m>_ms`` for the ``--percentile-metrics`` (default ttft, tpot,
itl) at the ``--metric-percentiles`` (default 99). With ``--save-detailed`` the per-request arrays, in send
order: ``input_lens``, ``output_lens`` (0 for a failed request), ``ttfts``, ``itls`` (a list of gaps per
request), ``generated_texts``, ``errors`` ("" when it succeeded); newer versions add ``start_times``
(``time.perf_counter()`` at send), ``latencies`` (send → last chunk) and ``queue_times``.

Per request (vLLM's ``calculate_metrics``): TTFT = send → first chunk, E2E (``latency``) = send → last
chunk (older files: TTFT + Σ ITL, the same instant), TPOT = (E2E − TTFT)/(output_len − 1) for output_len
> 1, ITL = every gap between chunks. All client-side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.spec import MAX_ARRIVAL_S
from workloads.gen.lengths import MAX_LEN
from workloads.tracefmt.core import Columns, LoadedTrace, TraceOptions, finish, option_seed
from workloads.tracefmt.rows import READ_ERRORS, as_path, cannot_read, check_file, open_text

DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
MAX_TOKENS = MAX_LEN  # the bound on every token count (workloads/gen/lengths.py)
# Engine and client timestamps (start_times are time.perf_counter() seconds since boot; engine ones monotonic
# or epoch): below 2**33 s (8.6e9; the year 2242 as epoch seconds) a float64 still resolves a microsecond,
# past it a run's events collapse onto a few instants. workloads/runs/model.py checks by the same bound.
MAX_CLOCK_S = 2.0**33


def show(v: Any) -> str:
    """A value as one short line (repr escapes line breaks)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def is_bench_result(keys: set[str]) -> bool:
    """A JSON object with the totals ``vllm bench serve`` always writes."""
    return {"duration", "completed"} <= keys and bool(keys & {"request_rate", "num_prompts", "mean_ttft_ms",
                                                               "input_lens"})  # fmt: skip


def read_bench_result(path: str | Path) -> dict[str, Any]:
    """The result object; a file written with ``--append-result`` (one object per line) is refused by name."""
    path = as_path(path)
    check_file(path)
    try:
        with open_text(path) as f:
            text = f.read()
    except READ_ERRORS as e:  # not UTF-8, unreadable, a truncated .gz
        raise cannot_read(path, e) from None
    deep = f"{path}: JSON nested too deeply to read (deeper than Python's recursion limit); not a vllm bench result"
    try:
        obj = json.loads(text)
    except RecursionError:
        raise TraceFormatError(deep) from None
    except json.JSONDecodeError:
        lines = [x for x in text.splitlines() if x.strip()]
        if len(lines) > 1:
            try:
                objs = [json.loads(x) for x in lines]
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{path}: not valid JSON ({e})") from None
            except RecursionError:
                raise TraceFormatError(deep) from None
            bad = next((i for i, o in enumerate(objs) if not (isinstance(o, dict) and is_bench_result(set(o)))), None)
            if bad is not None:  # JSON lines, but not results (a servesim or Mooncake JSONL trace, say)
                o = objs[bad]
                keys = ", ".join(sorted(o)[:12]) if isinstance(o, dict) else type(o).__name__
                raise TraceFormatError(f"{path}:{bad + 1}: not a vllm bench serve result (one JSON object with "
                                       f"duration, completed and request_rate or num_prompts); found {keys}") from None
            raise TraceFormatError(f"{path}: holds {len(lines)} results (written with --append-result); "
                                   "split it into one file per result") from None
        raise TraceFormatError(f"{path}: not valid JSON") from None
    if not isinstance(obj, dict) or not is_bench_result(set(obj)):
        keys = ", ".join(sorted(obj)[:12]) if isinstance(obj, dict) else type(obj).__name__
        raise TraceFormatError(f"{path}: not a vllm bench serve result (needs duration, completed and "
                               f"request_rate or num_prompts); found {keys}")
    return obj


@dataclass(frozen=True)
class BenchRequests:
    """The per-request arrays of a detailed result, checked and in send order."""

    prompt: np.ndarray
    output: np.ndarray  # actual output tokens (0 when it failed)
    ok: np.ndarray
    ttft: np.ndarray  # seconds; NaN when it failed
    e2el: np.ndarray
    itl: list[list[float]]
    start: np.ndarray | None  # perf_counter seconds at send (newer vLLM), else None


def _float(v: Any) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _seconds(res: dict[str, Any], key: str, path: Path) -> np.ndarray:
    """A per-request array of seconds (``ttfts``, ``latencies``, ``start_times``): numbers as vLLM writes them,
    null (or NaN) where it has none; a bool or a string is refused naming its entry, not read as 1.0 or NaN."""
    out = np.empty(len(res[key]))
    for i, x in enumerate(res[key]):
        if x is None:
            out[i] = math.nan
            continue
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise TraceFormatError(f"{path}: {key}[{i}]: expected a number (seconds) or null, got {show(x)}")
        try:
            out[i] = float(x)
        except OverflowError:  # an int past a float's range: inf, refused where the value must be finite
            out[i] = math.inf
    return out


def _gaps(x: Any, i: int, ok: bool, path: Path) -> list[float]:
    """itls[i] as seconds: a list of numbers (vLLM's RequestFuncOutput.itl; [] for a 1-token output or a
    failure), each finite and >= 0 when the request succeeded (perf_counter gaps cannot be negative)."""
    if x is None and not ok:
        return []
    if not isinstance(x, list):
        raise TraceFormatError(f"{path}: itls[{i}]: expected a list of numbers (seconds between chunks), got {show(x)}")
    for j, g in enumerate(x):
        if isinstance(g, bool) or not isinstance(g, int | float):
            raise TraceFormatError(f"{path}: itls[{i}][{j}]: expected a number (seconds), got {show(g)}")
        if ok and not (math.isfinite(g) and g >= 0):
            raise TraceFormatError(f"{path}: itls[{i}][{j}]: {g} for a successful request; expected finite seconds >= 0")
    return [float(g) for g in x]


def bench_requests(res: dict[str, Any], path: Path) -> BenchRequests:
    missing = [k for k in DETAIL_KEYS if k not in res]
    if missing:
        raise TraceFormatError(f"{path}: no per-request arrays ({', '.join(missing)} missing): run vllm bench "
                               "serve with --save-result --save-detailed")
    if not isinstance(res["input_lens"], list) or not res["input_lens"]:
        got = "no requests" if isinstance(res["input_lens"], list) else type(res["input_lens"]).__name__
        raise TraceFormatError(f"{path}: input_lens: {got}; expected a list with one entry per request")
    n = len(res["input_lens"])
    for k in (*DETAIL_KEYS, *(k for k in ("start_times", "latencies") if k in res)):
        if not isinstance(res[k], list) or len(res[k]) != n:
            got = len(res[k]) if isinstance(res[k], list) else type(res[k]).__name__
            raise TraceFormatError(f"{path}: {k}: expected a list of {n} entries (one per input_lens), got {got}")
    for k in ("input_lens", "output_lens"):
        for i, x in enumerate(res[k]):
            if isinstance(x, bool) or not isinstance(x, int):
                raise TraceFormatError(f"{path}: {k}[{i}]: expected integer token counts, got {show(x)}")
            if not 0 <= x <= MAX_TOKENS:
                raise TraceFormatError(f"{path}: {k}[{i}]: expected a token count from 0 to {MAX_TOKENS}, got {x}")
    prompt = np.asarray(res["input_lens"], dtype=np.int64)
    output = np.asarray(res["output_lens"], dtype=np.int64)
    errors = res["errors"]
    for i, e in enumerate(errors):  # vLLM's RequestFuncOutput.error: "" when it succeeded, else the error text
        if e is not None and not isinstance(e, str):
            raise TraceFormatError(f"{path}: errors[{i}]: expected the error text (a string, \"\" when the request "
                                   f"succeeded) or null, got {show(e)}")
    ok = np.array([not e for e in errors], dtype=bool) & (output > 0)
    ttft = _seconds(res, "ttfts", path)
    itl = [_gaps(res["itls"][i], i, bool(ok[i]), path) for i in range(n)]
    if "latencies" in res:
        e2el = _seconds(res, "latencies", path)
    else:  # the last chunk arrives TTFT + the sum of its gaps after the send
        e2el = ttft + np.array([sum(x) for x in itl])
    for name, v in (("ttfts", ttft), ("latencies" if "latencies" in res else "ttfts + itls", e2el)):
        wrong = np.flatnonzero(ok & ~(v >= 0))  # NaN or negative for a request that succeeded
        if len(wrong):
            i = int(wrong[0])
            raise TraceFormatError(f"{path}: {name}[{i}]: {float(v[i])} for a successful request; expected seconds >= 0")
    # vLLM: TTFT = first chunk - send, latency = last chunk - send: the first chunk cannot come after the last
    late = np.flatnonzero(ok & (ttft > e2el + 1e-9))
    if len(late):
        i = int(late[0])
        raise TraceFormatError(f"{path}: ttfts[{i}]: {float(ttft[i])} s is after latencies[{i}] = {float(e2el[i])} s "
                               "(the first chunk after the last); expected ttft <= latency")
    ttft, e2el = np.where(ok, ttft, np.nan), np.where(ok, e2el, np.nan)
    start = _seconds(res, "start_times", path) if "start_times" in res else None
    if start is not None:
        bad = np.flatnonzero(~(np.isfinite(start) & (start >= 0) & (start < MAX_CLOCK_S)))
        if len(bad):
            i = int(bad[0])
            raise TraceFormatError(f"{path}: start_times[{i}]: {float(start[i])}; expected finite time.perf_counter() "
                                   f"seconds >= 0 and below {MAX_CLOCK_S:.3g} (where a float64 still resolves a "
                                   "microsecond)")
        span = float(start.max() - start.min())
        if span > MAX_ARRIVAL_S:
            raise TraceFormatError(f"{path}: start_times span {span:g} s; expected at most {MAX_ARRIVAL_S:g} s "
                                   "(the clock's range at sub-microsecond resolution)")
    if (prompt[ok] < 1).any():
        raise TraceFormatError(f"{path}: input_lens: a successful request has {int(prompt[ok].min())} tokens")
    return BenchRequests(prompt, output, ok, ttft, e2el, itl, start)


def bench_rate(res: dict[str, Any], path: Path) -> float:
    r = res.get("request_rate", "inf")
    rate = math.inf if r in ("inf", None) else _float(r)
    if not rate > 0:
        raise TraceFormatError(f"{path}: request_rate = {r!r}: expected a positive number or \"inf\"")
    return rate


def bench_arrivals(res: dict[str, Any], reqs: BenchRequests, path: Path, seed: int = 0) -> tuple[np.ndarray, str]:
    """(send times in seconds from the first send, how they were obtained). ``start_times`` when the file has
    them; else redrawn as vLLM's ``get_request`` draws them (gamma gaps of shape ``burstiness`` at
    ``request_rate``, rescaled so the last is at N / rate; ramp-up: the rate of request i moves linearly or
    exponentially from start to end RPS, no rescale) from ``seed``: vLLM's own draw used its ``--seed``,
    which the result does not record, so only the process is the same, not the instants."""
    n = len(reqs.prompt)
    b = _float(res.get("burstiness", 1.0))  # checked whether or not it is used: a malformed field is refused
    if not b > 0:
        raise TraceFormatError(f"{path}: burstiness = {res.get('burstiness')!r}: expected a number > 0")
    if reqs.start is not None and np.isfinite(reqs.start).all():
        return reqs.start - reqs.start.min(), "recorded (start_times)"
    rate = bench_rate(res, path)
    rng = np.random.default_rng(seed)
    strategy = res.get("ramp_up_strategy")
    if strategy is not None:
        lo, hi = _float(res.get("ramp_up_start_rps")), _float(res.get("ramp_up_end_rps"))
        low = 0.0 if strategy == "linear" else 1e-300  # vLLM refuses an exponential ramp from 0 RPS
        if not (lo >= low and hi >= lo) or strategy not in ("linear", "exponential"):
            raise TraceFormatError(f"{path}: ramp_up_strategy {strategy!r} with start {lo} / end {hi} RPS: "
                                   "expected linear (0 <= start <= end) or exponential (0 < start <= end)")
        prog = np.arange(n) / max(n - 1, 1)
        rates = lo + (hi - lo) * prog if strategy == "linear" else lo * (hi / lo) ** prog
        if (rates <= 0).any():
            raise TraceFormatError(f"{path}: ramp_up_start_rps = 0: the first request would wait forever")
        gaps = 1.0 / rates if math.isinf(b) else rng.standard_gamma(b, n) / (rates * b)
        return _in_range(np.cumsum(gaps), path, f"ramp_up_start_rps = {lo:g}, ramp_up_end_rps = {hi:g}"), \
            f"redrawn: {strategy} ramp-up {lo:g} -> {hi:g} req/s (seed {seed})"
    if math.isinf(rate):
        return np.zeros(n), "all at t = 0 (request_rate inf)"
    from workloads.gen.arrivals import ArrivalConfig

    kind = "constant" if math.isinf(b) else "poisson" if b == 1.0 else "gamma"
    try:
        times = ArrivalConfig(kind, rate, 1.0 if kind != "gamma" else b).sample(n, rng)
    except ConfigError as e:  # a burstiness of 1e-300: name the file and its field
        raise TraceFormatError(f"{path}: burstiness = {res.get('burstiness')!r} (request_rate = {rate:g}): {e}") from None
    return _in_range(np.asarray(times, float), path, f"request_rate = {rate:g}, burstiness = {b:g}"), \
        f"redrawn: {kind} at {rate:g} req/s, burstiness {b:g} (seed {seed})"


def _in_range(times: np.ndarray, path: Path, what: str) -> np.ndarray:
    """Redrawn send times, refused (naming the file's own setting) when they leave the clock's range."""
    if len(times) and not (np.isfinite(times) & (times <= MAX_ARRIVAL_S)).all():
        raise TraceFormatError(f"{path}: {what}: the redrawn sends reach {float(np.nanmax(times)):g} s; expected "
                               f"at most {MAX_ARRIVAL_S:g} s (the clock's range at sub-microsecond resolution)")
    return times


def read_successes(path: Path, seed: int) -> tuple[dict[str, Any], Any, np.ndarray, str]:
    """(result, its requests, their send times, how those were found) of a result with at least one
    successful request (the only ones with an output length to replay); else one line saying so."""
    res = read_bench_result(path)
    reqs = bench_requests(res, path)
    times, how = bench_arrivals(res, reqs, path, seed)
    if not reqs.ok.any():
        raise TraceFormatError(f"{path}: no successful request to replay (failed = {int((~reqs.ok).sum())})")
    return res, reqs, times, how


def load_bench_result(path: str | Path, *, seed_arrivals: int | None = None, **options: Any) -> LoadedTrace:
    """The successful requests of a result as a trace (``servesim trace stats result.json``): their prompt
    and actual output lengths at their send times (see ``bench_arrivals``). No prefix identity: the file
    has no prompt content. Arrivals that must be redrawn (no ``start_times``) use ``seed_arrivals``, by
    default the ``seed`` option (the seed of ``sample`` and of every drawn arrival)."""
    path = as_path(path)
    opts = TraceOptions.from_kwargs(options, "vllm-bench-result", ("seed_arrivals",))
    seed = opts.seed if seed_arrivals is None else option_seed("seed_arrivals", seed_arrivals)
    _, reqs, times, how = read_successes(path, seed)
    ok = reqs.ok
    cols = Columns(fmt="vllm-bench-result", source=path, num_rows=len(ok), prompt=reqs.prompt[ok],
                   output=reqs.output[ok], times=times[ok], num_failed=int((~ok).sum()),
                   notes=[f"arrivals {how}", "failed requests dropped (their output length is not recorded)"
                          if (~ok).any() else "no failed requests"])  # fmt: skip
    return finish(cols, opts)
