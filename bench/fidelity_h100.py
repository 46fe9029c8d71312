"""The four real H100 runs (Llama-2-7B TP1, vLLM 0.15, load from inference-perf) replayed in servesim.

Data: ``../shared/data/e2e/h100-llama-2-7b-vllm-0.15/cases.json`` (per run and stage: TTFT / E2E mean, P90,
P99, the true ITL; client-side, from inference-perf) and ``raw/*/results/config.yaml`` (the resolved load
profile). What the replay rebuilds from them (data/README.md, cases.json ``measurement_notes``):

* arrivals: ``load.type = constant``: stage k sends ``rate_k × duration_k`` requests evenly spaced at
  ``1/rate_k``, stages back to back (``frac`` < 1 keeps the first ``frac`` of every stage, for speed);
* prompts: ``shared_prefix`` with ``num_groups × num_prompts_per_group`` prompts made once (a system prompt
  per group, then a question), request i sends prompt ``perm[i mod 100]`` of one shuffle, so whole prompts
  repeat (prefix caching hits all but the first use). The prompt length is the measured mean
  (``prompt_len_mean_measured``, the client's re-tokenized count, BOS included), split between the system
  prompt and the question in the ratio of the configured lengths; the permutation is a fixed seed (the
  real one is not recorded);
* outputs: ``output_len`` tokens (``ignore_eos``);
* engine: max_num_seqs 128, max_num_batched_tokens 2048, max_model_len 4096, block 16, prefix caching and
  chunked prefill on, the logged 7463 GPU blocks, the shipped H100 SXM profile, ``async_scheduling = true``
  (vLLM V1's GPU default) and the ``[frontend]`` priors (sim/app/frontend.py).

Metrics as the client measures them: TTFT = send → first chunk, E2E = send → last chunk, ITL = (E2E − TTFT)
/ (output_len − 1) per request (cases.json ``itl_true_mean_s``; inference-perf's own ITL is per SSE chunk
and has no counterpart here, so ITL has a mean only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.app.config import config_from_dict
from sim.app.frontend import apply_frontend, with_frontend
from sim.app.replay import cap_stages
from sim.app.results import request_metrics
from sim.app.simulate import collect, resolve
from sim.core.request import RequestSpec
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from workloads.runs.inference_perf import load_inference_perf

H100_RUN = "e2e/h100-llama-2-7b-vllm-0.15"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STATS = ("mean", "p90", "p99")


def h100_cases(data: Path) -> list[dict[str, Any]]:
    return json.loads((data / H100_RUN / "cases.json").read_text())["cases"]


def raw_dir(case: dict[str, Any], data: Path) -> Path:
    """The run's raw inference-perf directory: ``source.peers_key`` when cases.json names it, else the one
    directory under raw/ named ``<timestamp>-<case id>`` (cases.json leaves the key null for some runs)."""
    root = data / H100_RUN / "raw"
    key = case["source"].get("peers_key")
    if key:
        return root / key
    found = sorted(root.glob(f"*-{case['id']}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{root}: expected one directory ending in -{case['id']}, found {len(found)}")
    return found[0]


def h100_specs(case: dict[str, Any], frac: float = 1.0, seed: int = 0,
               data: Path | None = None) -> tuple[list[RequestSpec], np.ndarray]:  # fmt: skip
    """(specs, stage index of each) for one run, as inference-perf sent it: the run's results directory read by
    workloads/runs/inference_perf.py (its docstring says how the load is rebuilt), the first ``frac`` of every
    stage kept with the stages back to back (sim/app/replay.cap_stages)."""
    raw = raw_dir(case, data or DATA)
    run = load_inference_perf(raw, seed=seed)
    caps = [max(1, int(round(st.num_requests * frac))) for st in run.stages]
    return cap_stages(list(run.specs), run.stage_of, run, caps if frac < 1 else None)


def h100_config(case: dict[str, Any], async_scheduling: bool = True, frontend: dict | None = None) -> Any:
    e = case["engine"]
    raw = {
        "model": {"name": case["model"], "dtype": "bf16"},
        "hardware": {"gpu": case["gpu"], "tensor_parallel_size": case["tp"]},
        "engine": {"policy": "vllm", "max_num_seqs": e["max_num_seqs"],
                   "max_num_batched_tokens": e["max_num_batched_tokens"], "max_model_len": e["max_model_len"],
                   "block_size": e["block_size"], "enable_prefix_caching": e["enable_prefix_caching"],
                   "enable_chunked_prefill": e["enable_chunked_prefill"],
                   "gpu_memory_utilization": e["gpu_memory_utilization"],
                   "num_gpu_blocks_override": case["num_gpu_blocks_logged"], "async_scheduling": async_scheduling},
    }  # fmt: skip
    raw["frontend"] = {"enabled": False} if frontend is None else frontend
    return config_from_dict(raw)


def simulate_h100(case: dict[str, Any], frac: float = 1.0, async_scheduling: bool = True,
                  frontend: dict | None = None, horizon: float | None = None,
                  client_timeout_s: float | None = None) -> tuple[pd.DataFrame, Any, float]:  # fmt: skip
    """(per-request metrics with a ``stage`` column, the SimResult, wall seconds). ``frontend`` None: the
    priors; pass ``{"enabled": False}`` for none. ``client_timeout_s``: clients give up (the engine aborts)."""
    cfg = h100_config(case, async_scheduling, {} if frontend is None else frontend)
    setup = resolve(cfg)
    specs, stage_of = h100_specs(case, frac)
    stage_by_id = {sp.request_id: int(k) for sp, k in zip(specs, stage_of, strict=True)}
    t0 = time.perf_counter()
    env = simpy.Environment(initial_time=0.0)
    src, send = with_frontend(OpenSource(specs), cfg.frontend)
    rec = Recorder()
    eng = Engine(env, setup.make_policy(), setup.cost_model, src, rec, horizon,
                 async_scheduling=setup.limits.async_scheduling, client_timeout_s=client_timeout_s)
    env.run()
    res = apply_frontend(collect(cfg, setup, eng, src, rec, time.perf_counter() - t0), cfg.frontend, send)
    df = request_metrics(res.requests)
    df["stage"] = df["request_id"].map(stage_by_id).astype(int)
    df["itl_true"] = (df["e2el_s"] - df["ttft_s"]) / (df["output_len"] - 1)
    return df, res, time.perf_counter() - t0


def _stats(x: pd.Series) -> dict[str, float]:
    a = x.to_numpy(float)
    a = a[np.isfinite(a)]
    if not a.size:
        return dict.fromkeys(STATS, float("nan"))
    return {"mean": float(a.mean()), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


# aiohttp's ClientTimeout(total=300) when inference-perf has request_timeout: null; the real failures land at
# 300.0-301.0 s (the deadline is checked on whole seconds), so clients give up at 301 s at the latest.
CLIENT_TIMEOUT_S = 300.0


def compare_stages(case: dict[str, Any], df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per (stage, metric, stat): real, sim, signed error (sim/real − 1), over the successes (the
    overloaded run is simulated with its clients' 300 s timeout: the engine aborts who gives up), and one
    row of failures per stage (real failed vs simulated timed out)."""
    rows = []
    for k, real in enumerate(case["measured_stages"]):
        fin = df[(df["stage"] == k) & (df["status"] == "finished")]
        if case["overload"]:
            fin = fin[fin["e2el_s"] <= CLIENT_TIMEOUT_S]  # a client-side E2E past the deadline is a failure too
        failed = int(((df["stage"] == k) & (df["status"] != "finished")).sum()) + int(
            ((df["stage"] == k) & (df["status"] == "finished")).sum()) - len(fin)
        rows.append(dict(run=case["id"].removeprefix("llama-2-7b-tp1-"), stage=k,
                         rate=case["workload"]["stages"][k]["rate"], metric="failed", stat="count",
                         real=float(real.get("n_failed", 0)), sim=float(failed),
                         err=(failed / real["n_failed"] - 1) if real.get("n_failed") else float("nan"),
                         overload=case["overload"], n_sim=len(fin), n_real=int(real["n_success"]),
                         ttft_engine_mean=float("nan")))  # fmt: skip
        sim = {"ttft": _stats(fin["ttft_s"]), "e2e": _stats(fin["e2el_s"]), "itl": _stats(fin["itl_true"])}
        for metric, keys in (("ttft", {s: f"ttft_{s}_s" for s in STATS}),
                             ("e2e", {s: f"e2e_{s}_s" for s in STATS}), ("itl", {"mean": "itl_true_mean_s"})):
            for st, key in keys.items():
                r, s = float(real[key]), sim[metric][st]
                rows.append(dict(run=case["id"].removeprefix("llama-2-7b-tp1-"), stage=k,
                                 rate=case["workload"]["stages"][k]["rate"], metric=metric, stat=st, real=r, sim=s,
                                 err=s / r - 1, overload=case["overload"], n_sim=len(fin),
                                 n_real=int(real["n_success"]),
                                 ttft_engine_mean=float(fin["ttft_engine_s"].mean())))  # fmt: skip
    return rows


