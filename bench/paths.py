"""Speed of the simulator's common paths (not a test): requests of simulated work per wall second.

    .venv/bin/python bench/paths.py [--n 20000] [--repeat 1] [--only NAME ...]

Each path is one config through sim.app.simulate (Llama-3-8B on one A100-80GB, the `vllm` policy,
max_num_seqs 128, roofline cost): Poisson baseline, shared prefixes with caching, multi-turn sessions,
a closed loop, the baseline with vLLM's async scheduling, chunked prefill of long prompts (2,048-token
budget, prompts ~5k tokens), and clusters of 4 and 16 replicas (sim.app.cluster, least-outstanding
router, the baseline's per-replica rate). Each path is printed in requests/s and as a ratio to the
baseline's requests/s in the same round (issue 12 asks for >= 0.5 everywhere). A machine probe is
printed beside the numbers (this machine's speed drifts by a third within minutes): compare versions
in alternating runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim.app.cluster import simulate_cluster  # noqa: E402
from sim.app.config import config_from_dict  # noqa: E402
from sim.app.simulate import simulate  # noqa: E402

BASE = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
        "engine": {"policy": "vllm", "max_num_seqs": 128, "max_model_len": 8192}}  # fmt: skip
LENGTHS = {"prompt": {"dist": "lognormal", "mean": 1000, "std": 600, "min": 16, "max": 6000},
           "output": {"dist": "lognormal", "mean": 200, "std": 150, "min": 4, "max": 2000}}  # fmt: skip
LONG = {"prompt": {"dist": "lognormal", "mean": 5000, "std": 1500, "min": 512, "max": 7800},
        "output": {"dist": "lognormal", "mean": 200, "std": 150, "min": 4, "max": 1000}}  # fmt: skip


def paths(n: int) -> dict[str, dict]:
    """The configs, each of about ``n`` requests."""
    poisson = {"num_requests": n, "rate": 6.0, **LENGTHS}
    return {
        "poisson": {"workload": poisson},
        "shared_prefix": {"workload": {**poisson, "shared_prefix": {"num_groups": 8, "prefix_len": 512}}},
        "sessions": {"workload": {"kind": "sessions", "num_sessions": max(n // 10, 1), "rate": 0.6,
                                  "turns": {"dist": "uniform", "low": 4, "high": 16},
                                  "message": {"dist": "uniform", "low": 40, "high": 200},
                                  "output": {"dist": "uniform", "low": 20, "high": 200},
                                  "system_prompt": {"num_prompts": 4, "len": 400}, "think_time": 5.0}},
        "closed_loop": {"workload": {"kind": "closed", "num_clients": 64, "num_requests": n, "think_time": 1.0,
                                     **LENGTHS}},
        "async_scheduling": {"workload": poisson, "engine": {"async_scheduling": True}},
        "chunked_long": {"workload": {"num_requests": n, "rate": 1.5, **LONG},
                         "engine": {"enable_chunked_prefill": True, "max_num_batched_tokens": 2048}},
        "replicas_4": {"workload": {**poisson, "rate": 4 * 6.0},
                       "cluster": {"replicas": 4, "router": "least-outstanding"}},
        "replicas_16": {"workload": {**poisson, "rate": 16 * 6.0},
                        "cluster": {"replicas": 16, "router": "least-outstanding"}},
    }  # fmt: skip


def run(name: str, extra: dict) -> tuple[int, float]:
    raw = {**BASE, **extra, "engine": {**BASE["engine"], **extra.get("engine", {})}}
    t0 = time.perf_counter()
    res = simulate_cluster(raw) if "cluster" in raw else simulate(config_from_dict(raw))
    return len(res.requests), time.perf_counter() - t0


def probe() -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(10_000_000):
        s += i
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000, help="requests per path (sessions: n/10 sessions)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the paths (each prints its ratios)")
    ap.add_argument("--only", nargs="*", help="paths to run (default: all; poisson always runs, first)")
    args = ap.parse_args(argv)
    cfgs = paths(args.n)
    unknown = [x for x in args.only or () if x not in cfgs]
    if unknown:
        print(f"--only: unknown path {unknown[0]!r}; expected one of {', '.join(cfgs)}", file=sys.stderr)
        return 2
    names = ["poisson", *[x for x in args.only or cfgs if x != "poisson"]]
    print(f"machine probe (10 M additions): {probe():.2f} s")
    for r in range(args.repeat):
        base = 0.0
        for name in names:
            n, wall = run(name, cfgs[name])
            rate = n / wall
            base = base or rate
            print(f"round {r + 1}  {name:17s} {n:8,d} requests  {wall:7.2f} s  {rate:8,.0f} req/s  "
                  f"{rate / base:5.2f} x baseline", flush=True)
        print(f"machine probe (10 M additions): {probe():.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
