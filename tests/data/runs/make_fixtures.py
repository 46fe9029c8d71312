"""Builds the fixtures beside it from the documented schemas: a ``vllm bench serve --save-result --save-detailed``
result (keys of vllm/benchmarks/serve.py) and two Prometheus scrapes of a vLLM V1 server's /metrics (its metric
names and bucket edges). The numbers are synthetic (a Llama-3.1-8B-like run on an RTX 4090-class card), not a
measurement. Run from the repository root: ``python tests/data/runs/make_fixtures.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "meta-llama/Llama-3.1-8B"
LABELS = f'engine="0",model_name="{MODEL}"'


def bench_result(rng: np.random.Generator, n: int = 40, rate: float = 4.0) -> dict:
    inp = rng.integers(100, 900, n)
    out = rng.integers(20, 160, n)
    start = np.cumsum(rng.exponential(1 / rate, n))
    start *= (n / rate) / start[-1]  # vLLM rescales the last send to N / rate
    ttft = np.round(0.03 + 0.00004 * inp + rng.exponential(0.01, n), 6)
    itls = [list(np.round(0.022 + rng.exponential(0.002, o - 1), 6)) for o in out]
    errors = [""] * n
    errors[5] = "ClientResponseError: 500, message='Internal Server Error'"
    ok = np.array([not e for e in errors])
    out_lens = np.where(ok, out, 0)
    lat = ttft + np.array([sum(g) for g in itls])
    duration = float((start + lat)[ok].max())
    res = {"date": "20260301-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
           "model_id": MODEL, "tokenizer_id": MODEL, "num_prompts": n,
           # --metadata gpu=... max_num_seqs=... max_model_len=... vllm_version=... (strings, as vLLM writes them)
           "gpu": "RTX 4090", "max_num_seqs": "64", "max_model_len": "8192", "vllm_version": "0.19.0",
           "request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
           "duration": duration, "completed": int(ok.sum()), "failed": int((~ok).sum()),
           "total_input_tokens": int(inp[ok].sum()), "total_output_tokens": int(out_lens.sum()),
           "request_throughput": float(ok.sum()) / duration, "request_goodput": None,
           "output_throughput": float(out_lens.sum()) / duration,
           "total_token_throughput": float(inp[ok].sum() + out_lens.sum()) / duration,
           "input_lens": inp.tolist(), "output_lens": out_lens.tolist(),
           "ttfts": np.where(ok, ttft, 0.0).tolist(), "itls": [g if k else [] for g, k in zip(itls, ok, strict=True)],
           "latencies": np.where(ok, lat, 0.0).tolist(), "start_times": (1000.0 + start).tolist(),
           "generated_texts": ["xyz" if k else "" for k in ok], "errors": errors,
           "max_output_tokens_per_s": 200.0, "max_concurrent_requests": 12}  # fmt: skip
    o = out[ok]
    tpot = ((lat - ttft)[ok] / (o - 1))[o > 1]
    gaps = np.array([g for g, k in zip(itls, ok, strict=True) if k for g in g])
    for name, v in (("ttft", ttft[ok]), ("tpot", tpot), ("itl", gaps), ("e2el", lat[ok])):
        res[f"mean_{name}_ms"] = float(v.mean() * 1000)
        res[f"median_{name}_ms"] = float(np.median(v) * 1000)
        res[f"std_{name}_ms"] = float(v.std() * 1000)
        res[f"p99_{name}_ms"] = float(np.percentile(v, 99) * 1000)
    return res


def hist(name: str, help_: str, edges: list[float], values: list[float]) -> list[str]:
    v = np.asarray(values, float)
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{LABELS},le="{e}"}} {float((v <= e).sum())}' for e in edges]
    lines += [f'{name}_bucket{{{LABELS},le="+Inf"}} {float(len(v))}', f"{name}_count{{{LABELS}}} {float(len(v))}",
              f"{name}_sum{{{LABELS}}} {float(v.sum())}"]  # fmt: skip
    return lines


def scrape(d: dict[str, list[float]], running: float = 0.0, waiting: float = 0.0, kv: float = 0.0) -> str:
    lines = ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
             "# TYPE vllm:cache_config_info gauge",
             'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",'
             'gpu_memory_utilization="0.9",num_gpu_blocks="2588"} 1.0',
             "# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{LABELS}}} {running}",
             "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
             "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{LABELS}}} {waiting}",
             "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
             "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{LABELS}}} {kv}",
             "# HELP vllm:request_success_total Count of successfully processed requests.",
             "# TYPE vllm:request_success_total counter",
             f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} '
             f"{float(len(d['e2el']))}"]  # fmt: skip
    lat = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
    lines += hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lat, d["ttft"])
    lines += hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                  [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5], d["itl"])
    lines += hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                  [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0], d["e2el"])
    lines += hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                  [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0], d["queue"])
    lines += hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                  [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], d["prompt"])
    lines += hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                  [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], d["output"])
    return "\n".join(lines) + "\n"


def scrapes(rng: np.random.Generator, m: int = 60) -> tuple[str, str]:
    warm = {"ttft": [0.05, 0.07], "e2el": [1.2, 1.9], "itl": [0.023] * 60, "queue": [0.0, 0.0],
            "prompt": [300, 450], "output": [30, 32]}  # fmt: skip
    ttft = 0.04 + rng.exponential(0.02, m)
    out = rng.integers(40, 120, m)
    run = {"ttft": list(ttft), "e2el": list(ttft + out * 0.0235),
           "itl": list(0.022 + rng.exponential(0.003, int(out.sum() - m))), "queue": [0.0] * m,
           "prompt": list(rng.integers(100, 900, m)), "output": list(out)}  # fmt: skip
    after = {k: warm[k] + run[k] for k in warm}
    return scrape(warm), scrape(after)


def main() -> None:
    rng = np.random.default_rng(7)
    (HERE / "vllm_bench_result.json").write_text(json.dumps(bench_result(rng)))
    before, after = scrapes(rng)
    d = HERE / "prometheus"
    d.mkdir(exist_ok=True)
    (d / "metrics_before.prom").write_text(before)
    (d / "metrics_after.prom").write_text(after)


if __name__ == "__main__":
    main()
