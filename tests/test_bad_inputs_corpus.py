"""The hostile corpus, part two: bad values for every section and subcommand and for each file format,
each with the fragments its one line must name (tests/test_bad_inputs.py holds part one and the harness).
Every case must end in exit code 2 and one line, before any engine runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_bad_inputs import QUICK, SEED, SIZING, _binary, _file, _small, no_simulation, run_bad_case  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = str(ROOT / "examples" / "cluster_tp.toml")
SAMPLE = str(ROOT / "examples" / "sample_trace.jsonl")
P = ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090"]
G = ["--grid", "engine.max_num_seqs=4,8"]


def q(*sets: str) -> list[str]:
    """``run quickstart.toml --set a --set b ...``"""
    argv = ["run", QUICK]
    for s in sets:
        argv += ["--set", s]
    return argv


def _write(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def _jsonl(tmp: Path, *rows: dict, name: str = "t.jsonl") -> str:
    return _write(tmp, name, "".join(json.dumps(r) + "\n" for r in rows))


ROW = {"request_id": "a", "arrival_time": 0.0, "prompt_len": 20, "output_len": 5}
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


def _toml(tmp: Path, body: str) -> str:
    return _write(tmp, "c.toml", body)


BASE = """[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "A100 80GB"
[workload]
rate = 2.0
num_requests = 10
prompt = 100
output = 10
"""

CASES = [
    # ---- files and TOML ----
    ("config-missing", lambda t: ["run", str(t / "nope.toml")], ["nope.toml"]),
    ("config-is-dir", lambda t: ["run", str(t)], ["TMP"]),
    ("config-toml-syntax", lambda t: ["run", _toml(t, "[model\nname=1")], ["c.toml"]),
    ("config-unknown-section", lambda t: ["run", _toml(t, BASE + "[foo]\nx = 1\n")], ["foo"]),
    ("config-unknown-engine-key", lambda t: q("engine.max_num_seq=4"), ["max_num_seq", "max_num_seqs"]),
    ("config-section-not-table", lambda t: ["run", _toml(t, 'engine = "vllm"\n' + BASE)], ["engine"]),
    ("set-no-equals", lambda t: q("engine.max_num_seqs"), ["engine.max_num_seqs"]),
    ("set-no-section", lambda t: q("max_num_seqs=4"), ["max_num_seqs"]),
    ("set-empty-value", lambda t: q("engine.max_num_seqs="), ["max_num_seqs", "''"]),
    ("set-bad-toml-value", lambda t: q("workload.prompt={dist="), ["workload.prompt"]),
    # ---- [engine] ----
    ("max_num_seqs-0", lambda t: q("engine.max_num_seqs=0"), ["max_num_seqs", "0"]),
    ("max_num_seqs-neg", lambda t: q("engine.max_num_seqs=-3"), ["max_num_seqs", "-3"]),
    ("max_num_seqs-float", lambda t: q("engine.max_num_seqs=1.5"), ["max_num_seqs", "1.5"]),
    ("max_num_seqs-string", lambda t: q('engine.max_num_seqs="many"'), ["max_num_seqs", "many"]),
    ("max_num_seqs-bool", lambda t: q("engine.max_num_seqs=true"), ["max_num_seqs", "True"]),
    ("max_num_batched_tokens-0", lambda t: q("engine.max_num_batched_tokens=0"), ["max_num_batched_tokens", "0"]),
    ("max_model_len-0", lambda t: q("engine.max_model_len=0"), ["max_model_len", "0"]),
    ("max_model_len-beyond-model", lambda t: q("engine.max_model_len=10000000"), ["max_model_len", "10000000"]),
    ("gpu_memory_utilization-0", lambda t: q("engine.gpu_memory_utilization=0"), ["gpu_memory_utilization", "0"]),
    ("gpu_memory_utilization-1.5", lambda t: q("engine.gpu_memory_utilization=1.5"),
     ["gpu_memory_utilization", "1.5"]),
    ("block_size-0", lambda t: q("engine.block_size=0"), ["block_size", "0"]),
    ("policy-unknown", lambda t: q('engine.policy="vllm2"'), ["policy", "vllm2"]),
    ("policy-number", lambda t: q("engine.policy=3"), ["policy", "3"]),
    ("scheduling_policy-lifo", lambda t: q('engine.scheduling_policy="lifo"'), ["scheduling_policy", "lifo"]),
    ("kv_cache_dtype-fp4", lambda t: q('engine.kv_cache_dtype="fp4"'), ["fp4"]),
    ("cost_model-magic", lambda t: q('engine.cost_model="magic"'), ["cost_model", "magic"]),
    ("enable_prefix_caching-string", lambda t: q('engine.enable_prefix_caching="yes"'),
     ["enable_prefix_caching", "yes"]),
    ("async_scheduling-string", lambda t: q('engine.async_scheduling="true"'), ["async_scheduling", "true"]),
    ("async_scheduling-tgi", lambda t: q('engine.policy="tgi"', "engine.async_scheduling=true"),
     ["async_scheduling", "tgi"]),
    ("num_gpu_blocks_override-0", lambda t: q("engine.num_gpu_blocks_override=0"),
     ["num_gpu_blocks_override", "0"]),
    ("max_waiting-neg", lambda t: q("engine.max_waiting=-1"), ["max_waiting", "-1"]),
    ("queue_timeout_s-0", lambda t: q("engine.queue_timeout_s=0"), ["queue_timeout_s", "0"]),
    ("watermark-2", lambda t: q("engine.watermark=2.0"), ["watermark", "2"]),
    ("vllm-v0-preemption-drop", lambda t: q('engine.policy="vllm-v0"', 'engine.preemption_mode="drop"'),
     ["preemption_mode", "drop"]),
    ("vllm-v0-swap_space-neg", lambda t: q('engine.policy="vllm-v0"', "engine.swap_space=-4"),
     ["swap_space", "-4"]),
    ("llamacpp-n_parallel-0", lambda t: q('engine.policy="llamacpp"', "engine.n_parallel=0"), ["n_parallel", "0"]),
    ("ollama-num_ctx-0", lambda t: q('engine.policy="ollama"', "engine.num_ctx=0"), ["num_ctx", "0"]),
    ("tgi-waiting_served_ratio-neg", lambda t: q('engine.policy="tgi"', "engine.waiting_served_ratio=-1"),
     ["waiting_served_ratio", "-1"]),
    ("trtllm-policy-unknown", lambda t: q('engine.policy="trtllm"', 'engine.capacity_scheduler_policy="ANY"'),
     ["capacity_scheduler_policy", "ANY"]),
    ("knob-of-another-preset", lambda t: q('engine.policy="vllm"', "engine.n_parallel=2"), ["n_parallel"]),
    ("preset-and-policy-disagree", lambda t: q('engine.preset="tgi"'), ["preset", "policy"]),
    # ---- [model] / [hardware] ----
    ("model-unknown", lambda t: q('model.name="Llama-9-1T"'), ["Llama-9-1T"]),
    ("model-dtype-fp7", lambda t: q('model.dtype="fp7"'), ["fp7"]),
    ("model-missing-json", lambda t: q(f'model.name="{t}/none.json"'), ["none.json"]),
    ("model-too-big", lambda t: q('model.name="Llama-3.1-70B"'), ["70B"]),
    ("gpu-unknown", lambda t: q('hardware.gpu="RTX 9090"'), ["RTX 9090"]),
    ("tp-0", lambda t: q("hardware.tensor_parallel_size=0"), ["tensor_parallel_size", "0"]),
    ("tp-3", lambda t: q("hardware.tensor_parallel_size=3"), ["tensor_parallel_size", "3"]),
    ("tp-float", lambda t: q("hardware.tensor_parallel_size=1.5"), ["tensor_parallel_size", "1.5"]),
    ("profile-unknown", lambda t: q('hardware.profile="nope"'), ["nope"]),
    # ---- [workload] ----
    ("rate-0", lambda t: q("workload.rate=0"), ["rate", "0"]),
    ("rate-neg", lambda t: q("workload.rate=-2"), ["rate", "-2"]),
    ("rate-string", lambda t: q('workload.rate="fast"'), ["rate", "fast"]),
    ("arrival-weibull", lambda t: q('workload.arrival="weibull"'), ["arrival", "weibull"]),
    ("burstiness-0", lambda t: q('workload.arrival="gamma"', "workload.burstiness=0"), ["burstiness", "0"]),
    ("burstiness-poisson", lambda t: q("workload.burstiness=2"), ["burstiness", "poisson"]),
    ("rescale-string", lambda t: q('workload.rescale="no"'), ["rescale", "no"]),
    ("num_requests-0", lambda t: q("workload.num_requests=0"), ["num_requests", "0"]),
    ("num_requests-float", lambda t: q("workload.num_requests=1.5"), ["num_requests", "1.5"]),
    ("num_requests-bool", lambda t: q("workload.num_requests=true"), ["num_requests", "True"]),
    ("num_requests-2M-no-horizon", lambda t: q("workload.num_requests=2000000"),
     ["num_requests", "2000000", "horizon"]),
    ("prompt-missing", lambda t: ["run", _toml(t, BASE.replace("prompt = 100\n", ""))], ["prompt"]),
    ("prompt-uniform-reversed", lambda t: q('workload.prompt={dist="uniform",low=10,high=5}'), ["high", "5"]),
    ("prompt-fixed-0", lambda t: q('workload.prompt={dist="fixed",value=0}'), ["value", "0"]),
    ("prompt-fixed-bare-0", lambda t: q("workload.prompt=0"), ["prompt", "0"]),
    ("prompt-lognormal-mean-neg", lambda t: q('workload.prompt={dist="lognormal",mean=-1,std=1}'), ["mean", "-1"]),
    ("prompt-normal-std-neg", lambda t: q('workload.prompt={dist="normal",mean=100,std=-1}'), ["std", "-1"]),
    ("prompt-unknown-key", lambda t: q('workload.prompt={dist="fixed",value=3,mean=2}'), ["mean"]),
    ("prompt-dist-unknown", lambda t: q('workload.prompt={dist="zipf"}'), ["dist", "zipf"]),
    ("prompt-min-gt-max", lambda t: q('workload.prompt={dist="fixed",value=3,min=10,max=5}'), ["max", "5"]),
    ("prompt-empirical-missing", lambda t: q(f'workload.prompt={{dist="empirical",csv="{t}/x.csv",column="n"}}'),
     ["x.csv"]),
    ("prompt-string", lambda t: q('workload.prompt="long"'), ["prompt", "long"]),
    ("kind-unknown", lambda t: q('workload.kind="batch"'), ["kind", "batch"]),
    ("shared_prefix-groups-0", lambda t: q("workload.shared_prefix={num_groups=0,prefix_len=10}"),
     ["num_groups", "0"]),
    ("shared_prefix-too-long", lambda t: q("workload.shared_prefix={num_groups=2,prefix_len=9000}"),
     ["prefix_len", "9000"]),
    ("shared_prefix-not-table", lambda t: q("workload.shared_prefix=4"), ["shared_prefix", "4"]),
    ("priority-empty", lambda t: q("workload.priority={levels=[]}"), ["levels", "[]"]),
    ("priority-weights-count", lambda t: q("workload.priority={levels=[0,1],weights=[1]}"), ["weights", "[1]"]),
    ("priority-weights-zero", lambda t: q("workload.priority={levels=[0,1],weights=[0,0]}"), ["weights", "zero"]),
    ("priority-weight-neg", lambda t: q("workload.priority={levels=[0,1],weights=[1,-1]}"), ["weights", "-1"]),
    ("client_timeout_s-0", lambda t: q("workload.client_timeout_s=0"), ["client_timeout_s", "0"]),
    ("client_timeout_s-nan", lambda t: q("workload.client_timeout_s=nan"), ["client_timeout_s", "nan"]),
    ("closed-clients-0", lambda t: ["run", SEED, "--set", "workload.num_clients=0"], ["num_clients", "0"]),
    ("closed-think-neg", lambda t: ["run", SEED, "--set", "workload.think_time=-1"], ["think_time", "-1"]),
    ("closed-think-dist", lambda t: ["run", SEED, "--set", 'workload.think_dist="gauss"'], ["think_dist", "gauss"]),
    ("closed-rate-key", lambda t: ["run", SEED, "--set", "workload.rate=3"], ["rate"]),
    ("sessions-0", lambda t: ["run", _toml(t, _sessions("num_sessions = 0"))], ["num_sessions", "0"]),
    ("sessions-huge", lambda t: ["run", _toml(t, _sessions("num_sessions = 1000000000"))],
     ["num_sessions", "1000000000"]),
    ("sessions-both-loops", lambda t: ["run", _toml(t, _sessions("num_sessions = 3\nrate = 1.0\nnum_clients = 2"))],
     ["num_clients", "rate"]),
    ("sessions-no-turns", lambda t: ["run", _toml(t, _sessions("num_sessions = 3", turns=False))], ["turns"]),
    ("sessions-system-too-long", lambda t: ["run", _toml(t, _sessions(
        "num_sessions = 3\nsystem_prompt = { num_prompts = 1, len = 9000 }", engine="max_model_len = 4096"))],
     ["system_prompt", "9000"]),
    ("trace-missing", lambda t: ["run", _toml(t, _trace_cfg(f"{t}/none.jsonl"))], ["none.jsonl"]),
    ("trace-too_long-maybe", lambda t: ["run", _toml(t, _trace_cfg(SAMPLE, 'too_long = "maybe"'))],
     ["too_long", "maybe"]),
    ("trace-format-xyz", lambda t: ["run", _toml(t, _trace_cfg(SAMPLE, 'format = "xyz"'))], ["xyz"]),
    ("trace-time_scale-0", lambda t: ["run", _toml(t, _trace_cfg(SAMPLE, "time_scale = 0"))], ["time_scale", "0"]),
    ("trace-unknown-option", lambda t: ["run", _toml(t, _trace_cfg(SAMPLE, "speedup = 2"))], ["speedup"]),
    # ---- [simulation] / [slo] / [frontend] ----
    ("horizon-0", lambda t: q("simulation.horizon=0"), ["horizon", "0"]),
    ("horizon-neg", lambda t: q("simulation.horizon=-5"), ["horizon", "-5"]),
    ("seed-float", lambda t: q("simulation.seed=1.5"), ["seed", "1.5"]),
    ("seed-string", lambda t: q('simulation.seed="abc"'), ["seed", "abc"]),
    ("seed-2**64", lambda t: q("simulation.seed=18446744073709551616"), ["seed", "18446744073709551616"]),
    ("sim-num_requests-0", lambda t: q("simulation.num_requests=0"), ["num_requests", "0"]),
    ("slo-neg", lambda t: q("slo.ttft_ms=-1"), ["ttft_ms", "-1"]),
    ("slo-unknown", lambda t: q("slo.latency=5"), ["latency"]),
    ("slo-p101", lambda t: q("slo.p101_ttft_ms=1"), ["p101_ttft_ms"]),
    ("slo-old-seconds-key", lambda t: q("slo.ttft_p99=1.0"), ["ttft_p99 = 1.0 (seconds)", "p99_ttft_ms = 1000"]),
    ("slo-seconds-per-request", lambda t: q("slo.ttft_s=1.0"), ["ttft_s", "ttft_ms = 1000"]),
    ("run-goodput-percentile", lambda t: q("simulation.seed=0") + ["--goodput", "p99_ttft:1"], ["--goodput", "p99_ttft"]),
    ("run-goodput-no-colon", lambda t: q("simulation.seed=0") + ["--goodput", "ttft=1000"], ["--goodput ttft:1000"]),
    ("slo-string", lambda t: q('slo.ttft_ms="fast"'), ["ttft_ms", "fast"]),
    ("frontend-neg", lambda t: q("frontend.detokenize_s_per_token=-1"), ["frontend"]),
    # ---- plan ----
    ("plan-model-unknown", lambda t: ["plan", "--model", "gpt-17", "--gpu", "H100"], ["gpt-17"]),
    ("plan-gpu-unknown", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "V1000"], ["V1000"]),
    ("plan-dtype", lambda t: [*P, "--dtype", "fp3"], ["fp3"]),
    ("plan-max-model-len-0", lambda t: [*P, "--max-model-len", "0"], ["--max-model-len", "got 0"]),
    ("plan-block-size-7", lambda t: [*P, "--block-size", "7"], ["--block-size", "7"]),
    ("plan-max-num-seqs-0", lambda t: [*P, "--max-num-seqs", "0"], ["max_num_seqs", "0"]),
    ("plan-tp-0", lambda t: [*P, "-tp", "0"], ["tensor_parallel_size", "0"]),
    ("plan-usable-neg", lambda t: [*P, "--usable-gib", "-1"], ["--usable-gib", "-1"]),
    ("plan-util-2", lambda t: [*P, "--gpu-memory-utilization", "2"], ["gpu_memory_utilization", "2"]),
    ("plan-max-model-len-text", lambda t: [*P, "--max-model-len", "long"], ["--max-model-len", "long"]),
    ("plan-context-length-0", lambda t: [*P, "--context-length", "0"], ["0"]),
    ("plan-kv-dtype", lambda t: [*P, "--kv-cache-dtype", "int3"], ["int3"]),
    ("plan-no-model", lambda t: ["plan", "--gpu", "H100"], ["--model"]),
    # ---- size ----
    ("size-slo-no-equals", lambda t: ["size", SIZING, "--slo", "ttft"], ["--slo", "ttft"]),
    ("size-slo-neg", lambda t: ["size", SIZING, "--slo", "p99_ttft:-1"], ["p99_ttft", "-1"]),
    ("size-slo-unknown", lambda t: ["size", SIZING, "--slo", "speed:1"], ["speed"]),
    ("size-slo-old-seconds", lambda t: ["size", SIZING, "--slo", "ttft_p99=1.0"], ["--slo p99_ttft:1000"]),
    ("size-max-num-seqs-text", lambda t: ["size", SIZING, "--max-num-seqs", "a,b"], ["--max-num-seqs", "a"]),
    ("size-max-num-seqs-0", lambda t: ["size", SIZING, "--max-num-seqs", "0,8"], ["--max-num-seqs", "0,8"]),
    ("size-vary-unknown", lambda t: ["size", SIZING, "--vary", "engine.nope=1,2"], ["nope"]),
    ("size-vary-no-values", lambda t: ["size", SIZING, "--vary", "engine.block_size="], ["engine.block_size"]),
    ("size-jobs-0", lambda t: ["size", SIZING, "--jobs", "0"], ["--jobs", "0"]),
    ("size-goal", lambda t: ["size", SIZING, "--goal", "cheap"], ["--goal", "cheap"]),
    ("size-no-slo", lambda t: ["size", _toml(t, BASE)], ["slo"]),
    ("size-intervals-with-gpus", lambda t: ["size", SIZING, "--gpus", "RTX 4090", "--target-concurrency", "4",
                                            "--intervals"], ["--intervals", "--gpus"]),
    ("size-config-missing", lambda t: ["size", str(t / "no.toml")], ["no.toml"]),
    # ---- sweep ----
    ("sweep-grid-no-equals", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs", "--out", str(t / "s")],
     ["--grid", "engine.max_num_seqs"]),
    ("sweep-grid-unknown", lambda t: ["sweep", QUICK, "--grid", "engine.nope=1,2", "--out", str(t / "s")],
     ["nope"]),
    ("sweep-grid-bad-value", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=0,4", "--out",
                                        str(t / "s.parquet")], ["max_num_seqs", "0"]),
    ("sweep-replications-0", lambda t: ["sweep", QUICK, *G, "--replications", "0", "--out", str(t / "s.parquet")],
     ["replications", "0"]),
    ("sweep-no-out", lambda t: ["sweep", QUICK], ["--out"]),
    ("sweep-out-file", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--out", _file(t)],
     ["afile"]),
    ("sweep-jobs-neg", lambda t: ["sweep", QUICK, *G, "--jobs", "-1", "--out", str(t / "s.parquet")], ["--jobs", "-1"]),
    ("sweep-backend", lambda t: ["sweep", QUICK, *G, "--backend", "slurm", "--out", str(t / "s.parquet")], ["slurm"]),
    ("sweep-slo-old-seconds", lambda t: ["sweep", QUICK, *G, "--slo", "tpot_p99=0.05", "--out", str(t / "s.parquet")],
     ["tpot_p99=0.05 (seconds)", "--slo p99_tpot:50"]),
    # ---- trace stats: each format ----
    ("trace-file-missing", lambda t: ["trace", "stats", str(t / "no.jsonl")], ["no.jsonl"]),
    ("trace-empty", lambda t: ["trace", "stats", _write(t, "e.jsonl", "")], ["e.jsonl"]),
    ("trace-binary", lambda t: ["trace", "stats", _binary(t, "b.jsonl")], ["b.jsonl"]),
    ("trace-dir", lambda t: ["trace", "stats", str(t)], ["TMP"]),
    ("jsonl-bad-json", lambda t: ["trace", "stats", _write(t, "t.jsonl", '{"request_id": "a", \n')], ["t.jsonl"]),
    ("jsonl-neg-arrival", lambda t: ["trace", "stats", _jsonl(t, {**ROW, "arrival_time": -1})],
     ["arrival_time", "-1"]),
    ("jsonl-nan-arrival", lambda t: ["trace", "stats", _write(t, "t.jsonl", json.dumps(ROW).replace(
        '"arrival_time": 0.0', '"arrival_time": NaN') + "\n")], ["arrival_time"]),
    ("jsonl-prompt-0", lambda t: ["trace", "stats", _jsonl(t, {**ROW, "prompt_len": 0})], ["prompt_len", "0"]),
    ("jsonl-output-neg", lambda t: ["trace", "stats", _jsonl(t, {**ROW, "output_len": -1})], ["output_len", "-1"]),
    ("jsonl-prompt-string", lambda t: ["trace", "stats", _jsonl(t, {**ROW, "prompt_len": "20"})], ["prompt_len"]),
    ("jsonl-missing-field", lambda t: ["trace", "stats", _jsonl(t, {"request_id": "a", "arrival_time": 0})],
     ["prompt_len"]),
    ("jsonl-dup-id", lambda t: ["trace", "stats", _jsonl(t, ROW, ROW)], ["a"]),
    ("jsonl-row-not-object", lambda t: ["trace", "stats", _write(t, "t.jsonl", "[1, 2]\n")], ["t.jsonl"]),
    ("jsonl-segments-sum", lambda t: ["trace", "stats", _jsonl(t, {**ROW, "segments": [[["s", 1], 5]]})],
     ["segments"]),
    ("azure-bad-header", lambda t: ["trace", "stats", _write(t, "a.csv", "time,in,out\n1,2,3\n"), "--format",
                                    "azure"], ["a.csv"]),
    ("azure-bad-number", lambda t: ["trace", "stats", _write(t, "a.csv", AZURE + "2023-11-16 18:15:46.68,abc,44\n")],
     ["a.csv"]),
    ("azure-neg-tokens", lambda t: ["trace", "stats", _write(t, "a.csv", AZURE + AZ_ROW + "2023-11-16 18:15:47.0,-3,4\n")],
     ["-3"]),
    ("azure-tokens-1e300", lambda t: ["trace", "stats", _write(t, "a.csv", AZURE + "2023-11-16 18:15:46.68,1e300,4\n")],
     ["ContextTokens", "1e300", "too large"]),
    ("azure-bad-time", lambda t: ["trace", "stats", _write(t, "a.csv", AZURE + "yesterday,374,44\n")],
     ["yesterday"]),
    ("burstgpt-bad", lambda t: ["trace", "stats", _write(t, "b.csv", "Timestamp,Model,Request tokens,Response "
                                                         "tokens,Total tokens,Log Type\nx,ChatGPT,1,2,3,Conv"
                                                         "ersation log\n"), "--format", "burstgpt"], ["b.csv"]),
    ("mooncake-hash-str", lambda t: ["trace", "stats", _jsonl(t, {"timestamp": 0, "input_length": 20,
                                                                  "output_length": 3, "hash_ids": ["x"]}),
                                     "--format", "mooncake"], ["hash_ids"]),
    ("mooncake-missing", lambda t: ["trace", "stats", _jsonl(t, {"timestamp": 0, "input_length": 20}),
                                    "--format", "mooncake"], ["output_length"]),
    ("sharegpt-not-list", lambda t: ["trace", "stats", _write(t, "s.json", '{"a": 1}'), "--format", "sharegpt"],
     ["s.json"]),
    ("trace-format-unknown", lambda t: ["trace", "stats", SAMPLE, "--format", "parquet"], ["parquet"]),
    ("trace-time-scale-0", lambda t: ["trace", "stats", SAMPLE, "--time-scale", "0"], ["time_scale", "0"]),
    ("trace-rate-scale-nan", lambda t: ["trace", "stats", SAMPLE, "--rate-scale", "nan"], ["rate_scale", "nan"]),
    ("trace-limit-0", lambda t: ["trace", "stats", SAMPLE, "--limit", "0"], ["limit", "0"]),
    ("trace-start-after-end", lambda t: ["trace", "stats", SAMPLE, "--start", "10", "--end", "5"], ["end"]),
    ("trace-sample-neg", lambda t: ["trace", "stats", SAMPLE, "--sample", "-1"], ["sample", "-1"]),
    ("trace-sample-1.5", lambda t: ["trace", "stats", SAMPLE, "--sample", "1.5"], ["sample", "1.5"]),
    ("trace-block-size-0", lambda t: ["trace", "stats", SAMPLE, "--block-size", "0"], ["block_size", "0"]),
    # ---- clusters ----
    ("cluster-replicas-0", lambda t: ["run", CLUSTER, "--set", "cluster.replicas=0"], ["replicas", "0"]),
    ("cluster-router-unknown", lambda t: ["run", CLUSTER, "--set", 'cluster.router="magic"'], ["magic"]),
    ("cluster-variant-unknown", lambda t: ["cluster", CLUSTER, "--variant", "tp9"], ["tp9"]),
    ("cluster-client-timeout", lambda t: ["run", CLUSTER, "--set", "workload.client_timeout_s=5"],
     ["client_timeout_s"]),
    ("cluster-frontend-negative", lambda t: ["run", CLUSTER, "--set", "frontend.engine_hop_s=-0.001"],
     ["[frontend]", "engine_hop_s", "-0.001", "0 <= value <= 10"]),
    ("cluster-frontend-unknown-key", lambda t: ["run", CLUSTER, "--set", "frontend.hop=0.001"],
     ["[frontend]", "hop", "known keys"]),
    # ---- HF config.json, more ----
    ("hf-not-object", lambda t: ["plan", "--model", _write(t, "config.json", "[1]"), "--gpu", "H100"],
     ["config.json"]),
    ("hf-bad-json", lambda t: ["plan", "--model", _write(t, "config.json", "{"), "--gpu", "H100"], ["config.json"]),
    ("hf-missing-hidden", lambda t: ["plan", "--model", _hf_without(t, "hidden_size"), "--gpu", "H100"],
     ["hidden_size"]),
    ("hf-experts-0", lambda t: ["plan", "--model", _hf_with(t, num_local_experts=0, num_experts_per_tok=2),
                                "--gpu", "H100"], ["num_experts_per_tok", "2"]),
    ("hf-experts-per-tok-too-many", lambda t: ["plan", "--model", _hf_with(t, num_local_experts=8, num_experts_per_tok=9),
                                              "--gpu", "H100"], ["num_experts_per_tok", "9"]),
    ("hf-quant-vs-dtype", lambda t: ["plan", "--model", _hf_with(t, quantization_config={"quant_method": "awq", "bits": 4}),
                                     "--gpu", "H100", "--dtype", "fp8"], ["fp8", "int4"]),
    ("hf-quant-not-object", lambda t: ["plan", "--model", _hf_with(t, quantization_config="awq"), "--gpu", "H100"],
     ["quantization_config", "awq"]),
    ("hf-head-dim-0", lambda t: ["plan", "--model", _hf_with(t, head_dim=0), "--gpu", "H100"], ["head_dim", "0"]),
    ("hf-quant-unknown", lambda t: ["plan", "--model", _hf_with(t, quantization_config={"quant_method": "zz"}),
                                    "--gpu", "H100"], ["quant_method", "zz"]),
    ("hf-quant-bits", lambda t: ["plan", "--model", _hf_with(t, quantization_config={"quant_method": "awq",
                                                                                     "bits": 3}),
                                 "--gpu", "H100"], ["bits", "3"]),
    # ---- found by the 2026-12-02 sweep (549 inputs; tracebacks, a hang and silent acceptances) ----
    ("rate-beyond-the-clock", lambda t: q("workload.rate=1e-300", "workload.num_requests=20"),
     ["workload.rate", "1e-300", "1e+09"]),
    ("closed-think-beyond-the-clock", lambda t: ["run", _toml(t, BASE.split("[workload]")[0] + (
        '[workload]\nkind = "closed"\nnum_clients = 2\nnum_requests = 10\nthink_time = 1e300\n'
        "prompt = 100\noutput = 10\n"))], ["think_time", "1e+300"]),
    ("trace-arrival-beyond-the-clock", lambda t: ["run", _toml(t, _trace_cfg(_jsonl(t, {**ROW, "arrival_time": 1e300})))],
     ["arrival_time", "1e+300"]),
    ("burstgpt-negative-timestamp", lambda t: ["trace", "stats", _write(t, "b.csv", "Timestamp,Model,Request tokens,"
                                               "Response tokens,Total tokens,Log Type\n-5,ChatGPT,100,20,120,Conv\n"),
                                               "--format", "burstgpt"], ["Timestamp", "'-5'", ">= 0"]),
    ("trace-window-empty", lambda t: ["trace", "stats", SAMPLE, "--start", "1000000"], ["no requests left"]),
    ("normal-mean-negative", lambda t: q('workload.prompt={dist="normal",mean=-100,std=10}'), ["mean", "-100"]),
    ("empirical-value-0", lambda t: q('workload.prompt={dist="empirical",values=[0,100]}'), ["values[0]", "0"]),
    ("demo-out-is-a-file", lambda t: ["demo", "--quick", "--out", _write(t, "f.txt", "x")], ["--out", "f.txt"]),
    ("cluster-out-is-a-file", lambda t: ["cluster", CLUSTER, "--out", _write(t, "f.txt", "x")], ["--out", "f.txt"]),
    ("cluster-replica-count-huge", lambda t: ["run", _toml(t, BASE + '[cluster]\nrouter = "round-robin"\n'
                                                          '[[replica]]\nname = "a"\ncount = 1000000\n')],
     ["count", "1000000", "4096"]),
    ("compare-no-requests", lambda t: ["compare", _bench(t, empty=True)], ["input_lens", "no requests", "one entry per request"]),
    ("compare-ttft-nan", lambda t: ["compare", _bench(t, ttft0=float("nan"))], ["ttfts[0]", "nan"]),
    ("compare-input-len-string", lambda t: ["compare", _bench(t, input0="855")], ["input_lens", "'855'"]),
    ("fit-out-is-a-directory", lambda t: ["fit", "--recipe", "rtx-4090", "--out", str(t)], ["--out", "directory"]),
    ("fit-recipe-with-gpu", lambda t: ["fit", "--recipe", "rtx-4090", "--gpu", "nosuch"], ["--gpu", "recipe"]),
    ("fit-freeze-unknown", lambda t: ["fit", "--recipe", "rtx-4090", "--freeze", "nosuchfield"],
     ["--freeze", "nosuchfield"]),
    ("run-replications-without-intervals", lambda t: ["run", QUICK, "--replications", "3"],
     ["--replications", "--intervals"]),
    ("run-steps-jsonl-without-out", lambda t: ["run", QUICK, "--steps-jsonl"], ["--steps-jsonl", "--out"]),
    ("run-step-trace-without-out", lambda t: ["run", QUICK, "--step-trace"], ["--step-trace", "--out"]),
    ("trace-path-empty", lambda t: q('workload.trace=""'), ["workload.trace", "''"]),
    ("trace-path-number", lambda t: q("workload.trace=5"), ["workload.trace", "5"]),
    ("config-not-a-regular-file", lambda t: ["run", "/dev/null"], ["/dev/null", "not a regular file"]),
    ("cluster-variant-none", lambda t: ["cluster", _toml(t, BASE + "[cluster]\nreplicas = 2\n"), "--variant", "a"],
     ["--variant", "'a'", "no [variants]"]),
    ("jsonl-token-id-negative", lambda t: ["trace", "stats", _jsonl(t, {"request_id": "a", "arrival_time": 0.0,
                                                                        "token_ids": [1, -2, 3], "output_len": 5})],
     ["token_ids", "-2", ">= 0"]),
    ("size-knee-gain-without-knee", lambda t: ["size", SIZING, "--knee-gain", "0.5"], ["--knee-gain", "--goal knee"]),
    ("sweep-knee-gain-without-seqs-axis", lambda t: ["sweep", QUICK, "--grid", "workload.rate=1,2", "--knee-gain",
                                                     "0.5", "--out", str(t / "s.parquet")],
     ["--knee-gain 0.5", "engine.max_num_seqs axis"]),
    ("size-dtypes-without-gpus", lambda t: ["size", SIZING, "--dtypes", "fp16"], ["--dtypes", "--gpus"]),
    ("plan-blocks-override-0", lambda t: [*P, "--num-gpu-blocks-override", "0"],
     ["--num-gpu-blocks-override", "0", "1 <= value"]),
    ("size-seqs-per-deployment-0", lambda t: ["size", SIZING, "--gpus", "RTX 4090", "--target-rate", "1",
                                              "--seqs-per-deployment", "0"], ["--seqs-per-deployment", "0"]),
]


def _bench(tmp: Path, empty: bool = False, ttft0: float | None = None, input0: object = None) -> str:
    """The vllm bench result fixture with one change."""
    res = json.loads((ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json").read_text())
    if empty:
        for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts",
                  "errors"):
            if k in res:
                res[k] = []
    if ttft0 is not None:
        res["ttfts"][0] = ttft0
    if input0 is not None:
        res["input_lens"][0] = input0
    return _write(tmp, "bench.json", json.dumps(res))


def _sessions(extra: str, turns: bool = True, engine: str = "") -> str:
    head = BASE.split("[workload]")[0] + (f"[engine]\n{engine}\n" if engine else "")
    loop = "" if "rate" in extra else "num_clients = 2\n"
    return (head + f'[workload]\nkind = "sessions"\n{loop}{extra}\n' + ("turns = 3\n" if turns else "")
            + "message = 50\noutput = 20\n")


def _trace_cfg(path: str, extra: str = "") -> str:
    return BASE.split("[workload]")[0] + f'[workload]\ntrace = "{path}"\n{extra}\n'


def _hf_without(tmp: Path, key: str) -> str:
    from tests.test_bad_inputs import LLAMA

    cfg = {k: v for k, v in LLAMA.items() if k != key}
    return _write(tmp, "config.json", json.dumps(cfg))


def _hf_with(tmp: Path, **changes) -> str:
    from tests.test_bad_inputs import LLAMA

    return _write(tmp, "config.json", json.dumps({**LLAMA, **changes}))


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_corpus_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), [str(tmp_path) if f == "TMP" else f for f in fragments], capsys)


def test_corpus_size():
    from tests.test_bad_inputs import CASES as PART_ONE

    assert len(PART_ONE) + len(CASES) >= 150
    assert len({c[0] for c in PART_ONE} | {c[0] for c in CASES}) == len(PART_ONE) + len(CASES)
