"""Fidelity report (not a test): how far the calibrated cost model is from real kernels and a real vLLM run.

    .venv/bin/python bench/fidelity.py [--data ../shared/data] [--out bench/results/fidelity.md] [--holdout 0.2]

1. Per operator, for every shipped profile: fit its recipe (sim/cost/calibrate/recipes.py) on all but the largest
   shapes of each microbenchmark file and report the MAPE on the held-out largest shapes (hold-out by shape
   range, not at random), next to the error of the shipped fit on everything.
2. End to end: replay the real vLLM 0.19 run in data/e2e/rtx4090-llama-3.1-8b-vllm-0.19 (300 ShareGPT
   requests with their token ids and real arrival times, Llama-3.1-8B bf16 on an RTX 4090) with the shipped
   RTX 4090 profile and with the spec-sheet prior, and compare TTFT, TPOT, ITL and E2E (mean, P50, P90, P99),
   per-request errors and the 1-second running / waiting / kv_cache_pct series of timeseries.csv.
3. Memory: does the planner derive the run's 2588 KV blocks from its metadata?

Clocks of the real run: ``arrival_time`` is the client's wall clock, the ``*_ts`` fields the engine's monotonic
clock. The offset between them is taken as min(queued_ts − arrival_time) over requests (the request that reached
an idle engine with the least front-end delay); the workload's ``arrival_time_ns`` is the send time relative to
the benchmark start, which is the simulator's t = 0.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fidelity_h100 import H100_RUN, h100_section  # noqa: E402
from policies.base import make_policy  # noqa: E402
from sim.app.config import config_from_dict  # noqa: E402
from sim.app.frontend import apply_frontend, with_frontend  # noqa: E402
from sim.app.memory import plan_memory  # noqa: E402
from sim.app.results import time_series  # noqa: E402
from sim.app.simulate import collect, resolve  # noqa: E402
from sim.cost.calibrate.fit import error_table  # noqa: E402
from sim.cost.calibrate.recipes import RECIPES, fit_recipe, get_recipe, recipe_holdout  # noqa: E402
from sim.cost.hardware import get_gpu  # noqa: E402
from sim.engine.loop import Engine  # noqa: E402
from sim.engine.recorder import Recorder  # noqa: E402
from sim.engine.sources import OpenSource  # noqa: E402
from workloads.runs.engine_jsonl import load_engine_jsonl  # noqa: E402
from workloads.tracefmt import load_vllm_bench  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
RUN = "e2e/rtx4090-llama-3.1-8b-vllm-0.19"
OUT = ROOT / "bench" / "results" / "fidelity.md"
TARGETS = {"ttft": 0.10, "tpot": 0.05, "itl": 0.05, "e2el": 0.05, "op": 0.05}


# ---------------------------------------------------------------------------------------------- operators


def operator_fidelity(micro: Path, frac: float) -> pd.DataFrame:
    rows = []
    for slug in RECIPES:
        recipe = get_recipe(slug)
        gpu = get_gpu(recipe.gpu)
        # the public-data recipes read --data; a packaged one (h200-sxm) its own sim/cost/data/microbench
        _profile, res, bench = fit_recipe(slug, micro if recipe.data == "shared" else None)
        hold = recipe_holdout(slug, bench, frac)
        full = error_table(res.profile, gpu, bench.samples).set_index(["file", "op"])
        for r in hold.itertuples():
            f = full.loc[(r.file, r.op)] if (r.file, r.op) in full.index else None
            rows.append(dict(profile=slug, file=r.file, op=r.op, n_test=r.n_test, mape_test=r.mape_test,
                             n=int(f["n"]) if f is not None else 0,
                             mape_all=float(f["mape"]) if f is not None else math.nan))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- real run


def real_requests(run: Path) -> tuple[pd.DataFrame, dict[str, float]]:
    """The real run's per-request times on the simulator's clock, read by workloads/runs/engine_jsonl.py (which
    documents the clock alignment): ``arrival`` is when the client actually sent it (what vllm bench measures
    latency from), ``scheduled`` the workload's send time the simulator replays."""
    r = load_engine_jsonl(run)
    d = r.requests
    df = pd.DataFrame({"arrival": d["send"].to_numpy(), "scheduled": [s.arrival_time for s in r.specs],
                       "queued": d["queued"].to_numpy(), "first": d["first"].to_numpy(), "last": d["last"].to_numpy(),
                       "prompt_len": d["prompt_len"].to_numpy(), "output_len": d["output_len"].to_numpy(),
                       "ttft": d["ttft"].to_numpy(), "e2el": d["e2el"].to_numpy(), "tpot": d["tpot"].to_numpy()})
    return df, dict(r.clocks)


