"""Generate examples/sample_trace.jsonl: 200 requests in servesim's JSONL trace format.

Chat-like traffic at ~3 req/s with bursts (Gamma, burstiness 0.5), four shared system prompts
(so prefix caching has something to hit) and lognormal lengths. Deterministic (seed 0):

    .venv/bin/python examples/make_sample_trace.py
"""

from __future__ import annotations

from pathlib import Path

from workloads.synthetic import build_workload
from workloads.tracefmt.jsonl import save_jsonl

OUT = Path(__file__).with_name("sample_trace.jsonl")

CONFIG = {
    "arrival": "gamma",
    "rate": 3.0,
    "burstiness": 0.5,
    "num_requests": 200,
    "prompt": {"dist": "lognormal", "mean": 600, "std": 400, "min": 16, "max": 4000},
    "output": {"dist": "lognormal", "mean": 180, "std": 120, "min": 4, "max": 1500},
    "shared_prefix": {"num_groups": 4, "prefix_len": 384},
}


def main() -> None:
    workload = build_workload(CONFIG, seed=0)
    n = save_jsonl(workload.specs, OUT)
    print(f"wrote {n} requests to {OUT}")


if __name__ == "__main__":
    main()
