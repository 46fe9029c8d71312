"""A ``vllm bench serve --save-result --save-detailed`` result JSON as a RealRun (schema: workloads/tracefmt/
benchresult.py). One stage. Real values: the file's own aggregates (``mean_ttft_ms`` → ``ttft_mean_ms``,
``median_`` → ``p50``, ``p90_`` / ``p99_`` as given) where it has them, the rest computed from the per-request
arrays exactly as vLLM's ``calculate_metrics`` does; all client-side."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError
from sim.core.fields import is_finite
from sim.core.request import RequestSpec
from workloads.runs.model import (
    LATENCIES,
    RealRun,
    Stage,
    check_served_prompts,
    integer,
    show,
    stats_from_requests,
)
from workloads.tracefmt.benchresult import (
    bench_rate,
    read_successes,
)

# --metadata KEY=VALUE pairs that name a vLLM server setting servesim models (the result records no server
# arguments of its own): [engine] keys, and the hardware.
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "gpu_memory_utilization",
               "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling", "kv_cache_dtype",
               "num_gpu_blocks_override", "scheduling_policy")  # fmt: skip
_FILE_STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}

MEANING = {
    "ttft": "client: send -> first streamed chunk (vllm bench serve ttfts)",
    "tpot": "client: (E2E - TTFT) / (output_len - 1) per request with output_len > 1",
    "itl": "client: every gap between streamed chunks (itls, flattened)",
    "e2el": "client: send -> last chunk (latencies; older files: TTFT + sum of the request's itls)",
    "request_throughput": "completed / duration (req/s)",
    "output_throughput": "total_output_tokens / duration (tok/s)",
}


def _scalar(text: Any) -> Any:
    """A --metadata value (always a string in the file) as the number / bool it spells."""
    if not isinstance(text, str):
        return text
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _aggregate(res: dict[str, Any], key: str, path: Path) -> float | None:
    """A total or a statistic the file states (absent or null: None): a finite number >= 0, not a bool."""
    v = res.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (is_finite(v) and v >= 0):
        raise TraceFormatError(f"{path}: field {key!r}: expected a finite number >= 0, got {show(v)}")
    return float(v)


def _file_stats(res: dict[str, Any], path: Path, computed: dict[str, float], notes: list[str]) -> dict[str, float]:
    """The file's own aggregates, checked (finite, >= 0, median <= p90 <= p99), used as the real values (vLLM
    computes them over every request without an error, an empty reply included, which the arrays' stand-ins
    leave out); where one differs from servesim's recomputation by more than 0.1 %, a note says by how much."""
    out, differ = {}, []
    for m in LATENCIES:
        seen: list[tuple[str, float]] = []
        for word, stat in _FILE_STATS.items():
            v = _aggregate(res, f"{word}_{m}_ms", path)
            if v is None:
                continue
            if stat != "mean" and seen and v < seen[-1][1] * (1 - 1e-9):
                raise TraceFormatError(f"{path}: field '{word}_{m}_ms': {v:g} is below {seen[-1][0]} {seen[-1][1]:g}; "
                                       "expected median <= p90 <= p99")
            if stat != "mean":
                seen.append((f"{word}_{m}_ms", v))
            out[f"{m}_{stat}_ms"] = v
    for k in ("request_throughput", "output_throughput"):
        if (v := _aggregate(res, k, path)) is not None:
            out[k] = v
    for k, v in list(out.items()):
        c = computed.get(k)
        if c is not None and math.isfinite(c) and abs(v - c) > 1e-3 * max(abs(c), 1e-9) + 1e-9:
            differ.append(f"{_file_key(k)} {v:g} (from the arrays: {c:g})")
    if differ:
        notes.append("the file's aggregates (used) differ from servesim's recomputation from the per-request "
                     "arrays, successes with output tokens only: " + ", ".join(differ))
    return out


def _file_key(k: str) -> str:
    """``ttft_p50_ms`` -> the file's spelling ``median_ttft_ms``."""
    if not k.endswith("_ms"):
        return k
    m, stat, _ = k.rsplit("_", 2)
    return f"{next(w for w, s in _FILE_STATS.items() if s == stat)}_{m}_ms"


def _completed(res: dict[str, Any], reqs: Any, path: Path) -> None:
    """``completed`` (vLLM counts a request with no error) against the arrays: the successful rows (no error,
    output_lens > 0) up to the rows with no error; anything else is a file that contradicts itself."""
    v = res.get("completed")
    if v is None:  # a file without the total: the arrays say it
        return
    integral = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if isinstance(v, bool) or not integral or v < 0:
        raise TraceFormatError(f"{path}: field 'completed': expected an integer >= 0 (the successful requests), "
                               f"got {show(v)}")
    errors = res.get("errors")
    ok = int(reqs.ok.sum())
    no_error = int(sum(1 for e in errors if not e)) if isinstance(errors, list) else len(reqs.ok)
    if not ok <= v <= no_error:
        raise TraceFormatError(f"{path}: field 'completed': {int(v)}, but the per-request arrays hold {ok} successful "
                               "requests (errors \"\" and output_lens > 0); expected the same count")