def simulate_run(run: Path, profile: str, num_gpu_blocks: int | None = None, async_scheduling: bool = False,
                 frontend: dict | None = None) -> tuple[Any, pd.DataFrame, float]:
    """Replay the run; ``num_gpu_blocks`` None = the run's own count (meta.json), else that many blocks.
    ``frontend`` (a ``[frontend]`` table, {} = the priors): the engine sees each request after the input path.
    The real run's timestamps are engine-side, aligned to the client clock by the least queued − sent lag, so
    the simulated ones are aligned the same way: engine times − min(engine arrival − send)."""
    meta = json.loads((run / "meta.json").read_text())
    ek, kv = meta["engine_kwargs"], meta["kv_cache"]
    cfg = config_from_dict({
        "model": {"name": "Llama-3.1-8B", "dtype": "bf16"},
        "hardware": {"gpu": "RTX 4090", "profile": profile},
        "engine": {
            "policy": "vllm",
            "max_num_seqs": ek["max_num_seqs"],
            "max_num_batched_tokens": ek["max_num_batched_tokens"],
            "max_model_len": ek["max_model_len"],
            "enable_prefix_caching": kv["enable_prefix_caching"],
            "block_size": kv["block_size"],
            "gpu_memory_utilization": kv["gpu_memory_utilization"],
            # the KV capacity vLLM measured (the planner's own estimate is checked separately below)
            "num_gpu_blocks_override": num_gpu_blocks or kv["num_gpu_blocks"],
            "async_scheduling": async_scheduling,
        },
        "frontend": {"enabled": False} if frontend is None else frontend,
    })
    setup = resolve(cfg)
    specs = load_vllm_bench(run / "workload-sharegpt-300-sps10.jsonl").specs
    t0 = time.perf_counter()
    env = simpy.Environment(initial_time=0.0)
    rec = Recorder()
    src, send_time = with_frontend(OpenSource(specs), cfg.frontend)
    eng = Engine(env, make_policy("vllm", setup.limits), setup.cost_model, src, rec,
                 async_scheduling=async_scheduling)
    env.run()
    res = apply_frontend(collect(cfg, setup, eng, src, rec, time.perf_counter() - t0), cfg.frontend, send_time)
    r = res.requests.assign(idx=res.requests.request_id.astype(int)).sort_values("idx")
    out = r.output_len.to_numpy(float)
    send = r.send_time.to_numpy(float) if "send_time" in r.columns else r.arrival_time.to_numpy(float)
    lag0 = float((r.arrival_time.to_numpy(float) - send).min())
    df = pd.DataFrame({
        "arrival": send, "first": r.first_token_time.to_numpy() - lag0,
        "last": r.finish_time.to_numpy() - lag0, "num_preemptions": r.num_preemptions.to_numpy(),
        "num_cached_tokens": r.num_cached_tokens.to_numpy(),
    })
    df["ttft"] = df["first"] - df["arrival"]
    df["e2el"] = df["last"] - df["arrival"]
    df["tpot"] = np.where(out > 1, (df["last"] - df["first"]) / np.maximum(out - 1, 1), np.nan)
    return res, df, time.perf_counter() - t0


def stats(x: pd.Series | np.ndarray) -> dict[str, float]:
    a = np.asarray(x, float)
    a = a[np.isfinite(a)]
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99))}


def itl_mean(df: pd.DataFrame, out_len: np.ndarray) -> float:
    """Token-weighted mean gap between output tokens (vLLM's mean ITL) from first/last token times."""
    k = out_len > 1
    return float((df["last"] - df["first"]).to_numpy()[k].sum() / (out_len[k] - 1).sum())


