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
from sim.core.request import RequestSpec
from workloads.runs.model import RealRun, Stage, check_keys, stats_from_requests

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

    try:
        obj = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TraceFormatError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{path}: expected a mapping at the top, got {type(obj).__name__}")
    return obj


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}: not valid JSON ({e})") from None


def _latency_block(where: str, succ: dict[str, Any], out_len: float | None) -> dict[str, float]:
    lat = succ.get("latency") or {}
    check_keys(where, lat, ("time_to_first_token", "request_latency"), "successes.latency")
    out: dict[str, float] = {}
    for src, m in (("time_to_first_token", "ttft"), ("request_latency", "e2el"),
                   ("time_per_output_token", "tpot_chunk"), ("inter_token_latency", "itl_chunk")):
        block = lat.get(src) or {}
        for word, stat in _STATS.items():
            if isinstance(block.get(word), int | float):
                out[f"{m}_{stat}_ms"] = 1e3 * float(block[word])
    if out_len is not None and out_len > 1 and "ttft_mean_ms" in out:
        out["tpot_mean_ms"] = out["itl_mean_ms"] = (out["e2el_mean_ms"] - out["ttft_mean_ms"]) / (out_len - 1)
    tp = succ.get("throughput") or {}
    if isinstance(tp.get("requests_per_sec"), int | float):
        out["request_throughput"] = float(tp["requests_per_sec"])
        if out_len is not None:
            out["output_throughput"] = out_len * float(tp["requests_per_sec"])
        elif isinstance(tp.get("output_tokens_per_sec"), int | float):
            out["output_throughput"] = float(tp["output_tokens_per_sec"])
    out["completed"] = float(succ.get("count", 0))
    return out


def _measured(path: Path, out_len: float | None) -> dict[str, float]:
    d = _json(path)
    check_keys(str(path), d, ("successes", "failures"), "inference-perf lifecycle metrics")
    m = _latency_block(str(path), d["successes"], out_len)
    m["failed"] = float((d["failures"] or {}).get("count", 0))
    return m


