"""The hostile corpus, part three: what a fuzz of every subcommand found accepted or crashing on
2026-12-05 (a traceback on a huge --target-rate; flags that did nothing without their mode; a value that
silently replaced another; JSON rows naming a key twice; values past any sensible range). Each case ends
in exit code 2 and one line naming the flag or field, before any engine runs (the harness of part one);
the inputs next to them that must still work are checked at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_bad_inputs import QUICK, SIZING, no_simulation, run_bad_case  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
DISAGG = str(ROOT / "examples" / "cluster_disagg.toml")
P = ["plan", "--model", "Llama-3.1-8B", "--gpu", "RTX 4090"]
SIZE = ["size", SIZING, "--replications", "1", "--jobs", "1"]

BASE = """[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "A100 80GB"
[engine]
max_model_len = 4096
[workload]
rate = 2.0
num_requests = 10
prompt = 100
output = 10
"""


def _write(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text)
    return str(p)


def _toml(tmp: Path, extra: str) -> str:
    return _write(tmp, "c.toml", BASE + extra)


def q(*sets: str) -> list[str]:
    argv = ["run", QUICK]
    for s in sets:
        argv += ["--set", s]
    return argv


ROW = {"request_id": "a", "arrival_time": 0.0, "prompt_len": 20, "output_len": 5}

CASES = [
    # a huge target overflowed the card table's int64 column, after 24 simulations
    ("size-target-rate-huge", lambda t: [*SIZE, "--gpus", "RTX 4090", "--target-rate", "1e20"],
     ["--target-rate", "1e+20"]),
    # [cluster.disagg] values were checked only when some replica was prefill or decode
    ("disagg-latency-unused", lambda t: ["run", _toml(t, "[cluster]\nreplicas = 2\n[cluster.disagg]\n"
                                                        "link_latency_ms = -1\n")], ["link_latency_ms", "-1"]),
    ("disagg-router-unused", lambda t: ["run", _toml(t, "[cluster]\nreplicas = 2\n[cluster.disagg]\n"
                                                       'decode_router = "nosuch"\n')], ["decode_router", "nosuch"]),
    # flags of another mode did nothing
    ("fit-max-nfev-no-from-run", lambda t: ["fit", "--recipe", "rtx-4090", "--max-nfev", "-3"],
     ["--max-nfev", "--from-run"]),
    ("fit-max-per-stage-no-from-run", lambda t: ["fit", "--recipe", "rtx-4090", "--max-per-stage", "0"],
     ["--max-per-stage", "--from-run"]),
    ("fit-profile-no-from-run", lambda t: ["fit", "--recipe", "rtx-4090", "--profile", "prior"],
     ["--profile", "--from-run"]),
    ("fit-set-no-from-run", lambda t: ["fit", "--recipe", "rtx-4090", "--set", "engine.max_num_seqs=0"],
     ["--set", "--from-run"]),
    ("fit-holdout-0", lambda t: ["fit", "--recipe", "rtx-4090", "--holdout", "0"], ["--holdout 0", "(0, 1)"]),
    ("fit-list-with-recipe", lambda t: ["fit", "--list", "--recipe", "rtx-4090"], ["--list", "--recipe"]),
    ("size-device-overlap-no-gpus", lambda t: [*SIZE, "--device-overlap", "0.5"], ["--device-overlap", "--gpus"]),
    ("size-seqs-per-deployment-no-gpus", lambda t: [*SIZE, "--seqs-per-deployment", "4"],
     ["--seqs-per-deployment", "--gpus"]),
    ("run-level-no-intervals", lambda t: [*q("workload.num_requests=20"), "--level", "0.5"],
     ["--level 0.5", "--intervals"]),
    # one value silently replaced another
    ("sweep-slo-and-set-slo", lambda t: ["sweep", QUICK, "--out", str(t / "sw.csv"), "--grid", "workload.rate=1,2",
                                         "--slo", "p99_ttft:100", "--set", "slo.p99_ttft_ms=5000"],
     ["--slo", "slo.p99_ttft_ms=5000"]),
    ("size-slo-and-set-slo", lambda t: [*SIZE, "--slo", "p99_ttft:2000", "--set", "slo.p99_ttft_ms=10"],
     ["--slo", "slo.p99_ttft_ms=10"]),
    ("sweep-grid-and-set", lambda t: ["sweep", QUICK, "--out", str(t / "sw.csv"), "--grid", "engine.max_num_seqs=8",
                                      "--set", "engine.max_num_seqs=4"], ["--grid", "engine.max_num_seqs", "--set"]),
    ("size-vary-and-set", lambda t: [*SIZE, "--vary", "engine.block_size=16,32", "--set", "engine.block_size=8"],
     ["--vary", "engine.block_size", "--set"]),
    ("gpu-hour-twice", lambda t: [*q(), "--gpu-hour", "RTX 4090=1", "--gpu-hour", "RTX 4090=2"],
     ["RTX 4090", "twice"]),
    ("json-duplicate-key", lambda t: ["trace", "stats", _write(t, "t.jsonl", json.dumps(ROW)[:-1]
                                                               + ', "arrival_time": 3}\n')],
     ["arrival_time", "twice"]),
    ("mooncake-duplicate-key", lambda t: ["trace", "stats", _write(
        t, "m.jsonl", '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1], "timestamp": 5}\n')],
     ["timestamp", "twice"]),
    # repeated values, counts that disagree
    ("size-vary-repeated-value", lambda t: [*SIZE, "--vary", "engine.max_num_batched_tokens=512,512"],
     ["512", "repeated"]),
    ("sweep-grid-repeated-value", lambda t: ["sweep", QUICK, "--out", str(t / "sw.csv"), "--grid",
                                             "workload.rate=1,1"], ["workload.rate", "repeated"]),
    ("size-vary-twice-names-vary", lambda t: [*SIZE, "--vary", "engine.block_size=16", "--vary",
                                              "engine.block_size=32"], ["--vary engine.block_size", "one --vary"]),
    ("plan-context-past-max-model-len", lambda t: [*P, "--max-model-len", "8192", "--context-length", "8193"],
     ["8193", "max_model_len 8192"]),
    ("plan-max-num-seqs-huge", lambda t: [*P, "--max-num-seqs", "100000000000"], ["--max-num-seqs", "2147483647"]),
    ("plan-max-num-batched-tokens-huge", lambda t: [*P, "--max-num-batched-tokens", "3000000000"],
     ["--max-num-batched-tokens", "2147483647"]),
    # vLLM refuses a nonzero priority unless scheduling_policy = "priority"
    ("priority-under-fcfs", lambda t: ["run", _toml(t, "priority = { levels = [0, 1], weights = [1, 1] }\n")],
     ["workload.priority", "fcfs"]),
    # keys and messages
    ("set-quoted-key-unclosed", lambda t: q('engine."max_num_seqs=8'), ["not a dotted TOML key"]),
    ("set-variants", lambda t: ["cluster", DISAGG, "--set", 'variants.1p3d.cluster.router="least-kv"'],
     ["variants.1p3d", "every variant"]),
    ("variant-error-named", lambda t: ["run", _toml(t, "[cluster]\nreplicas = 1\n[variants.x]\n"
                                                      "engine = { max_num_seqs = -1 }\n")],
     ["[variants.x]", "max_num_seqs"]),
    ("goodput-percentile-hint", lambda t: [*q(), "--goodput", "ttft_p99=1.0"], ["per-request", "p99_ttft_ms"]),
    # past any sensible range
    ("gateway-max-queue-past-int32", lambda t: ["run", _toml(t, "[cluster]\nreplicas = 2\n[cluster.gateway]\n"
                                                               "max_queue = 100000000000000000000\n")],
     ["max_queue", "2147483647"]),
    ("gateway-timeout-huge", lambda t: ["run", _toml(t, "[cluster]\nreplicas = 2\n[cluster.gateway]\n"
                                                       "queue_timeout_s = 1e300\n")], ["queue_timeout_s", "1e+09"]),
    ("queue-timeout-huge", lambda t: q("engine.queue_timeout_s=1e300"), ["queue_timeout_s", "1e+300"]),
    ("client-timeout-huge", lambda t: q("workload.client_timeout_s=1e300"), ["client_timeout_s"]),
    ("horizon-huge", lambda t: q("simulation.horizon=1e12"), ["horizon"]),
    ("set-float-overflow", lambda t: q("workload.rate=1e400"), ["1e400", "largest float"]),
    ("trace-time-scale-tiny", lambda t: ["trace", "stats", str(ROOT / "examples" / "sample_trace.jsonl"),
                                         "--time-scale", "1e-300"], ["time_scale", "1e-06"]),
    # --vllm-args: a value after a switch was taken for the model; messages named the wrong thing
    ("vllm-args-switch-value", lambda t: [*q(), "--vllm-args", "--enable-prefix-caching false"],
     ["--enable-prefix-caching false", "switch"]),
    ("vllm-args-negated-switch-value", lambda t: [*q(), "--vllm-args", "--no-enable-prefix-caching=true"],
     ["use --enable-prefix-caching or --no-enable-prefix-caching"]),
    ("vllm-args-fraction", lambda t: [*q(), "--vllm-args", "--max-num-seqs 4.5"], ["--max-num-seqs", "not a whole number"]),
    ("set-unknown-model-named", lambda t: q('model.name="nosuch"'), ["[model] name", "nosuch"]),
    ("set-unknown-gpu-named", lambda t: q('hardware.gpu="nosuch"'), ["[hardware] gpu", "nosuch"]),
    ("set-model-empty-folder", lambda t: q(f'model.name="{t}"'), ["[model] name", "holds no config.json"]),
    ("compare-profile-names-file", lambda t: ["compare", str(ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json"),
                                              "--gpu", "RTX 4090", "--profile",
                                              str(ROOT / "tests" / "data" / "runs" / "vllm_bench_result.json")],
     ["calibration profile", "vllm_bench_result.json", "'date'"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_part3_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


# ---- next to them, what must still work ----------------------------------------------------------------
def test_quoted_key_reaches_a_fractional_percentile():
    from sim.app.config import apply_overrides

    raw = apply_overrides({}, ['slo."p99.9_ttft_ms"=100', "engine.max_num_seqs=8", "cost.gpu_hour.RTX 4090=1.5"])
    assert raw == {"slo": {"p99.9_ttft_ms": 100}, "engine": {"max_num_seqs": 8},
                   "cost": {"gpu_hour": {"RTX 4090": 1.5}}}


def test_unsorted_jsonl_is_sorted_and_said(tmp_path):
    from workloads.tracefmt import load_trace

    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({**ROW, "arrival_time": 5.0}) + "\n" + json.dumps({**ROW, "request_id": "b"}) + "\n")
    tr = load_trace(p)
    assert [s.request_id for s in tr] == ["b", "a"]
    assert any("1 rows come before the row above them" in n for n in tr.notes)
    p.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "request_id": "b", "arrival_time": 5.0}) + "\n")
    assert not any("come before" in n for n in load_trace(p).notes)


def test_json_rows_with_colons_and_nesting_still_read(tmp_path):
    """A row whose strings hold colons is decoded twice (the duplicate check) and read the same."""
    from workloads.tracefmt.rows import DuplicateKey, loads_row

    line = json.dumps({"request_id": "a:b:c", "x": {"y": 1}, "arrival_time": 0.0})
    assert loads_row(line) == json.loads(line)
    with pytest.raises(DuplicateKey):
        loads_row('{"a": {"b": 1, "b": 2}}')  # nested too
    with pytest.raises(DuplicateKey):
        loads_row('[{"b": 1, "b": 2}]')


def test_plan_context_lengths_up_to_max_model_len():
    from sim.app.memory import plan_memory

    p = plan_memory("Llama-3.1-8B", "RTX 4090", max_model_len=3000, context_lengths=(1000, 3000))
    assert [r.context_len for r in p.contexts] == [1000, 3000]
    assert len(plan_memory("Llama-3.1-8B", "RTX 4090", max_model_len=3000).contexts) == 6  # the default table


def test_priority_with_priority_scheduling_runs():
    import tomllib

    from sim.app.config import config_from_dict
    from sim.app.simulate import simulate

    raw = tomllib.loads(BASE + "priority = { levels = [0, 1], weights = [1, 1] }\n")
    raw["engine"]["scheduling_policy"] = "priority"
    res = simulate(config_from_dict(raw))
    assert len(res.requests) == 10
    raw["engine"]["scheduling_policy"] = "fcfs"
    raw["workload"]["priority"] = {"levels": [0]}  # priority 0 only: what vLLM takes under fcfs
    assert len(simulate(config_from_dict(raw)).requests) == 10


def test_mooncake_hash_ids_count_is_said(tmp_path):
    """A row whose hash_ids are not one per 512-token block (the format's rule) is used as given, and said."""
    from workloads.tracefmt import load_trace

    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2, 3]}\n'
                 '{"timestamp": 1, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n')
    tr = load_trace(p, format="mooncake")
    assert len(tr) == 2
    assert any(n.startswith("1 rows whose hash_ids count") for n in tr.notes)


