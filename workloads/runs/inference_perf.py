"""An inference-perf results directory as a RealRun.

Layout (inference-perf writes it; four examples in ../shared/data/e2e/h100-llama-2-7b-vllm-0.15/raw/):
``results/config.yaml`` (the resolved load profile), ``results/stage_<k>_lifecycle_metrics.json`` (per stage)
and ``results/summary_lifecycle_metrics.json`` (the whole run), optionally
``results/per_request_lifecycle_metrics.json`` (one record per request: ``stage_id``, ``start_time``,
``end_time``, ``info`` with the token counts and ``output_token_times``, ``error``), and an ``exp-config.yaml``
beside ``results/`` with the vLLM server's arguments (``model``, ``tensor_parallelism``, ``max_num_seqs``, ...).

The workload, when there are no per-request records (data/README.md, cases.json ``measurement_notes``):

* arrivals: ``load.type = constant``: stage k sends ``rate_k × duration_k`` requests evenly spaced at
  ``1/rate_k``, stages back to back; ``poisson``: exponential gaps at the rate (seed 0: the real draw is
  not recorded);
* ``data.type = shared_prefix``: ``num_groups × num_prompts_per_group`` prompts are made once (a system
  prompt per group, then a question); request i sends prompt ``perm[i mod n]`` of one shuffle (seed 0), so
  whole prompts repeat. The prompt length is the measured mean (``successes.prompt_len.mean``: the client's
  re-tokenized count, BOS included), split between system prompt and question in the configured ratio;
  other data types: every prompt is the measured mean length, unique;
* outputs: ``output_len`` tokens when ``server.ignore_eos`` (the measured ``output_len`` is the client's
  re-tokenized count, lower), else the measured mean;
* clients give up after ``load.request_timeout`` s, or 300 s when it is null (aiohttp's ClientTimeout
  total=300; the real failures land at 300.0-301.0 s).

Metrics (client-side): TTFT = send → first chunk, E2E = send → last chunk (``request_latency``), TPOT and
ITL = (E2E − TTFT)/(output_len − 1) (mean only: inference-perf's own ``time_per_output_token`` and
``inter_token_latency`` are per SSE chunk, kept as ``tpot_chunk_*`` / ``itl_chunk_*``, with no simulated
counterpart).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError
from sim.core.fields import MAX_REQUESTS, load_json
from sim.core.request import RequestSpec
from workloads.runs.model import (
    MAX_CLOCK_S,
    MAX_TOKENS,
    RealRun,
    Stage,
    check_keys,
    integer,
    number,
    read_text,
    show,
    stats_from_requests,
)

CLIENT_TIMEOUT_S = 300.0  # aiohttp ClientTimeout(total=300), inference-perf's default with request_timeout null
_STAGE_FILE = re.compile(r"^stage_(\d+)_lifecycle_metrics\.json$")
_STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}
# exp-config.yaml key -> [engine] key (vLLM's names; tensor_parallelism is the harness's spelling)
_ENGINE = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "gpu_memory_utilization",
           "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling", "kv_cache_dtype",
           "num_gpu_blocks_override")  # fmt: skip
MEANING = {
    "ttft": "client: send -> first streamed chunk (time_to_first_token)",
    "e2el": "client: send -> last chunk (request_latency)",
    "tpot": "client: (E2E - TTFT) / (output_len - 1), mean only (the file's own TPOT is per SSE chunk)",
    "itl": "client: as TPOT (one token per gap on average), mean only",
    "request_throughput": "successes.throughput.requests_per_sec",
    "output_throughput": "output_len x requests_per_sec with ignore_eos (the file's count is re-tokenized)",
}


def is_results_dir(path: Path) -> bool:
    d = results_dir(path)
    return d is not None


def results_dir(path: Path) -> Path | None:
    for d in (path, path / "results"):
        if d.is_dir() and (d / "config.yaml").is_file() and any(_STAGE_FILE.match(p.name) for p in d.iterdir()):
            return d
    return None


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    text = read_text(path)
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TraceFormatError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise TraceFormatError(f"{path}: YAML nested too deeply to read (deeper than Python's recursion limit)") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{path}: expected a mapping at the top, got {type(obj).__name__}")
    return obj


def _json(path: Path) -> Any:
    return load_json(path, "inference-perf result", TraceFormatError)


def _mapping(where: str, key: str, v: Any) -> dict[str, Any]:
    """A table that may be null (then {}), else must be a mapping."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise TraceFormatError(f"{where}: field '{key}': expected a mapping or null, got {show(v)}")
    return v


