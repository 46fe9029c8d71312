"""The hostile corpus, part three: what a second sweep of 739 inputs found in configs, options and the
output paths (trace files: tests/test_bad_inputs_traces.py; run files: tests/test_bad_inputs_runs.py).
Every case must end in exit code 2 and one line naming the field and the value, before an engine runs;
each failed (a traceback, a hang or a silent run) before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import QUICK, SEED, SIZING, _hf, no_simulation, run_bad_case  # noqa: F401
from tests.test_bad_inputs_corpus import BASE, _toml, _write, q

ROOT = Path(__file__).resolve().parents[1]
DEEP = "[" * 3000 + "]" * 3000
PROFILE = ROOT / "sim" / "cost" / "data" / "profiles" / "rtx-4090.json"


def _profile(tmp: Path, **changes) -> str:
    """The shipped RTX 4090 profile with ``changes``, as a file."""
    data = json.loads(PROFILE.read_text())
    data.update(changes)
    return _write(tmp, "profile.json", json.dumps(data))


SESSIONS = """[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "A100 80GB"
[workload]
kind = "sessions"
num_sessions = 2
turns = 1000000000
message = { dist = "fixed", value = 100 }
output = { dist = "fixed", value = 20 }
num_clients = 2
"""

CASES = [
    # ---- --set / --grid values and TOML files ----
    ("set-value-newline", lambda t: q("engine.max_num_seqs=8\nengine.block_size=7"),
     ["--set engine.max_num_seqs", "line break"]),
    ("set-value-nested-deep", lambda t: q(f"engine.max_num_seqs={DEEP}"), ["--set engine.max_num_seqs", "nested too deeply"]),
    ("grid-value-newline", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=8\nblock_size=7", "--out",
                                      str(t / "s.parquet")], ["--grid engine.max_num_seqs", "line break"]),
    ("toml-nested-deep", lambda t: ["run", _toml(t, f"a = {DEEP}\n")], ["c.toml", "nested too deeply"]),
    ("config-name-too-long", lambda t: ["run", str(t / ("a" * 300 + ".toml"))], ["config file", "too long"]),
    # ---- plug-in names ----
    ("policy-empty-module", lambda t: q('engine.policy=":"'), ["policy", "':'", "not a module path"]),
    ("policy-relative-module", lambda t: q('engine.policy="..:x"'), ["policy", "'..:x'", "not a module path"]),
    ("router-empty-module", lambda t: ["run", _toml(t, BASE + '[cluster]\nreplicas = 2\nrouter = ":x"\n')],
     ["router", "':x'", "not a module path"]),
    # ---- outputs, checked before the work ----
    ("out-name-too-long", lambda t: ["run", QUICK, "--out", str(t / ("a" * 300))], ["--out", "too long"]),
    ("sweep-out-is-a-directory", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--out",
                                            _folder(t / "d.parquet")], ["--out", "d.parquet", "is a directory"]),
    ("sweep-out-name-too-long", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--out",
                                           str(t / ("a" * 300 + ".parquet"))], ["--out", "too long"]),
    # ---- sizes that ran out of memory or forked without bound ----
    ("sweep-replications-huge", lambda t: ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--replications",
                                           "1000000000", "--out", str(t / "s.parquet")],
     ["--replications", "1000000000", "[1, 1000]"]),
    ("intervals-replications-huge", lambda t: ["run", QUICK, "--intervals", "--replications", "1000000000"],
     ["--replications", "1000000000", "[1, 1000]"]),
    ("size-vary-named-as-vary", lambda t: ["size", SIZING, "--vary", "engine.block_size=16,"],
     ["--vary", "empty value"]),
    ("config-path-with-newline", lambda t: ["run", str(t / "no\nsuch.toml")], ["not found", "no\\nsuch.toml"]),
    ("hf-intermediate-size-0", lambda t: q(f'model.name="{_hf(t, intermediate_size=0)}"'),
     ["intermediate_size", "got 0"]),
    ("size-candidate-twice", lambda t: ["size", SIZING, "--max-num-seqs", "8,8,8"], ["--max-num-seqs", "twice"]),
    ("cluster-step-trace-without-out", lambda t: ["cluster", _toml(t, BASE + "[cluster]\nreplicas = 2\n"),
                                                  "--step-trace"], ["--step-trace", "--out"]),
    ("closed-loop-clients-huge", lambda t: ["run", SEED, "--set", f"workload.num_clients={10**23}"],
     ["num_clients", str(10**23)]),
    ("gamma-burstiness-subnormal", lambda t: q('workload.arrival="gamma"', "workload.burstiness=5e-324"),
     ["burstiness", "5e-324", "1e-06"]),
    ("vllm-bench-jsonl-negative-token", lambda t: ["trace", "stats", _vb_jsonl(t)],
     ["input_tok_ids", "-2", ">= 0"]),
    ("frontend-value-while-disabled", lambda t: q("frontend.enabled=false", "frontend.network_rtt_s=5"),
     ["network_rtt_s", "enabled = false"]),
    ("hf-hidden-not-multiple-of-heads", lambda t: q(f'model.name="{_hf(t, hidden_size=4001)}"'),
     ["hidden_size 4001", "num_attention_heads 32"]),
    ("hf-bool-as-string", lambda t: q(f'model.name="{_hf(t, attention_bias="false")}"'),
     ["attention_bias", "'false'", "true or false"]),
    ("profile-gpu-not-a-string", lambda t: q(f'hardware.profile="{_profile(t, gpu=5)}"'), ["gpu=5", "string"]),
    ("replica-name-a-table", lambda t: ["run", _toml(t, BASE + '[cluster]\nrouter = "round-robin"\n'
                                                          "[[replica]]\nname = {a = 1}\n")],
     ["name", "{'a': 1}", "string"]),
    ("schema-section-empty", lambda t: ["schema", "--section", ""], ["--section", "''"]),
    ("length-fixed-outside-max", lambda t: q('workload.prompt={dist="fixed", value=500, max=100}'),
     ["value 500", "[1, 100]"]),
    ("cost-usd-rate-with-usd", lambda t: q("cost.usd_rate=2"), ["usd_rate = 2", "currency USD"]),
    ("cost-two-prices", lambda t: q("cost.gpu_hour_usd=1", "cost.gpu_hour_price=2"),
     ["gpu_hour_usd = 1", "gpu_hour_price = 2"]),
    ("cost-one-card-two-names", lambda t: q('cost.gpu_hour={"RTX 4090"=1.0, "4090"=2.0}'),
     ["'RTX 4090' and '4090'", "one price per card"]),
    ("goodput-and-set-slo", lambda t: ["run", QUICK, "--goodput", "ttft:100", "--set", "slo.ttft_ms=5000"],
     ["--goodput", "slo.ttft_ms"]),
    ("trace-limit-and-num-requests", lambda t: q(f'workload.trace="{_write(t, "t.jsonl", _ROWS)}"', "workload.limit=2",
                                                 "workload.num_requests=3"), ["limit = 2", "num_requests = 3"]),
    ("size-slo-twice", lambda t: ["size", SIZING, "--slo", "ttft:100", "ttft:200"], ["ttft:200", "already 100 ms"]),
    ("size-knee-one-setting", lambda t: ["size", SIZING, "--goal", "knee", "--max-num-seqs", "8"],
     ["--goal knee", "--max-num-seqs 8", "two or more"]),
    ("size-jobs-huge", lambda t: ["size", SIZING, "--jobs", "100000"], ["--jobs", "100000", "per CPU"]),
    ("sessions-turns-huge", lambda t: ["run", _toml(t, SESSIONS)], ["num_sessions x turns", "2,000,000,000"]),
    ("blocks-override-huge", lambda t: q("engine.num_gpu_blocks_override=1000000000"),
     ["num_gpu_blocks_override", "1000000000"]),
    ("max-num-batched-tokens-huge", lambda t: q("engine.max_num_batched_tokens=100000000000"),
     ["max_num_batched_tokens", "100000000000", "2147483647"]),
    ("priority-level-huge", lambda t: q(f"workload.priority={{levels=[0, {10**29}]}}"),
     ["workload.priority.levels", str(10**29)]),
    ("priority-weights-overflow", lambda t: q("workload.priority={levels=[0, 1], weights=[1e308, 1e308]}"),
     ["workload.priority.weights", "1e+308"]),
    # ---- profile fields: degenerate numbers that ran to garbage, or forever ----
    ("profile-step-overhead-huge", lambda t: q(f'hardware.profile="{_profile(t, step_overhead_s=1e300)}"'),
     ["step_overhead_s", "1e+300", "[0, 1]"]),
    ("profile-eta-subnormal", lambda t: q(f'hardware.profile="{_profile(t, eta_compute=5e-324)}"'),
     ["eta_compute", "5e-324", "[0.01, 1]"]),
    ("profile-roofline-p-inf", lambda t: ["run", QUICK, "--set",
                                          f'hardware.profile="{_profile(t, roofline_p=1e400)}"'],
     ["roofline_p", "inf"]),
    ("profile-cuda-graph-huge", lambda t: q(f'hardware.profile="{_profile(t, cuda_graph_sizes=[1, 10**30])}"'),
     ["cuda_graph_sizes", "1048576"]),
    ("profile-nested-deep", lambda t: q(f'hardware.profile="{_write(t, "p.json", DEEP)}"'), ["nested too deeply"]),
    ("profile-not-utf8", lambda t: q(f'hardware.profile="{_latin1(t)}"'), ["not UTF-8"]),
    ("constant-step-subnormal", lambda t: q('engine.cost_model="constant"', "engine.constant_step_s=1e-300"),
     ["constant_step_s", "1e-300", "1e-06"]),
    ("frontend-delay-huge", lambda t: q("frontend.stream_chunk_s=1e300"), ["stream_chunk_s", "1e+300", "10 seconds"]),
    ("disagg-latency-huge", lambda t: ["run", _toml(t, BASE + _disagg("link_latency_ms = 1e300"))],
     ["link_latency_ms", "1e+300", "60000"]),
    ("disagg-bandwidth-tiny", lambda t: ["run", _toml(t, BASE + _disagg("link_bandwidth_gb_s = 1e-300"))],
     ["link_bandwidth_gb_s", "1e-300", "0.01"]),
    # ---- HF config.json ----
    ("hf-experts-per-token-string", lambda t: q(f'model.name="{_hf(t, experts_per_token="two")}"'),
     ["experts_per_token", "'two'"]),
    ("hf-max-position-embeddings-0", lambda t: q(f'model.name="{_hf(t, max_position_embeddings=0)}"'),
     ["max_position_embeddings", "got 0"]),
    ("hf-nested-deep", lambda t: q(f'model.name="{_write(t, "config.json", DEEP)}"'), ["nested too deeply"]),
    # ---- what the real engines refuse ----
    ("vllm-budget-below-seqs", lambda t: q("engine.max_num_seqs=8", "engine.max_num_batched_tokens=4"),
     ["max_num_batched_tokens (4)", "max_num_seqs (8)"]),
    ("ollama-num-ctx-below-keep", lambda t: q('engine.policy="ollama"', "engine.num_ctx=2"),
     ["num_ctx", "num_keep + 2", "got 2"]),
    ("trtllm-tokens-per-block-7", lambda t: q('engine.policy="trtllm"', "engine.tokens_per_block=7"),
     ["tokens_per_block", "got 7", "16, 32"]),
]


def _vb_jsonl(tmp: Path) -> str:
    """A vLLM bench-style JSONL trace row (input_toks, output_toks, input_tok_ids) with a negative id."""
    return _write(tmp, "vb.jsonl", json.dumps({"input_toks": 3, "output_toks": 2, "arrival_time_ns": 0,
                                                       "input_tok_ids": [1, -2, 3]}) + "\n")


_ROWS = "".join(json.dumps({"request_id": f"a{i}", "arrival_time": float(i), "prompt_len": 20, "output_len": 5}) + "\n"
                for i in range(4))


def _folder(p: Path) -> str:
    p.mkdir()
    return str(p)


def _latin1(tmp: Path) -> str:
    p = tmp / "latin.json"
    p.write_bytes(b'{"description": "caf\xe9"}')
    return str(p)


def _disagg(line: str) -> str:
    return ('[cluster]\nrouter = "round-robin"\n[[replica]]\nrole = "prefill"\n[[replica]]\nrole = "decode"\n'
            f"[cluster.disagg]\n{line}\n")


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_sweep2_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


def test_many_prefix_groups_are_made_only_when_drawn(capsys):
    """A billion shared-prefix groups: each group's block hashes are made when a request draws it (all of
    them were hashed up front, which never finished)."""
    rc = main(["run", QUICK, "--set", "workload.num_requests=10",
               "--set", "workload.shared_prefix={num_groups=1000000000, prefix_len=64}", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out[out.index("{"):])["num_finished"] == 10


def test_a_run_idle_for_years_summarises_without_an_array_per_second(capsys):
    """Peak tokens/s and concurrency are over 1-s buckets; an array of every second of a 10^8-s closed loop
    (a client thinking ~10^7 s between requests) was 6.6 GB before the run could report."""
    rc = main(["run", str(ROOT / "examples" / "seed_24gb.toml"), "--set", "workload.num_requests=8",
               "--set", "workload.num_clients=1", "--set", "workload.think_time=1.2e7",
               "--set", "workload.think_dist=exponential", "--json"])
    out = capsys.readouterr().out
    s = json.loads(out[out.index("{"):])
    assert rc == 0 and s["num_finished"] == 8 and s["duration"] > 1e7 and s["max_concurrent_requests"] == 1


def test_a_byte_order_mark_is_not_part_of_the_toml(tmp_path, capsys):
    """A config saved with a UTF-8 BOM (Windows editors) reads as the same TOML."""
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf" + Path(QUICK).read_bytes())
    assert main(["run", str(p), "--set", "workload.num_requests=5"]) == 0