def _shared_prefix_specs(sp: dict[str, Any], plen: int, out_len: int, times: list[float], seed: int,
                         where: str) -> list[RequestSpec]:  # fmt: skip
    check_keys(where, sp, ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len"),
               "data.shared_prefix")  # fmt: skip
    per = int(sp["num_prompts_per_group"])
    n_prompts = int(sp["num_groups"]) * per
    sys_len = int(round(plen * sp["system_prompt_len"] / (sp["system_prompt_len"] + sp["question_len"])))
    perm = np.random.default_rng(seed).permutation(n_prompts)
    specs = []
    for i, t in enumerate(times):
        p = int(perm[i % n_prompts])
        specs.append(RequestSpec(request_id=str(i), arrival_time=t, prompt_len=plen, output_len=out_len,
                                 segments=((("sys", p // per), sys_len), (("q", p), plen - sys_len))))  # fmt: skip
    return specs


def _records(path: Path) -> pd.DataFrame:
    """per_request_lifecycle_metrics.json -> one row per request (old and new ``info`` layouts)."""
    recs = _json(path)
    if not isinstance(recs, list):
        raise TraceFormatError(f"{path}: expected a list of request records")
    rows = []
    for i, r in enumerate(recs):
        check_keys(f"{path}: record {i}", r, ("start_time", "end_time", "info"), "request lifecycle record")
        info = r["info"] or {}
        resp = info.get("response_metrics") or {}
        p = info.get("input_tokens", ((info.get("request_metrics") or {}).get("text") or {}).get("input_tokens"))
        o = info.get("output_tokens", resp.get("output_tokens"))
        times = info.get("output_token_times", resp.get("output_token_times")) or []
        if p is None or o is None:
            raise TraceFormatError(f"{path}: record {i}: info has no input_tokens / output_tokens")
        start = float(r["start_time"])
        rows.append({"stage": int(r.get("stage_id") or 0), "start": start, "prompt_len": int(p),
                     "output_len": int(o), "ok": not r.get("error"),
                     "ttft": float(times[0]) - start if times else math.nan,
                     "e2el": float(r["end_time"]) - start, "text": r.get("request_data")})  # fmt: skip
    return pd.DataFrame(rows)


def load_inference_perf(path: str | Path, seed: int = 0) -> RealRun:
    path = Path(path)
    rdir = results_dir(path)
    if rdir is None:
        raise TraceFormatError(f"{path}: not an inference-perf results directory (needs config.yaml and "
                               "stage_<k>_lifecycle_metrics.json, here or in results/)")
    cfg = _yaml(rdir / "config.yaml")
    check_keys(str(rdir / "config.yaml"), cfg, ("load", "data"), "inference-perf config")
    load, data = cfg["load"] or {}, cfg["data"] or {}
    check_keys(f"{rdir / 'config.yaml'}: load", load, ("type", "stages"), "load profile")
    exp_path = next((p for p in (rdir / "exp-config.yaml", rdir.parent / "exp-config.yaml") if p.is_file()), None)
    exp = _yaml(exp_path) if exp_path else {}
    ignore_eos = bool((cfg.get("server") or {}).get("ignore_eos"))
    sp = data.get("shared_prefix") or {}
    cfg_out = sp.get("output_len") if data.get("type") == "shared_prefix" else None
    out_len = float(cfg_out) if ignore_eos and cfg_out else None
    files = sorted((int(m.group(1)), p) for p in rdir.iterdir() if (m := _STAGE_FILE.match(p.name)))
    measured = [_measured(p, out_len) for _, p in files]
    raw_stages = load["stages"]
    if len(raw_stages) != len(files):
        raise TraceFormatError(f"{rdir}: config.yaml has {len(raw_stages)} load stages but there are "
                               f"{len(files)} stage_<k>_lifecycle_metrics.json files")
    summary = rdir / "summary_lifecycle_metrics.json"
    overall = _measured(summary, out_len) if summary.is_file() else {}
    stage0 = _json(files[0][1])["successes"]
    notes: list[str] = []
    rec_path = rdir / "per_request_lifecycle_metrics.json"
    requests = None
    if rec_path.is_file():
        rec = _records(rec_path).sort_values("start", kind="stable").reset_index(drop=True)
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
        arrivals = "recorded"
        notes.append("arrivals, lengths and failures from per_request_lifecycle_metrics.json; prompts with "
                     "equal text share their KV prefix")
    else:
        plen = int(round(float((stage0.get("prompt_len") or {}).get("mean") or 0)))
        if plen < 1:
            raise TraceFormatError(f"{files[0][1]}: successes.prompt_len.mean is missing: cannot rebuild prompts")
        o = int(out_len) if out_len else int(round(float((stage0.get("output_len") or {}).get("mean") or 0)))
        if o < 1:
            raise TraceFormatError(f"{files[0][1]}: no output length (data.shared_prefix.output_len with "
                                   "ignore_eos, or successes.output_len.mean)")
        times, stage_list = [], []
        t0 = 0.0
        rng = np.random.default_rng(seed)
        for k, st in enumerate(raw_stages):
            check_keys(f"{rdir / 'config.yaml'}: load.stages[{k}]", st, ("rate", "duration"), "stage")
            rate, dur = float(st["rate"]), float(st["duration"])
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
        notes.append(f"prompts: {plen} tokens (successes.prompt_len.mean), outputs {o} tokens"
                     + (" (ignore_eos)" if out_len else " (the measured mean)"))
    stages, start = [], 0.0
    for k, st in enumerate(raw_stages):
        n = int((stage_of == k).sum())
        stages.append(Stage(k, float(st["rate"]), float(st["duration"]), start, n))
        start += n / float(st["rate"]) if float(st["rate"]) > 0 else 0.0
    engine = {k: exp[k] for k in _ENGINE if k in exp}
    hardware = {"tensor_parallel_size": int(exp["tensor_parallelism"])} if "tensor_parallelism" in exp else {}
    if exp_path is None:
        notes.append("no exp-config.yaml beside results/: servesim's [engine] defaults unless --set")
    timeout = load.get("request_timeout")
    model = exp.get("model") or (cfg.get("server") or {}).get("model_name") or \
        (cfg.get("tokenizer") or {}).get("pretrained_model_name_or_path")
    return RealRun(
        source=path, format="inference-perf", basis="client", specs=specs, stage_of=stage_of, stages=stages,
        measured=measured, overall=overall, meaning=dict(MEANING), model=model, engine=engine,
        hardware=hardware, vllm_version=str(exp["vllm_version"]) if "vllm_version" in exp else None,
        client_timeout_s=float(timeout) if timeout else CLIENT_TIMEOUT_S, arrivals=arrivals,
        requests=requests, notes=notes,
    )  # fmt: skip