def h100_section(data: Path, frac: float = 1.0) -> tuple[list[str], pd.DataFrame]:
    """Markdown lines and the comparison frame for the four runs (async + [frontend] priors), with the
    mean TTFT of the ablations (sync, no front end: the default before 2026-12; async only: the default
    now) for the moderate stages."""
    rows, abl, walls = [], [], []
    for case in h100_cases(data):
        df, res, wall = simulate_h100(case, frac, client_timeout_s=CLIENT_TIMEOUT_S if case["overload"] else None)
        walls.append(wall)
        rows += compare_stages(case, df)
        print(f"{case['id']}: {len(df)} requests simulated in {wall:.1f} s")
        if case["overload"]:
            continue
        for label, kw in (("sync", {"async_scheduling": False, "frontend": {"enabled": False}}),
                          ("async", {"async_scheduling": True, "frontend": {"enabled": False}})):
            d2, _, _ = simulate_h100(case, frac, **kw)
            for r in compare_stages(case, d2):
                if r["metric"] == "ttft" and r["stat"] == "mean":
                    abl.append({**r, "variant": label})
    t = pd.DataFrame(rows)
    a = pd.DataFrame(abl)
    md = ["", "## 5. End to end: four real vLLM 0.15 runs on an H100 (Llama-2-7B TP1)", "",
          "`../shared/data/e2e/h100-llama-2-7b-vllm-0.15/` (inference-perf, client-side metrics). Replay: "
          "bench/fidelity_h100.py (constant-rate stages back to back, 100 prompts in 10 groups reused whole, "
          f"ignore_eos outputs, the logged 7463 blocks; fraction of each stage simulated: {frac:g}). servesim with "
          "`async_scheduling = true` and the `[frontend]` priors (sim/app/frontend.py, none fitted to these runs). "
          "TTFT and E2E client-side (send → first / last chunk), ITL = (E2E − TTFT)/(output_len − 1) (mean "
          "only: the run's own ITL percentiles are per SSE chunk). Error = sim/real − 1. Targets (issue 11, "
          "moderate-load stages): mean TTFT ±10 %, P99 TTFT ±20 %, mean E2E and ITL ±5 %, P99 E2E ±8 %. The "
          "reasoning run is overloaded (4068 of 4800 requests fail at the client's 300 s deadline): it is "
          "simulated with `workload.client_timeout_s = 300` (the engine aborts a request whose client gave up "
          "and frees its KV) and its latency numbers are over the successes; the FAILED rows compare failure "
          "counts.", "",
          "| run | stage | rate | metric | real mean | sim mean | err | real P90 | sim P90 | err | real P99 | sim P99 "
          "| err | n real / sim |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    scale = {"ttft": 1e3, "e2e": 1.0, "itl": 1e3}
    unit = {"ttft": "ms", "e2e": "s", "itl": "ms"}
    for (run, stage, metric), g in t.groupby(["run", "stage", "metric"], sort=False):
        g = g.set_index("stat")
        if metric == "failed":
            r = g.loc["count"]
            if r.real or r.sim:
                err = f"{100 * r.err:+.1f} %" if np.isfinite(r.err) else "-"
                md.append(f"| {run} | {stage} | {r.rate:g} | FAILED (count) | {r.real:.0f} | {r.sim:.0f} | {err} "
                          "| - | - | - | - | - | - | - |")
            continue
        cells = []
        for st in STATS:
            if st in g.index:
                r = g.loc[st]
                f = 1 if metric == "ttft" else 3 if metric == "e2e" else 2
                cells += [f"{scale[metric] * r.real:.{f}f}", f"{scale[metric] * r.sim:.{f}f}", f"{100 * r.err:+.1f} %"]
            else:
                cells += ["-", "-", "-"]
        r0 = g.iloc[0]
        md.append(f"| {run} | {stage} | {r0.rate:g} | {metric.upper()} ({unit[metric]}) | " + " | ".join(cells)
                  + f" | {int(r0.n_real)} / {int(r0.n_sim)} |")
    if len(a):
        md += ["", "Mean TTFT of the moderate stages by what is modelled (ms; error vs real):", "",
               "| run | stage | real | sync, no frontend (the default before 2026-12) | async only (the default) | async + frontend | "
               "engine-side part of the last |", "|---|---|---|---|---|---|---|"]
        full = t[(t.metric == "ttft") & (t.stat == "mean") & ~t.overload]
        for r in full.itertuples():
            def cell(v, real=r.real):
                return f"{1e3 * v:.1f} ({100 * (v / real - 1):+.1f} %)"
            s_ = a[(a.run == r.run) & (a.stage == r.stage)].set_index("variant")
            md.append(f"| {r.run} | {r.stage} | {1e3 * r.real:.1f} | {cell(s_.loc['sync', 'sim'])} | "
                      f"{cell(s_.loc['async', 'sim'])} | {cell(r.sim)} | {1e3 * r.ttft_engine_mean:.1f} |")
    print(f"H100 runs simulated in {sum(walls):.0f} s (main variant)")
    return md, t