def test_vllm_args_value_that_starts_with_a_dash():
    """argparse would take ``--vllm-args -tp=2``'s value for a flag of its own ("expected one argument")."""
    from sim.cli.main import _glue_vllm_args

    assert _glue_vllm_args(["run", "c.toml", "--vllm-args", "-tp=2", "--json"]) == \
        ["run", "c.toml", "--vllm-args=-tp=2", "--json"]
    assert _glue_vllm_args(["run", "c.toml", "--vllm-args", "vllm serve m"]) == ["run", "c.toml", "--vllm-args",
                                                                                "vllm serve m"]
    assert _glue_vllm_args(["run", "--vllm-args"]) == ["run", "--vllm-args"]  # argparse then says what is missing


def test_burstgpt_total_tokens_that_disagree_are_said(tmp_path):
    from workloads.tracefmt import load_trace

    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,100,20,999,Conversation log\n6,ChatGPT,100,20,120,Conversation log\n"
                 "7,ChatGPT,100,20,abc,Conversation log\n")
    tr = load_trace(p, format="burstgpt")
    assert [s.prompt_len for s in tr] == [100] * 3
    assert any(n.startswith("1 rows whose Total tokens") for n in tr.notes)  # 999; "abc" reads as empty
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,100,20,120,x\n")
    assert not any("Total tokens" in n for n in load_trace(p, format="burstgpt").notes)
