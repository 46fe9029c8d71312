"""Build tests/data/runs fixtures from the documented schemas (vLLM benchmarks/serve.py; vLLM /metrics names).
Synthetic numbers: a Llama-3.1-8B-like run on an RTX 4090-class card (not a real measurement)."""
import json
import numpy as np
rng = np.random.default_rng(7)
n = 40
rate = 4.0
inp = rng.integers(100, 900, n).tolist()
out = rng.integers(20, 160, n).tolist()
gaps = rng.exponential(1 / rate, n); start = np.cumsum(gaps); start *= (n / rate) / start[-1]
ttft = (0.03 + 0.00004 * np.array(inp) + rng.exponential(0.01, n)).round(6)
itls = [list(np.round(0.022 + rng.exponential(0.002, o - 1), 6)) for o in out]
errors = [""] * n
out_lens = list(out)
errors[5] = "ClientResponseError: 500, message='Internal Server Error'"; out_lens[5] = 0
ok = [e == "" for e in errors]
lat = [t + sum(g) for t, g in zip(ttft, itls)]
t0 = 1000.0
res = {"date": "20260301-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
       "model_id": "meta-llama/Llama-3.1-8B", "tokenizer_id": "meta-llama/Llama-3.1-8B", "num_prompts": n,
       "gpu": "RTX 4090", "max_num_seqs": "64", "max_model_len": "8192", "vllm_version": "0.19.0",
       "request_rate": rate, "burstiness": 1.0, "max_concurrency": None}
okt = [t for t, k in zip(ttft, ok) if k]; oke = [l for l, k in zip(lat, ok) if k]
okl = [o for o, k in zip(out_lens, ok) if k]
tp = [(l - t) / (o - 1) for t, l, o in zip(okt, oke, okl) if o > 1]
itl_all = [g for g, k in zip(itls, ok) if k for g in g]
duration = float(max(s + l for s, l, k in zip(start, lat, ok) if k))
res.update({"duration": duration, "completed": sum(ok), "failed": n - sum(ok),
            "total_input_tokens": int(sum(i for i, k in zip(inp, ok) if k)), "total_output_tokens": int(sum(okl)),
            "request_throughput": sum(ok) / duration, "request_goodput": None,
            "output_throughput": sum(okl) / duration,
            "total_token_throughput": (sum(i for i, k in zip(inp, ok) if k) + sum(okl)) / duration,
            "input_lens": inp, "output_lens": out_lens, "ttfts": [float(t) if k else 0.0 for t, k in zip(ttft, ok)],
            "itls": [g if k else [] for g, k in zip(itls, ok)], "latencies": [float(l) if k else 0.0 for l, k in zip(lat, ok)],
            "start_times": [float(t0 + s) for s in start],
            "generated_texts": ["x" * 3 if k else "" for k in ok], "errors": errors,
            "max_output_tokens_per_s": 200.0, "max_concurrent_requests": 12})
for name, vals in (("ttft", okt), ("tpot", tp), ("itl", itl_all), ("e2el", oke)):
    v = np.asarray(vals)
    res[f"mean_{name}_ms"] = float(v.mean() * 1000); res[f"median_{name}_ms"] = float(np.median(v) * 1000)
    res[f"std_{name}_ms"] = float(v.std() * 1000); res[f"p99_{name}_ms"] = float(np.percentile(v, 99) * 1000)
json.dump(res, open("tests/data/runs/vllm_bench_result.json", "w"))

# Prometheus: before / after scrapes of a vLLM V1 server (metric names and bucket edges as vLLM exports them)
def hist(name, help_, edges, values, labels='engine="0",model_name="meta-llama/Llama-3.1-8B"'):
    v = np.asarray(values)
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    for e in edges:
        lines.append(f'{name}_bucket{{{labels},le="{e}"}} {float((v <= e).sum())}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(len(v))}')
    lines.append(f"{name}_count{{{labels}}} {float(len(v))}")
    lines.append(f"{name}_sum{{{labels}}} {float(v.sum())}")
    return lines
L = 'engine="0",model_name="meta-llama/Llama-3.1-8B"'
def scrape(ttft_v, e2e_v, itl_v, q_v, p_v, o_v, running, waiting, kv):
    lines = ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig", "# TYPE vllm:cache_config_info gauge",
             f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="2588"}} 1.0',
             "# HELP vllm:num_requests_running Number of requests in model execution batches.", "# TYPE vllm:num_requests_running gauge",
             f"vllm:num_requests_running{{{L}}} {running}",
             "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.", "# TYPE vllm:num_requests_waiting gauge",
             f"vllm:num_requests_waiting{{{L}}} {waiting}",
             "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.", "# TYPE vllm:kv_cache_usage_perc gauge",
             f"vllm:kv_cache_usage_perc{{{L}}} {kv}",
             "# HELP vllm:request_success_total Count of successfully processed requests.", "# TYPE vllm:request_success_total counter",
             f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="meta-llama/Llama-3.1-8B"}} {float(len(e2e_v))}']
    lines += hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                  [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0], ttft_v)
    lines += hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                  [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5], itl_v)
    lines += hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                  [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0], e2e_v)
    lines += hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                  [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0], q_v)
    lines += hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], p_v)
    lines += hist("vllm:request_generation_tokens", "Number of generation tokens processed.", [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], o_v)
    return "\n".join(lines) + "\n"
warm = dict(ttft_v=[0.05, 0.07], e2e_v=[1.2, 1.9], itl_v=[0.023] * 60, q_v=[0.0, 0.0], p_v=[300, 450], o_v=[30, 32])
m = 60
ttft_r = 0.04 + rng.exponential(0.02, m); out_r = rng.integers(40, 120, m); itl_r = 0.022 + rng.exponential(0.003, int(out_r.sum() - m))
e2e_r = ttft_r + out_r * 0.0235
after = dict(ttft_v=warm["ttft_v"] + list(ttft_r), e2e_v=warm["e2e_v"] + list(e2e_r), itl_v=warm["itl_v"] + list(itl_r),
             q_v=warm["q_v"] + [0.0] * m, p_v=warm["p_v"] + list(rng.integers(100, 900, m)), o_v=warm["o_v"] + list(out_r))
import pathlib
d = pathlib.Path("tests/data/runs/prometheus"); d.mkdir(exist_ok=True)
(d / "metrics_before.prom").write_text(scrape(**warm, running=0.0, waiting=0.0, kv=0.0))
(d / "metrics_after.prom").write_text(scrape(**after, running=0.0, waiting=0.0, kv=0.0))
print("ok")
