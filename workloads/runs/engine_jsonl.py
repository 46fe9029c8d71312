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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError
from sim.core.request import RequestSpec
from workloads.runs.model import RealRun, Stage, stats_from_requests

FIELDS = ("input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts", "first_token_ts",
          "last_token_ts")  # fmt: skip
MEANING = {
    "ttft": "engine first-token timestamp (aligned to the client clock) - client send",
    "tpot": "(last token - first token) / (output_toks - 1), engine timestamps",
    "itl": "token-weighted mean of the same gaps (mean only)",
    "e2el": "engine last-token timestamp (aligned) - client send",
    "timeseries": "vLLM's 1-second stats log (timeseries.csv): running, waiting, kv_cache_pct",
}
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "auto": "auto", "fp8": "fp8"}


def is_engine_jsonl(path: Path) -> bool:
    """A JSONL file (or a directory with requests.jsonl) whose first row has the engine timestamps."""
    f = path / "requests.jsonl" if path.is_dir() else path
    if not f.is_file():
        return False
    try:
        with open(f, encoding="utf-8") as fh:
            first = next((ln for ln in fh if ln.strip()), "")
        return set(FIELDS) <= set(json.loads(first))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, OSError):
        return False


def _rows(path: Path) -> pd.DataFrame:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceFormatError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            missing = [k for k in FIELDS if not isinstance(obj.get(k), int | float)]
            if missing:
                raise TraceFormatError(f"{path}:{lineno}: missing or non-numeric {', '.join(missing)} "
                                       f"(per-request engine timestamps need {', '.join(FIELDS)})")
            rows.append(obj)
    if not rows:
        raise TraceFormatError(f"{path}: no requests")
    return pd.DataFrame(rows)


def _workload_file(d: Path, req: pd.DataFrame) -> Path | None:
    for p in sorted(d.glob("workload*.jsonl")):
        try:
            with open(p, encoding="utf-8") as fh:
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

        wl = load_vllm_bench(wl_path)
        wl_rows = pd.DataFrame([json.loads(x) for x in wl_path.read_text().splitlines() if x.strip()])
        if not (wl_rows["input_toks"].to_numpy() == req["input_toks"].to_numpy()).all():
            raise TraceFormatError(f"{wl_path}: input_toks do not line up row by row with {f}")
        send = wl_rows["arrival_time_ns"].to_numpy(float) / 1e9
        specs = sorted(wl.specs, key=lambda s: int(s.request_id))  # ids are row numbers: requests.jsonl order
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
    measured.update(completed=float(len(df)), failed=0.0, request_throughput=len(df) / dur,
                    output_throughput=float(out.sum()) / dur)  # fmt: skip
    meta: dict[str, Any] = json.loads((d / "meta.json").read_text()) if (d / "meta.json").is_file() else {}
    ek, kv = meta.get("engine_kwargs") or {}, meta.get("kv_cache") or {}
    engine = {k: ek[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_dtype")
              if k in ek}  # fmt: skip
    engine.update({k: kv[k] for k in ("block_size", "gpu_memory_utilization", "enable_prefix_caching") if k in kv})
    if isinstance(kv.get("num_gpu_blocks"), int):  # the capacity vLLM measured: replay on the same KV pool
        engine["num_gpu_blocks_override"] = kv["num_gpu_blocks"]
    hardware = {}
    if (meta.get("hardware") or {}).get("device_name"):
        hardware["gpu"] = meta["hardware"]["device_name"]
    if "tensor_parallel_size" in ek:
        hardware["tensor_parallel_size"] = int(ek["tensor_parallel_size"])
    if not meta:
        notes.append("no meta.json beside it: servesim's [engine] defaults unless --set")
    ts = None
    if (d / "timeseries.csv").is_file():
        ts = pd.read_csv(d / "timeseries.csv")
        if "t" not in ts.columns:
            raise TraceFormatError(f"{d / 'timeseries.csv'}: no 't' column (seconds from the start)")
    return RealRun(
        source=path, format="engine-jsonl", basis="engine_aligned", specs=specs, stage_of=np.zeros(len(specs)),
        stages=[Stage(0, None, dur, 0.0, len(specs))], measured=[dict(measured)], overall=dict(measured),
        meaning=dict(MEANING), model=meta.get("model") or ek.get("model"),
        dtype=_DTYPES.get(str(ek.get("dtype", "")).lower()) if ek.get("dtype") else None, engine=engine,
        hardware=hardware, vllm_version=meta.get("vllm_version"),
        arrivals="recorded" if wl_path is not None else "recorded (arrival_time)", requests=df,
        timeseries=ts, notes=notes, clocks=clocks,
    )  # fmt: skip