def _tensor_parallel(res: dict[str, Any], path: Path) -> dict[str, Any]:
    """The hardware the --metadata names: ``gpu`` (a string) and ``tensor_parallel_size`` / ``tp`` (an integer
    >= 1; both given: the same)."""
    out: dict[str, Any] = {}
    if "gpu" in res:
        if not isinstance(res["gpu"], str):
            raise TraceFormatError(f"{path}: field 'gpu': expected a GPU name (a string), got {show(res['gpu'])}")
        out["gpu"] = res["gpu"]
    for k in ("tensor_parallel_size", "tp"):
        if k not in res:
            continue
        tp = integer(str(path), k, _scalar(res[k]), lo=1, hi=4096)
        if out.get("tensor_parallel_size", tp) != tp:
            raise TraceFormatError(f"{path}: field 'tp': {show(res['tp'])} but 'tensor_parallel_size' "
                                   f"{show(res['tensor_parallel_size'])}; expected one value (or only one key)")
        out["tensor_parallel_size"] = tp
    return out


def _duration(res: dict[str, Any], path: Path) -> float:
    """``duration``: the benchmark's perf_counter span (vLLM's ``benchmark_duration``), always > 0 in a real file."""
    v = res.get("duration")
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
        raise TraceFormatError(f"{path}: field 'duration': expected the benchmark's length in seconds (a number > 0), "
                               f"got {show(v)}")
    return float(v)


def _max_concurrency(res: dict[str, Any], path: Path) -> int | None:
    """``max_concurrency``: vllm bench --max-concurrency, an integer >= 1, or null when not given."""
    v = res.get("max_concurrency")
    if v is None:
        return None
    integral = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
    if isinstance(v, bool) or not isinstance(v, int | float) or not integral or v < 1:
        raise TraceFormatError(f"{path}: field 'max_concurrency': expected an integer >= 1 (vllm bench "
                               f"--max-concurrency) or null, got {show(v)}")
    return int(v)


def load_vllm_bench_run(path: str | Path, seed: int = 0) -> RealRun:
    path = Path(path)
    res, reqs, times, how = read_successes(path, seed)
    ok = reqs.ok
    order = np.flatnonzero(ok)
    order = order[np.argsort(times[order], kind="stable")]
    specs = [RequestSpec(request_id=str(i), arrival_time=float(times[i]), prompt_len=int(reqs.prompt[i]),
                         output_len=int(reqs.output[i])) for i in order]  # fmt: skip
    df = pd.DataFrame({"request_id": [str(i) for i in order], "stage": 0, "send": times[order],
                       "prompt_len": reqs.prompt[order], "output_len": reqs.output[order],
                       "ttft": reqs.ttft[order], "e2el": reqs.e2el[order]})  # fmt: skip
    out = df["output_len"].to_numpy(float)
    df["tpot"] = np.where(out > 1, (df["e2el"] - df["ttft"]) / np.maximum(out - 1, 1), np.nan)
    itl = np.asarray([g for i in order for g in reqs.itl[i]], float)
    measured = stats_from_requests(df, itl)
    dur = _duration(res, path)
    _completed(res, reqs, path)
    measured["completed"] = float(ok.sum())  # failures are not replayed, so not compared (see notes)
    measured.update(request_throughput=float(ok.sum()) / dur, output_throughput=float(out.sum()) / dur)
    notes = [f"arrivals {how}", "no prompt content in the file: prompts replayed as unique (no prefix hits)"]
    measured.update(_file_stats(res, path, measured, notes))  # the file's own numbers where they agree
    engine = {k: _scalar(res[k]) for k in ENGINE_KEYS if k in res}
    if isinstance(engine.get("max_model_len"), str):  # vLLM's spellings of the flag: 32k, 1K, auto
        from sim.core.fields import max_model_len

        engine["max_model_len"] = max_model_len(engine["max_model_len"], f"{path}: --metadata max_model_len")
    mml = engine.get("max_model_len")  # client-side counts: a few tokens over are the tokenizers' difference
    slack = max(16, mml // 100) if isinstance(mml, int) and not isinstance(mml, bool) else 0
    check_served_prompts(str(path), "max_model_len", engine, specs, slack=slack)
    hardware = _tensor_parallel(res, path)
    rate = bench_rate(res, path)
    mc = _max_concurrency(res, path)
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} failed requests not replayed (their output length is not recorded)")
    if not engine:
        notes.append("the result records no server arguments: servesim's [engine] defaults unless --set "
                     "(or vllm bench --metadata max_num_seqs=... gpu=...)")
    stage = Stage(0, None if math.isinf(rate) else rate, dur, 0.0, len(specs))
    return RealRun(
        source=path, format="vllm-bench", basis="client", specs=specs, stage_of=np.zeros(len(specs)),
        stages=[stage], measured=[dict(measured)], overall=dict(measured), meaning=dict(MEANING),
        model=res.get("model_id") or res.get("tokenizer_id"), engine=engine, hardware=hardware,
        vllm_version=str(res["vllm_version"]) if "vllm_version" in res else None,
        max_concurrency=mc,
        arrivals="recorded" if how.startswith("recorded") else how,
        requests=df, itl=itl, notes=notes, settings_file=path, seed=seed if how.startswith("redrawn") else None,
    )  # fmt: skip