def series_compare(real_ts: pd.DataFrame, sim_ts: pd.DataFrame) -> pd.DataFrame:
    n = min(len(real_ts), len(sim_ts))
    rows = []
    for col in ("running", "waiting", "kv_cache_pct", "gen_throughput", "prompt_throughput"):
        a = real_ts[col].to_numpy(float)
        b = np.zeros(len(a))
        b[:n] = sim_ts[col].to_numpy(float)[:n]
        rows.append(dict(series=col, real_mean=a.mean(), sim_mean=b.mean(), mae=np.abs(a - b).mean(),
                         corr=float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else math.nan))
    return pd.DataFrame(rows)


def memory_check(run: Path) -> dict[str, Any]:
    meta = json.loads((run / "meta.json").read_text())
    ek, kv = meta["engine_kwargs"], meta["kv_cache"]
    plan = plan_memory("Llama-3.1-8B", get_gpu("RTX 4090"), dtype="bf16", gpu_memory_utilization=kv[
        "gpu_memory_utilization"], block_size=kv["block_size"], max_model_len=ek["max_model_len"],
        max_num_batched_tokens=ek["max_num_batched_tokens"], max_num_seqs=ek["max_num_seqs"])
    d = plan.to_dict()
    real_kv = kv["num_gpu_blocks"] * d["block_bytes"]
    # What vLLM left for activations + non-torch memory, given its block count (its KV budget is the rest).
    implied_other = d["requested_memory_bytes"] - d["weight_bytes"] - real_kv
    return {"derived_blocks": d["num_gpu_blocks"], "real_blocks": kv["num_gpu_blocks"],
            "activation_bytes": d["activation_bytes"], "non_torch_bytes": d["non_torch_bytes"],
            "estimated_other_bytes": d["activation_bytes"] + d["non_torch_bytes"],
            "implied_other_bytes_max": implied_other, "block_bytes": d["block_bytes"],
            "device_total_memory_bytes": meta["hardware"]["device_total_memory_bytes"]}


# ---------------------------------------------------------------------------------------------- report


def span(ops: pd.DataFrame, op: str, lm: bool | None = None) -> str:
    """'a-b %' range of held-out MAPE over files for one operator (lm: only / without LM-head files)."""
    d = ops[ops.op == op]
    if lm is not None:
        d = d[d.file.str.contains("per_sequence") == lm]
    return "-" if d.empty else f"{100 * d.mape_test.min():.1f}-{100 * d.mape_test.max():.1f} %"


def pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--holdout", type=float, default=0.2)
    ap.add_argument("--h100-frac", type=float, default=1.0, help="fraction of each H100 stage to simulate")
    args = ap.parse_args(argv)
    micro, run = args.data / "microbench", args.data / RUN
    if not micro.is_dir() or not run.is_dir():
        print(f"shared data not found under {args.data}; nothing to compare against", file=sys.stderr)
        return 1
    md: list[str] = [
        "# servesim fidelity report", "",
        f"Generated by `.venv/bin/python bench/fidelity.py` on {datetime.now().date()}. Targets (issue 4): per "
        "operator ≤ 5 % MAPE on held-out shapes; end to end mean and P90 of E2E and TPOT within 5 %, TTFT within "
        "10 %, ITL within 5 %.", "",
    ]

    # 1. operators
    t0 = time.perf_counter()
    ops = operator_fidelity(micro, args.holdout)
    print(f"operator fits: {time.perf_counter() - t0:.1f} s")
    md += ["## 1. Per operator: held-out MAPE (largest 20 % of each file's shapes not fitted)", "",
           "`MAPE held out`: recipe fitted without the largest shapes of every file, scored on them. `MAPE all`: "
           "the shipped profile on every sample of the file. Both per file and operator.", "",
           "| profile | file | operator | n held out | MAPE held out | n | MAPE all | ≤ 5 % |", "|---|---|---|---|---|---|---|---|"]
    print(f"\n{'profile':24s} {'operator':18s} {'n_test':>6s} {'heldout':>8s} {'all':>7s}  file")
    for r in ops.itertuples():
        ok = "yes" if r.mape_test <= TARGETS["op"] else "no"
        md.append(f"| {r.profile} | `{r.file}` | {r.op} | {r.n_test} | {100 * r.mape_test:.1f} % | {r.n} | "
                  f"{100 * r.mape_all:.1f} % | {ok} |")
        print(f"{r.profile:24s} {r.op:18s} {r.n_test:6d} {100 * r.mape_test:7.1f}% {100 * r.mape_all:6.1f}%  {r.file}")
    summary = ops.groupby(["profile", "op"]).apply(
        lambda g: pd.Series({"files": len(g), "mape_test": np.average(g.mape_test, weights=np.maximum(g.n_test, 1))}),
        include_groups=False).reset_index()
    md += ["", "Sample-weighted over files:", "", "| profile | operator | files | MAPE held out |", "|---|---|---|---|"]
    md += [f"| {r.profile} | {r.op} | {int(r.files)} | {100 * r.mape_test:.1f} % |" for r in summary.itertuples()]

    # 2. end to end
    real, clocks = real_requests(run)
    out_len = real["output_len"].to_numpy(float)
    real_ts = pd.read_csv(run / "timeseries.csv")
    runs = {}
    for label, prof, kw in (("fitted", "auto", {}), ("prior", "prior", {}),
                            ("async_fe", "auto", {"async_scheduling": True, "frontend": {}})):
        res, sim, wall = simulate_run(run, prof, **kw)
        runs[label] = (res, sim, wall)
        print(f"simulated the real run with the {label} profile ({res.meta['profile_source']}) in {wall:.2f} s")
    md += ["", "## 2. End to end: the real vLLM 0.19 run on an RTX 4090", "",
           "300 ShareGPT requests (real token ids, real send times, ~10 req/s: overloaded), Llama-3.1-8B bf16, "
           "max_num_seqs 256, max_num_batched_tokens 2048, chunked prefill and prefix caching on, 2588 KV blocks "
           "(set to the run's value so that timing is compared on the same capacity; see §3 for the planner). "
           f"Clock alignment: engine clock = client clock + min(queued_ts − arrival_time) over requests; send jitter ≤ {clocks['send_jitter_ms']:.1f} ms, front-end lag (queued − sent) mean "
           f"{clocks['frontend_lag_mean_ms']:.0f} ms, max {clocks['frontend_lag_max_ms']:.0f} ms (the `[frontend]` "
           "priors give a near-constant input path, so this spread is not modelled).", "",
           "Last two columns: the fitted profile with `async_scheduling = true` and the `[frontend]` priors "
           "(engine times aligned like the real ones: the input path's least lag is taken out, as the real "
           "clock offset takes out the real one; the output path is not in the real engine timestamps).", "",
           "| metric | stat | real (s) | sim fitted (s) | error | sim prior (s) | error | target | met (fitted) | "
           "sim async + frontend (s) | error |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    print(f"\n{'metric':6s} {'stat':5s} {'real':>10s} {'fitted':>10s} {'err':>8s} {'prior':>10s} {'err':>8s}")
    table = []
    for metric in ("ttft", "tpot", "itl", "e2el"):
        if metric == "itl":
            rs = {"mean": itl_mean(real, out_len)}
            ss = {k: {"mean": itl_mean(runs[k][1], out_len)} for k in runs}
        else:
            rs = stats(real[metric])
            ss = {k: stats(runs[k][1][metric]) for k in runs}
        for st, rv in rs.items():
            fv, pv, av = ss["fitted"][st], ss["prior"][st], ss["async_fe"][st]
            ef, ep, ea = fv / rv - 1, pv / rv - 1, av / rv - 1
            tgt = TARGETS[metric]
            met = "yes" if abs(ef) <= tgt else "no"
            table.append(dict(metric=metric, stat=st, real=rv, fitted=fv, err=ef, prior=pv, err_prior=ep))
            md.append(f"| {metric.upper()} | {st} | {rv:.4f} | {fv:.4f} | {pct(ef)} | {pv:.4f} | {pct(ep)} | "
                      f"±{100 * tgt:.0f} % | {met} | {av:.4f} | {pct(ea)} |")
            print(f"{metric:6s} {st:5s} {rv:10.4f} {fv:10.4f} {pct(ef):>8s} {pv:10.4f} {pct(ep):>8s}")
    # per-request errors
    md += ["", "Per-request relative error of the fitted run ((sim − real)/real, 300 requests):", "",
           "| metric | mean abs | median abs | P90 abs | mean signed | within 10 % | Spearman ρ |",
           "|---|---|---|---|---|---|---|"]
    sim = runs["fitted"][1]
    for metric in ("ttft", "tpot", "e2el"):
        a, b = real[metric].to_numpy(float), sim[metric].to_numpy(float)
        k = np.isfinite(a) & np.isfinite(b) & (a > 0)
        e = (b[k] - a[k]) / a[k]
        rho = pd.Series(a[k]).rank().corr(pd.Series(b[k]).rank())
        md.append(f"| {metric.upper()} | {100 * np.abs(e).mean():.1f} % | {100 * np.median(np.abs(e)):.1f} % | "
                  f"{100 * np.percentile(np.abs(e), 90):.1f} % | {100 * e.mean():+.1f} % | "
                  f"{100 * (np.abs(e) <= 0.1).mean():.0f} % | {rho:.3f} |")
    # time series
    md += ["", f"1-second series against `timeseries.csv` (ticks 1 … {len(real_ts)} s; the simulator's ticks are at the same "
           "offsets from the benchmark start, ±0.05 s):", "",
           "| series | real mean | sim fitted mean | MAE | correlation |", "|---|---|---|---|---|"]
    sc = series_compare(real_ts, time_series(runs["fitted"][0], 1.0))
    for r in sc.itertuples():
        md.append(f"| {r.series} | {r.real_mean:.1f} | {r.sim_mean:.1f} | {r.mae:.1f} | {r.corr:.3f} |")
    res_f = runs["fitted"][0]
    real_dur = float(real["last"].max())
    sim_dur = float(sim["last"].max())
    md += ["", f"Run length (last token): real {real_dur:.1f} s, simulated {sim_dur:.1f} s ({pct(sim_dur / real_dur - 1)}). "
           f"Simulated preemptions: {res_f.meta['num_preemptions']}; prefix-cache hits "
           f"{res_f.meta['prefix_cache'].get('hits', 0)} tokens of {res_f.meta['prefix_cache'].get('queries', 0)} "
           "queried (vLLM logged neither for this run)."]
    # Decode-only seconds: a direct check of decode step time, the part TPOT is made of.
    dec = real_ts[(real_ts.prompt_throughput == 0) & (real_ts.running > 0)]
    sim_ts = time_series(res_f, 1.0)
    sim_dec = sim_ts[(sim_ts.prompt_throughput == 0) & (sim_ts.running > 0)]
    if len(dec) and len(sim_dec):
        r_tok = float((dec.gen_throughput / dec.running).median())
        s_tok = float((sim_dec.gen_throughput / sim_dec.running).median())
        md += ["", f"Decode-only seconds (no prompt tokens that second): real median {r_tok:.1f} tokens/s per running "
               f"request ({1e3 / r_tok:.1f} ms per step at median batch {dec.running.median():.0f}), simulated "
               f"{s_tok:.1f} ({1e3 / s_tok:.1f} ms at median batch {sim_dec.running.median():.0f})."]

    # 3. memory
    mem = memory_check(run)
    diff = mem["real_blocks"] - mem["derived_blocks"]
    md += ["", "## 3. Memory planner", "",
           f"From the run's metadata (device total {mem['device_total_memory_bytes'] / 2**30:.3f} GiB, utilization "
           f"0.9, max_num_batched_tokens 2048, max_num_seqs 256) the planner derives **{mem['derived_blocks']}** "
           f"KV blocks; vLLM reported **{mem['real_blocks']}** ({diff:+d} blocks, "
           f"{100 * diff / mem['real_blocks']:+.2f} %). The planner reserves "
           f"{mem['estimated_other_bytes'] / 2**20:.0f} MiB for activations "
           f"({mem['activation_bytes'] / 2**20:.0f} MiB) and non-torch memory ({mem['non_torch_bytes'] / 2**20:.0f} "
           f"MiB); vLLM's block count implies at most {mem['implied_other_bytes_max'] / 2**20:.0f} MiB (one block is "
           f"{mem['block_bytes'] / 2**20:.0f} MiB), so the estimate is "
           f"{(mem['estimated_other_bytes'] - mem['implied_other_bytes_max']) / 2**20:.0f} MiB too high. "
           "The replay above uses the real 2588."]
    _, sim_p, _ = simulate_run(run, "auto", mem["derived_blocks"])
    e2e_p, ttft_p = float(sim_p["e2el"].mean()), float(sim_p["ttft"].mean())
    e2e_r, ttft_r = float(real["e2el"].mean()), float(real["ttft"].mean())
    md += ["", f"Replayed with the planner's {mem['derived_blocks']} blocks instead: E2E mean {e2e_p:.2f} s "
           f"({pct(e2e_p / e2e_r - 1)}), TTFT mean {ttft_p:.2f} s ({pct(ttft_p / ttft_r - 1)}). KV capacity binds in "
           "this overloaded run (kv_cache_pct sits at 95-100 %), so the block count feeds straight into queueing."]

    # 4. what dominates the remaining error
    real_ts_m = real_ts.merge(sim_ts, on="t", suffixes=("_r", "_s"))
    both = real_ts_m[(real_ts_m.prompt_throughput_r == 0) & (real_ts_m.prompt_throughput_s == 0)
                     & (real_ts_m.running_r > 0) & (real_ts_m.running_s > 0)]
    step_r = float((1e3 * both.running_r / both.gen_throughput_r).median()) if len(both) else math.nan
    step_s = float((1e3 * both.running_s / both.gen_throughput_s).median()) if len(both) else math.nan
    steps = res_f.steps
    mixed = steps.num_prefill_tokens > 0
    t_dec, t_mix = float(steps.duration[~mixed].sum()), float(steps.duration[mixed].sum())
    pf_sim = int(steps.num_prefill_tokens.sum())
    pf_real = int(real["prompt_len"].sum())
    e2e_err = float(sim["e2el"].mean() / real["e2el"].mean() - 1)
    md += ["", "## 4. What dominates the remaining error", "",
           f"- The run is overloaded, so E2E and TTFT are mostly queueing (real TTFT mean {real['ttft'].mean():.0f} s "
           f"of E2E {real['e2el'].mean():.0f} s) and queueing is set by throughput: the simulated run ends "
           f"{pct(sim_dur / real_dur - 1)} early and E2E is {pct(e2e_err)}; the per-request E2E ranks match "
           "(Spearman ≈ 1).",
           f"- Decode steps are the largest share of simulated GPU time ({t_dec:.0f} s decode-only vs {t_mix:.0f} s "
           f"with a prefill chunk). In the {len(both)} seconds where both runs only decoded, the simulated step is "
           f"{step_s:.1f} ms against {step_r:.1f} ms real ({pct(step_s / step_r - 1)}). That gap dominates. The "
           "microbenchmarks are kernel times of an eager one-layer model, so they cannot see the engine's own "
           "per-step cost (the profile keeps the BLIS prior of 126 µs + 4.4 µs per sequence); the decode "
           "attention term is fitted on uniform-context batches, while real batches mix short and long contexts "
           "(LLMServingSim measures +24 % for a skewed 4-sequence batch); both make real decode steps slower.",
           f"- TPOT is closer ({pct(float(sim['tpot'].mean() / real['tpot'].mean() - 1))}) than decode-only steps "
           "because the mixed steps (a prefill chunk plus decodes), whose decode-attention term has the largest "
           "operator error (attn_mixed in §1), come out longer.",
           f"- Prompt throughput is not comparable as logged: vLLM counts each prompt once ({pf_real} tokens in "
           f"total here), the simulator's series counts every prefill token computed, including {pf_sim - pf_real} "
           f"recomputed after its {res_f.meta['num_preemptions']} preemptions (sim/results.time_series).",
           f"- The first second: vLLM's first request took {real['ttft'].iloc[0]:.2f} s to its first token "
           f"({real['prompt_len'].iloc[0]}-token prompt, idle engine), the simulator {sim['ttft'].iloc[0]:.2f} s: "
           "warm-up of the real engine that the simulator does not model.",
           f"- Per operator (§1): layer GEMMs {span(ops, 'gemm', lm=False)} held out, LM head "
           f"{span(ops, 'gemm', lm=True)} (its largest batches cross a cuBLAS kernel switch the smooth roofline "
           f"does not follow), decode attention {span(ops, 'attn_decode')}. Elementwise kernels (1-4 % of a "
           "step) run partly from L2 in one-layer profiles (faster than HBM allows); attention kernels switch code "
           "paths (split-KV, CTA waves, L2-resident KV) that a few closed-form terms follow only roughly."]
    # 5. the H100 runs (async scheduling + the front-end priors)
    h100_lines: list[str] = []
    if (args.data / H100_RUN / "cases.json").is_file():
        h100, ht = h100_section(args.data, args.h100_frac)
        md += h100
        mod = ht[~ht.overload]
        sel = {(m, st): mod[(mod.metric == m) & (mod.stat == st)].err for m, st in
               (("ttft", "mean"), ("ttft", "p99"), ("e2e", "mean"), ("e2e", "p99"), ("itl", "mean"))}
        rng = "; ".join(f"{m.upper()} {st} {pct(e.min())} … {pct(e.max())}" for (m, st), e in sel.items())
        h100_lines = [f"- H100 runs, the 5 unsaturated stages, async + `[frontend]` priors: {rng} (§5)."]
        fails = ht[(ht.metric == "failed") & ht.overload]
        if len(fails):
            h100_lines.append(f"- Overloaded H100 run with `client_timeout_s = 300`: {int(fails.sim.sum())} requests "
                              f"timed out vs {int(fails.real.sum())} real failures "
                              f"({pct(fails.sim.sum() / fails.real.sum() - 1)}) (§5).")
    n_ok = int((ops.mape_test <= TARGETS["op"]).sum())
    rng = ops.groupby("op").mape_test.agg(["min", "max"])
    ranges = ", ".join(f"{op} {100 * r['min']:.0f}-{100 * r['max']:.0f} %" for op, r in rng.iterrows())
    e_prior = float(runs["prior"][1]["e2el"].mean() / real["e2el"].mean() - 1)
    afe = runs["async_fe"][1]
    e_afe, t_afe = (float(afe[m].mean() / real[m].mean() - 1) for m in ("e2el", "ttft"))
    i_afe = itl_mean(afe, out_len) / itl_mean(real, out_len) - 1
    summary_lines = ["## Summary", "",
                     f"- Per operator (held out): {n_ok} of {len(ops)} (file, operator) pairs within 5 %. Ranges "
                     f"over files and profiles: {ranges} (§1).",
                     f"- End to end (RTX 4090, fitted profile): E2E mean {pct(e2e_err)}, TTFT mean "
                     f"{pct(float(sim['ttft'].mean() / real['ttft'].mean() - 1))}, TPOT mean "
                     f"{pct(float(sim['tpot'].mean() / real['tpot'].mean() - 1))} (every mean/P50/P90/P99 in §2); "
                     f"with the spec-sheet prior E2E mean {pct(e_prior)}; fitted with async scheduling and the "
                     f"`[frontend]` priors E2E mean {pct(e_afe)}, TTFT mean {pct(t_afe)}, ITL mean {pct(i_afe)}.",
                     f"- Memory planner: {mem['derived_blocks']} blocks vs {mem['real_blocks']} real (§3).",
                     *h100_lines, ""]
    md[4:4] = summary_lines
    text = "\n".join(md) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"\nmemory planner: {mem['derived_blocks']} blocks derived vs {mem['real_blocks']} real")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