def _stage_load(where: str, st: Any, required: bool) -> tuple[float | None, float | None]:
    """(rate, duration) of a load stage: inference-perf's StandardLoadStage has rate > 0 (QPS) and
    duration > 0 (s). ``required``: both must be there (the arrivals are rebuilt from them)."""
    if not isinstance(st, dict):
        raise TraceFormatError(f"{where}: expected a mapping (a load stage), got {show(st)}")
    if required:
        check_keys(where, st, ("rate", "duration"), "stage")
    rate = number(where, "rate", st["rate"], lo=0.0, lo_open=True, what=" (requests/s)") \
        if st.get("rate") is not None else None
    dur = number(where, "duration", st["duration"], lo=0.0, lo_open=True, what=" (seconds)") \
        if st.get("duration") is not None else None
    return rate, dur


def _latency_block(where: str, succ: dict[str, Any], out_len: float | None) -> dict[str, float]:
    succ = _mapping(where, "successes", succ)
    lat = _mapping(where, "successes.latency", succ.get("latency"))
    check_keys(where, lat, ("time_to_first_token", "request_latency"), "successes.latency")
    out: dict[str, float] = {}
    for src, m in (("time_to_first_token", "ttft"), ("request_latency", "e2el"),
                   ("time_per_output_token", "tpot_chunk"), ("inter_token_latency", "itl_chunk")):
        block = _mapping(where, f"successes.latency.{src}", lat.get(src))
        last: tuple[str, float] | None = None
        for word, stat in _STATS.items():
            if block.get(word) is None:
                continue
            key = f"successes.latency.{src}.{word}"
            v = number(where, key, block[word], lo=0.0, what=" (seconds)")
            if stat != "mean":  # median <= p90 <= p99
                if last is not None and v < last[1] * (1 - 1e-9):
                    raise TraceFormatError(f"{where}: field '{key}': {v:g} is below {last[0]} {last[1]:g}; "
                                           "expected median <= p90 <= p99")
                last = (word, v)
            out[f"{m}_{stat}_ms"] = 1e3 * v
    if out_len is not None and out_len > 1 and "ttft_mean_ms" in out and "e2el_mean_ms" in out:
        out["tpot_mean_ms"] = out["itl_mean_ms"] = (out["e2el_mean_ms"] - out["ttft_mean_ms"]) / (out_len - 1)
    tp = _mapping(where, "successes.throughput", succ.get("throughput"))
    rps = number(where, "successes.throughput.requests_per_sec", tp["requests_per_sec"], lo=0.0,
                 what=" (requests/s)") if tp.get("requests_per_sec") is not None else None  # fmt: skip
    tps = number(where, "successes.throughput.output_tokens_per_sec", tp["output_tokens_per_sec"], lo=0.0,
                 what=" (tokens/s)") if tp.get("output_tokens_per_sec") is not None else None  # fmt: skip
    if rps is not None:
        out["request_throughput"] = rps
        if out_len is not None:
            out["output_throughput"] = out_len * rps
        elif tps is not None:
            out["output_throughput"] = tps
    out["completed"] = float(integer(where, "successes.count", succ.get("count", 0), lo=0, hi=MAX_REQUESTS))
    return out


def _measured(path: Path, out_len: float | None) -> dict[str, float]:
    d = _json(path)
    check_keys(str(path), d, ("successes", "failures"), "inference-perf lifecycle metrics")
    m = _latency_block(str(path), d["successes"], out_len)
    m["failed"] = float(integer(str(path), "failures.count", _mapping(str(path), "failures",
                                                                      d["failures"]).get("count", 0), hi=MAX_REQUESTS))
    return m


