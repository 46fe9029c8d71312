"""`servesim demo`: the seed articles' story, simulated.

A 7B model (32 layers, 8 KV heads, head_dim 128, FP16) on a 24 GB card with 22.5 GiB usable: 5.7 GiB of
KV holds about 11 requests of 4K tokens. Closed-loop concurrency is raised 4 -> 8 -> 16 -> 32 with ~4K
contexts. Every number printed comes from the simulation or the memory planner, none from the text.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pandas as pd

from sim.app.config import config_from_dict
from sim.app.memory import seeds_example_plan
from sim.app.outputs import write_outputs
from sim.app.results import SimResult, summarize
from sim.app.simulate import simulate

CONCURRENCY = (4, 8, 16, 32)

SEED_SCENARIO: dict[str, Any] = {
    "model": {"name": "seed-7b", "dtype": "fp16"},
    "hardware": {"gpu": "24GB"},
    "engine": {
        "policy": "vllm",
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "overhead_gib": 1.5,  # the seeds' "activations + runtime" allowance
    },
    "workload": {
        "kind": "closed",
        "num_clients": 4,
        "num_requests": 192,
        "think_time": 0.0,
        "prompt": {"dist": "uniform", "low": 3000, "high": 3600},
        "output": {"dist": "uniform", "low": 300, "high": 490},
    },
    "simulation": {"seed": 0},
    "slo": {"ttft_ms": 1000, "tpot_ms": 50},
}


def scenario(concurrency: int, num_requests: int | None = None, policy: str = "vllm") -> dict[str, Any]:
    raw = copy.deepcopy(SEED_SCENARIO)
    raw["workload"]["num_clients"] = concurrency
    if num_requests is not None:
        raw["workload"]["num_requests"] = num_requests
    raw["engine"]["policy"] = policy
    return raw


def run_levels(num_requests: int | None = None) -> dict[int, tuple[SimResult, dict[str, Any]]]:
    runs = {}
    for c in CONCURRENCY:
        cfg = config_from_dict(scenario(c, num_requests))
        result = simulate(cfg)
        runs[c] = (result, summarize(result, slo=cfg.slo))
    return runs


def table(runs: dict[int, tuple[SimResult, dict[str, Any]]]) -> pd.DataFrame:
    rows = []
    for c, (_res, s) in runs.items():
        rows.append(
            {
                "concurrency": c,
                "req/s": s["request_throughput"],
                "out tok/s": s["output_throughput"],
                "TTFT p50 ms": s["median_ttft_ms"],
                "TTFT p99 ms": s["p99_ttft_ms"],
                "TPOT p50 ms": s["median_tpot_ms"],
                "TPOT p99 ms": s["p99_tpot_ms"],
                "KV mean %": 100 * s["mean_kv_cache_usage"],
                "KV max %": 100 * s["max_kv_cache_usage"],
                "running mean": s["mean_num_running"],
                "waiting mean": s["mean_num_waiting"],
                "preemptions": s["num_preemptions"],
                "goodput req/s": s["request_goodput"],
            }
        )
    return pd.DataFrame(rows).set_index("concurrency")


def story(df: pd.DataFrame) -> str:
    """The seeds' point, read off the simulated numbers (so it stays honest if the model changes)."""
    lo, hi = df.index.min(), df.index.max()
    thr_gain = df.loc[hi, "out tok/s"] / df.loc[lo, "out tok/s"]
    ttft_x = df.loc[hi, "TTFT p50 ms"] / df.loc[lo, "TTFT p50 ms"]
    tpot_x = df.loc[hi, "TPOT p50 ms"] / df.loc[lo, "TPOT p50 ms"]
    return (
        f"Concurrency x{hi // lo} ({lo} -> {hi}): output throughput x{thr_gain:.2f}, "
        f"median TTFT x{ttft_x:.1f}, median TPOT x{tpot_x:.2f}. At {hi} clients the KV pool peaks at "
        f"{df.loc[hi, 'KV max %']:.0f}% with on average {df.loc[hi, 'running mean']:.1f} requests running and "
        f"{df.loc[hi, 'waiting mean']:.1f} waiting: the extra clients queue (vLLM admits only what fits; "
        "an engine that preallocated 32 x 4K contexts would not fit in memory at all)."
    )


def run_demo(out: Path, quick: bool = False, plotlyjs: str | None = "directory") -> pd.DataFrame:
    """Print the story, write report.html and one folder per level under ``out``: one plotly.min.js in
    ``out`` serves every page; the per-level folders hold the Parquet tables, not steps.jsonl (the same
    counts as steps.parquet, 9 MB of text over the four levels)."""
    from sim.app.plotlyjs import PlotlyJS
    from sim.app.report import write_comparison_report

    out.mkdir(parents=True, exist_ok=True)
    plan = seeds_example_plan()
    print("== Memory arithmetic (the seeds' worked example, from servesim's planner) ==")
    print(plan.format())
    print()
    runs = run_levels(num_requests=48 if quick else None)
    df = table(runs)
    print("== Closed-loop concurrency sweep: 7B FP16 on a 24 GB card, ~4K contexts, vLLM V1 policy ==")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 1):
        print(df.to_string(float_format=lambda v: f"{v:.1f}"))
    print()
    text = story(df)
    print(text)
    df.to_csv(out / "concurrency_sweep.csv")
    js = PlotlyJS(plotlyjs or "directory", out)
    for c, (res, s) in runs.items():
        write_outputs(res, out / f"concurrency_{c}", summary=s, title=f"servesim demo: concurrency {c}",
                      plotlyjs=js, step_trace=False)  # fmt: skip
    report = out / "report.html"
    intro = (
        "<pre>" + plan.format() + "</pre><p>" + text + "</p>"
        + df.to_html(float_format=lambda v: f"{v:.1f}")
    )
    write_comparison_report(
        {f"concurrency {c}": run for c, run in runs.items()}, report,
        title="servesim demo: one 24 GB card, 7B model, concurrency 4 to 32", intro_html=intro, plotlyjs=js,
    )
    print(f"\nwrote {report} and per-run tables under {out}/")
    return df