def _shared_prefix_specs(sp: dict[str, Any], plen: int, out_len: int, times: list[float], seed: int,
                         where: str) -> list[RequestSpec]:  # fmt: skip
    check_keys(where, sp, ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len"),
               "data.shared_prefix")  # fmt: skip
    per = integer(where, "num_prompts_per_group", sp["num_prompts_per_group"], lo=1, hi=10**7)
    n_prompts = integer(where, "num_groups", sp["num_groups"], lo=1, hi=10**7) * per
    lens = [integer(where, k, sp[k], lo=0) for k in ("system_prompt_len", "question_len")]
    if not sum(lens):
        raise TraceFormatError(f"{where}: system_prompt_len and question_len are both 0: no prompt to rebuild")
    sys_len = int(round(plen * lens[0] / sum(lens)))
    perm = np.random.default_rng(seed).permutation(n_prompts)
    specs = []
    for i, t in enumerate(times):
        p = int(perm[i % n_prompts])
        specs.append(RequestSpec(request_id=str(i), arrival_time=t, prompt_len=plen, output_len=out_len,
                                 segments=((("sys", p // per), sys_len), (("q", p), plen - sys_len))))  # fmt: skip
    return specs


def _records(path: Path, num_stages: int) -> pd.DataFrame:
    """per_request_lifecycle_metrics.json -> one row per request (old and new ``info`` layouts). Times are the
    client's (perf_counter seconds): start <= end for every record, start <= first token <= end for a success."""
    recs = _json(path)
    if not isinstance(recs, list):
        raise TraceFormatError(f"{path}: expected a list of request records")
    if len(recs) > MAX_REQUESTS:
        raise TraceFormatError(f"{path}: {len(recs)} request records; expected at most {MAX_REQUESTS}")
    if not recs:  # every request failed before it was recorded, or the file was cut: nothing to replay
        raise TraceFormatError(f"{path}: no request records (an empty list); expected the run's requests")
    rows = []
    for i, r in enumerate(recs):
        where = f"{path}: record {i}"
        check_keys(where, r, ("start_time", "end_time", "info"), "request lifecycle record")
        info = _mapping(where, "info", r["info"])
        resp = _mapping(where, "info.response_metrics", info.get("response_metrics"))
        text_m = _mapping(where, "info.request_metrics.text",
                          _mapping(where, "info.request_metrics", info.get("request_metrics")).get("text"))
        p = info.get("input_tokens", text_m.get("input_tokens"))
        o = info.get("output_tokens", resp.get("output_tokens"))
        times = info.get("output_token_times", resp.get("output_token_times")) or []
        if p is None or o is None:
            raise TraceFormatError(f"{path}: record {i}: info has no input_tokens / output_tokens")
        p, o = integer(where, "input_tokens", p, what=" (tokens)"), integer(where, "output_tokens", o, what=" (tokens)")
        start = number(where, "start_time", r["start_time"], lo=-MAX_CLOCK_S, hi=MAX_CLOCK_S, what=" (seconds)")
        end = number(where, "end_time", r["end_time"], lo=-MAX_CLOCK_S, hi=MAX_CLOCK_S, what=" (seconds)")
        if end < start:
            raise TraceFormatError(f"{where}: field 'end_time': {end} is before start_time {start}; expected "
                                   "start_time <= end_time")
        if not isinstance(times, list):
            raise TraceFormatError(f"{where}: field 'output_token_times': expected a list of numbers, got {show(times)}")
        _token_times(where, times)
        first = float(times[0]) if times else math.nan
        ok = not r.get("error")
        if ok and times and not start <= first <= end:
            raise TraceFormatError(f"{where}: field 'output_token_times[0]': {first} is outside start_time {start} .. "
                                   f"end_time {end}; expected the first token between the send and the end")
        stage = r.get("stage_id")
        stage = 0 if stage is None else integer(where, "stage_id", stage, lo=0, hi=max(num_stages - 1, 0),
                                                what=f" (config.yaml has {num_stages} load stages)")
        text = r.get("request_data")
        if text is not None and not isinstance(text, str):  # a key for prefix identity: the body as one string
            text = json.dumps(text, sort_keys=True, default=str)
        rows.append({"stage": stage, "start": start, "prompt_len": p, "output_len": o, "ok": ok,
                     "ttft": first - start if times else math.nan, "e2el": end - start, "text": text})  # fmt: skip
    return pd.DataFrame(rows)


def _token_times(where: str, times: list[Any]) -> None:
    """output_token_times: each a finite clock reading (perf_counter seconds), in the order they came."""
    prev = -math.inf
    for j, x in enumerate(times):
        v = number(where, f"output_token_times[{j}]", x, lo=-MAX_CLOCK_S, hi=MAX_CLOCK_S, what=" (seconds)")
        if v < prev:
            raise TraceFormatError(f"{where}: field 'output_token_times[{j}]': {v} is before output_token_times"
                                   f"[{j - 1}] {prev}; expected the tokens' times in the order they came")
        prev = v


def load_inference_perf(path: str | Path, seed: int = 0) -> RealRun:
    path = Path(path)
    rdir = results_dir(path)
    if rdir is None:
        raise TraceFormatError(f"{path}: not an inference-perf results directory (needs config.yaml and "
                               "stage_<k>_lifecycle_metrics.json, here or in results/)")
    cfg = _yaml(rdir / "config.yaml")
    check_keys(str(rdir / "config.yaml"), cfg, ("load", "data"), "inference-perf config")
    cfg_where = str(rdir / "config.yaml")
    load, data = _mapping(cfg_where, "load", cfg["load"]), _mapping(cfg_where, "data", cfg["data"])
    check_keys(f"{rdir / 'config.yaml'}: load", load, ("type", "stages"), "load profile")
    if not isinstance(load["stages"], list) or not load["stages"]:
        raise TraceFormatError(f"{cfg_where}: field 'load.stages': expected a list of load stages, got "
                               f"{show(load['stages'])}")
    exp_path = next((p for p in (rdir / "exp-config.yaml", rdir.parent / "exp-config.yaml") if p.is_file()), None)
    exp = _yaml(exp_path) if exp_path else {}
    ignore_eos = bool(_mapping(cfg_where, "server", cfg.get("server")).get("ignore_eos"))
    sp = _mapping(cfg_where, "data.shared_prefix", data.get("shared_prefix"))
    cfg_out = sp.get("output_len") if data.get("type") == "shared_prefix" else None
    out_len = float(integer(f"{cfg_where}: data.shared_prefix", "output_len", cfg_out, lo=1)) \
        if ignore_eos and cfg_out else None
    files = sorted((int(m.group(1)), p) for p in rdir.iterdir() if (m := _STAGE_FILE.match(p.name)))
    measured = [_measured(p, out_len) for _, p in files]
    raw_stages = load["stages"]
    if len(raw_stages) != len(files):
        raise TraceFormatError(f"{rdir}: config.yaml has {len(raw_stages)} load stages but there are "
                               f"{len(files)} stage_<k>_lifecycle_metrics.json files")
    rec_path = rdir / "per_request_lifecycle_metrics.json"
    loads = [_stage_load(f"{cfg_where}: load.stages[{k}]", st, not rec_path.is_file())
             for k, st in enumerate(raw_stages)]  # fmt: skip
    summary = rdir / "summary_lifecycle_metrics.json"
    overall = _measured(summary, out_len) if summary.is_file() else {}
    stage0 = _mapping(str(files[0][1]), "successes", _json(files[0][1])["successes"])
    notes: list[str] = []
    requests = None
    if rec_path.is_file():
        rec = _records(rec_path, len(raw_stages)).sort_values("start", kind="stable").reset_index(drop=True)
        t = rec["start"].to_numpy(float) - float(rec["start"].min())
        texts = rec["text"].tolist()
        specs = [RequestSpec(request_id=str(i), arrival_time=float(t[i]), prompt_len=max(int(r.prompt_len), 1),
                             output_len=max(int(r.output_len), 1),
                             segments=((("text", texts[i]), max(int(r.prompt_len), 1)),) if texts[i] else None)
                 for i, r in enumerate(rec.itertuples())]  # fmt: skip
        stage_of = rec["stage"].to_numpy()
        requests = rec.assign(send=t).drop(columns=["text", "start"])
        requests.loc[~requests["ok"], ["ttft", "e2el"]] = math.nan
        out = requests["output_len"].to_numpy(float)
        requests["tpot"] = np.where(out > 1, (requests["e2el"] - requests["ttft"]) / np.maximum(out - 1, 1), np.nan)
        for k in range(len(measured)):  # the percentiles the aggregates lack, from the records
            extra = stats_from_requests(requests[(requests["stage"] == k) & requests["ok"]])
            measured[k] = {**extra, **measured[k]}
        arrivals, drew = "recorded", False
        notes.append("arrivals, lengths and failures from per_request_lifecycle_metrics.json; prompts with "
                     "equal text share their KV prefix")
        empty = int((rec["ok"] & (rec["output_len"] < 1)).sum())
        if empty:  # an empty reply (EOS first) still took a step to produce: replayed with one token, and said
            notes.append(f"{empty} successful requests with output_tokens 0 replayed with 1 output token")
    else:
        w0 = str(files[0][1])
        plen = int(round(number(w0, "successes.prompt_len.mean", _mapping(w0, "successes.prompt_len", stage0.get(
            "prompt_len")).get("mean") or 0, lo=0.0, hi=MAX_TOKENS)))
        if plen < 1:
            raise TraceFormatError(f"{files[0][1]}: successes.prompt_len.mean is missing: cannot rebuild prompts")
        o = int(out_len) if out_len else int(round(number(w0, "successes.output_len.mean", _mapping(
            w0, "successes.output_len", stage0.get("output_len")).get("mean") or 0, lo=0.0, hi=MAX_TOKENS)))
        if o < 1:
            raise TraceFormatError(f"{files[0][1]}: no output length (data.shared_prefix.output_len with "
                                   "ignore_eos, or successes.output_len.mean)")
        times, stage_list = [], []
        t0 = 0.0
        rng = np.random.default_rng(seed)
        total = sum(r * d for r, d in loads if r is not None and d is not None)
        for k, (rate, dur) in enumerate(loads):
            assert rate is not None and dur is not None  # required without per-request records
            if not rate * dur <= MAX_REQUESTS + 0.5 or not total <= MAX_REQUESTS + 0.5:
                raise TraceFormatError(f"{cfg_where}: load.stages[{k}]: rate {rate:g} x duration {dur:g} s = "
                                       f"{rate * dur:g} requests ({total:g} in all stages); expected at most "
                                       f"{MAX_REQUESTS} to rebuild")
            n = int(round(rate * dur))
            if load["type"] == "constant":
                ts = t0 + np.arange(n) / rate
            elif load["type"] == "poisson":
                ts = t0 + np.cumsum(rng.exponential(1 / rate, n))
            else:
                raise TraceFormatError(f"{rdir / 'config.yaml'}: load.type {load['type']!r}: servesim rebuilds "
                                       "constant and poisson loads (or give per-request records)")
            times += ts.tolist()
            stage_list += [k] * n
            t0 += n / rate
        if data.get("type") == "shared_prefix":
            specs = _shared_prefix_specs(sp, plen, o, times, seed, f"{rdir / 'config.yaml'}: data.shared_prefix")
        else:
            specs = [RequestSpec(request_id=str(i), arrival_time=t, prompt_len=plen, output_len=o)
                     for i, t in enumerate(times)]  # fmt: skip
            notes.append(f"data.type {data.get('type')!r}: every prompt {plen} tokens (the measured mean), unique")
        stage_of = np.asarray(stage_list)
        arrivals = f"rebuilt: load.type {load['type']} stages back to back (seed {seed})"
        drew = load["type"] == "poisson" or data.get("type") == "shared_prefix"
        notes.append(f"prompts: {plen} tokens (successes.prompt_len.mean), outputs {o} tokens"
                     + (" (ignore_eos)" if out_len else " (the measured mean)"))
    stages, start = [], 0.0
    for k, (rate, dur) in enumerate(loads):
        n = int((stage_of == k).sum())
        stages.append(Stage(k, rate, dur, start, n))
        start += n / rate if rate else 0.0
    engine = {k: exp[k] for k in _ENGINE if k in exp}
    exp_where = str(exp_path)
    hardware = {"tensor_parallel_size": integer(exp_where, "tensor_parallelism", exp["tensor_parallelism"], lo=1,
                                                hi=4096)} if "tensor_parallelism" in exp else {}  # fmt: skip
    for key in ("model", "vllm_version"):
        if exp.get(key) is not None and not isinstance(exp[key], str | int | float):
            raise TraceFormatError(f"{exp_where}: field '{key}': expected a string, got {show(exp[key])}")
    if exp_path is None:
        notes.append("no exp-config.yaml beside results/: servesim's [engine] defaults unless --set")
    timeout = load.get("request_timeout")
    if timeout is not None:
        number(f"{cfg_where}: load", "request_timeout", timeout, lo=0.0, lo_open=True, what=" (seconds) or null")
    model = exp.get("model") or _mapping(cfg_where, "server", cfg.get("server")).get("model_name") or \
        _mapping(cfg_where, "tokenizer", cfg.get("tokenizer")).get("pretrained_model_name_or_path")
    return RealRun(
        source=path, format="inference-perf", basis="client", specs=specs, stage_of=stage_of, stages=stages,
        measured=measured, overall=overall, meaning=dict(MEANING), model=model, engine=engine,
        hardware=hardware, vllm_version=str(exp["vllm_version"]) if "vllm_version" in exp else None,
        client_timeout_s=float(timeout) if timeout else CLIENT_TIMEOUT_S, arrivals=arrivals,
        requests=requests, notes=notes, settings_file=exp_path, seed=seed if drew else None,
    )  # fmt: skip
