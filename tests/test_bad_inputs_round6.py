"""The hostile corpus, sixth round (fuzz6, 2026-12-06): the API's sizing and compare keywords, --intervals on
cluster configs, flags a mode ignores, one setting under two spellings, ids past int64, two models in one
vLLM line. Each bad input ends in exit code 2 (or one ServesimError line) before any engine runs; next to
it, the nearest valid input still works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import servesim
from sim.app.slo import parse_slo
from sim.app.sweep import parse_grid
from sim.app.vllm_args import translate
from sim.cli.main import main
from sim.core.errors import ServesimError
from tests.test_bad_inputs import QUICK, SIZING, no_simulation, run_bad_case  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
BENCH = str(REPO / "tests" / "data" / "runs" / "vllm_bench_result.json")
POOLS = str(REPO / "examples" / "cluster_pools.toml")
SIZE = ["size", SIZING, "--jobs", "1", "--replications", "1", "--set", "workload.num_requests=10"]
SMALL = {"workload": {"num_requests": 8, "rate": 4.0, "prompt": {"dist": "fixed", "value": 64},
                      "output": {"dist": "fixed", "value": 8}},
         "engine": {"cost_model": "constant", "constant_step_s": 0.01}}  # fmt: skip
STREAMS = """[model]
name = "Mistral-7B"
[hardware]
gpu = "RTX 4090"
[[stream]]
name = "chat"
rate = 2.0
num_requests = 4
prompt = { dist = "fixed", value = 100 }
output = { dist = "fixed", value = 10 }
"""


def _streams(t: Path) -> str:
    (t / "st.toml").write_text(STREAMS)
    return str(t / "st.toml")


def _trace(t: Path, name: str, rows: list[str]) -> str:
    (t / name).write_text("\n".join(rows) + "\n")
    return str(t / name)


CASES = [
    # a valid cluster / stream config was refused as "unknown section(s)"
    ("intervals-cluster", lambda t: ["run", POOLS, "--intervals"], ["--intervals", "[cluster]", "single-engine"]),
    ("intervals-stream", lambda t: ["run", _streams(t), "--intervals"], ["--intervals", "[[stream]]"]),
    # --set keys a replay does not use were dropped; one contradicting --gpu / --profile won over it
    ("compare-set-horizon", lambda t: ["compare", BENCH, "--set", "simulation.horizon=0.001"],
     ["simulation.horizon", "not used by a replay"]),
    # recorded start_times: nothing drawn, so a seed is refused (with workload.rate it seeds the drawn arrivals)
    ("compare-set-seed", lambda t: ["compare", BENCH, "--set", "simulation.seed=123"],
     ["simulation.seed", "not used by a replay", "nothing in this one is drawn"]),
    ("compare-set-slo", lambda t: ["compare", BENCH, "--set", "slo.ttft_ms=5"], ["slo.ttft_ms", "judges no SLO"]),
    ("compare-set-cost", lambda t: ["compare", BENCH, "--set", "cost.gpu_hour_usd=5"], ["cost.gpu_hour_usd"]),
    ("compare-set-gpu", lambda t: ["compare", BENCH, "--gpu", "RTX 4090", "--set", 'hardware.gpu="H100"'],
     ["hardware.gpu", "--gpu", "'RTX 4090'"]),
    ("compare-set-profile", lambda t: ["compare", BENCH, "--set", 'hardware.profile="prior"'],
     ["hardware.profile", "--profile"]),
    ("fit-from-run-set-horizon", lambda t: ["fit", "--from-run", BENCH, "--out", str(t / "p.json"), "--set",
                                            "simulation.horizon=0.01"], ["simulation.horizon"]),
    # the knee ranks along max_num_seqs and judges no SLO: the flags did nothing
    ("size-knee-slo", lambda t: [*SIZE, "--goal", "knee", "--slo", "ttft:1"], ["--slo", "--goal knee"]),
    ("size-knee-min-attainment", lambda t: [*SIZE, "--goal", "knee", "--min-attainment", "0.5"],
     ["--min-attainment", "--goal knee"]),
    # one percentile under two spellings: judged twice, met and not met
    ("size-slo-percentile-twice", lambda t: [*SIZE, "--slo", "p99_ttft:1000", "p99.0_ttft:500"],
     ["p99.0_ttft_ms", "p99_ttft_ms", "99th percentile"]),
    # two spellings of one value ran the same point twice
    ("size-vary-kv-alias", lambda t: [*SIZE, "--vary", "engine.kv_cache_dtype=fp8,fp8_e4m3"],
     ["'fp8' and 'fp8_e4m3' are the same"]),
    # run refused max_model_len 1; plan planned it
    ("plan-max-model-len-1", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", "4090", "--max-model-len", "1"],
     ["--max-model-len", "got 1", "2 <= value"]),
    # ids past int64 ran
    ("trace-token-ids-huge", lambda t: ["trace", "stats", _trace(t, "t.jsonl", [
        '{"arrival_time": 0, "output_len": 5, "token_ids": [99999999999999999999999999999, 3]}'])],
     ["token_ids", "29 digits", "int64"]),
    ("trace-token-ids-float-huge", lambda t: ["trace", "stats", _trace(t, "t.jsonl", [
        '{"arrival_time": 0, "output_len": 5, "token_ids": [5, 1e300]}'])], ["token_ids", "element 1", "int64"]),
    ("trace-mooncake-hash-ids-huge", lambda t: ["trace", "stats", _trace(t, "m.jsonl", [
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1e300]}']), "--format", "mooncake"],
     ["hash_ids", "301 digits", "2**64"]),
    # vllm serve's positional model and --model: servesim simulated the second, vLLM refuses the line
    ("vllm-args-two-models", lambda t: ["run", QUICK, "--vllm-args", "vllm serve Mistral-7B --model Qwen/Qwen3-8B"],
     ["--model", "'Mistral-7B'", "one model"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_round6_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


API_CASES = [
    ("size-vary-int-key", lambda: servesim.size(SMALL, slo={"p99_ttft_ms": 200}, vary={5: [1, 2]}),
     ["vary={5: ...}", "SECTION.KEY", "int"]),
    ("size-vary-no-section", lambda: servesim.size(SMALL, slo={"p99_ttft_ms": 200}, vary={"engine": [1]}),
     ["'engine'", "SECTION.KEY"]),
    ("size-vary-alias", lambda: servesim.size(SMALL, slo={"p99_ttft_ms": 200},
                                              vary={"engine.kv_cache_dtype": ["fp8", "fp8_e4m3"]}),
     ["'fp8' and 'fp8_e4m3' are the same"]),
    ("size-knee-slo", lambda: servesim.size(SMALL, slo={"p99_ttft_ms": 200}, goal="knee"), ["goal='knee'", "slo"]),
    ("size-throughput-min-attainment", lambda: servesim.size(SMALL, goal="throughput", min_attainment=0.5),
     ["goal='throughput'", "min_attainment"]),
    ("compare-gpu-empty", lambda: servesim.compare(BENCH, gpu=""), ["gpu=''", "GPU name"]),
    ("compare-gpu-number", lambda: servesim.compare(BENCH, gpu=5), ["gpu=5"]),
    ("compare-overrides-dotted-key", lambda: servesim.compare(BENCH, overrides={"engine": {"a.b": 1}}),
     ["'a.b'", "not a key name"]),
    ("compare-overrides-key-with-equals", lambda: servesim.compare(BENCH, overrides={"engine": {"max_num_seqs=1 ": 1}}),
     ["'max_num_seqs=1 '", "not a key name"]),
    ("run-empty-path", lambda: servesim.run(""), ["config ''", "empty"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,call,fragments", API_CASES, ids=[c[0] for c in API_CASES])
def test_round6_api_one_line(name, call, fragments):
    with pytest.raises(ServesimError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_api_iterables_as_toml_lists():
    """A generator, a numpy array: the list a TOML file would give (a generator raised TypeError in the
    config copy; an array was refused for priority levels)."""
    gen = servesim.run(SMALL, workload={"prompt": {"dist": "empirical", "values": (x for x in [10, 20])}})
    lst = servesim.run(SMALL, workload={"prompt": {"dist": "empirical", "values": [10, 20]}})
    assert gen.summary["num_finished"] == lst.summary["num_finished"] == 8
    assert gen.requests["prompt_len"].tolist() == lst.requests["prompt_len"].tolist()
    cfg = {**SMALL, "workload": {**SMALL["workload"], "prompt": {"dist": "empirical", "values": iter([5, 6])}}}
    assert servesim.run(cfg).summary["num_finished"] == 8
    arr = servesim.run(SMALL, workload={"priority": {"levels": np.array([0])}})
    ref = servesim.run(SMALL, workload={"priority": {"levels": [0]}})
    assert arr.summary["num_finished"] == ref.summary["num_finished"] == 8


def test_nearest_valid_inputs():
    """Distinct values, one spelling of each percentile, ids inside int64, one model, -tp2 as -tp 2."""
    assert parse_grid(['engine.kv_cache_dtype="fp8","auto"']) == {"engine.kv_cache_dtype": ["fp8", "auto"]}
    assert parse_grid(["engine.enable_prefix_caching=true,false"])["engine.enable_prefix_caching"] == [True, False]
    assert parse_grid(['model.name="Mistral-7B","Llama-3.1-8B"'])["model.name"] == ["Mistral-7B", "Llama-3.1-8B"]
    with pytest.raises(ServesimError, match="5 and 5.0 are the same"):
        parse_grid(["workload.num_requests=5,5.0"])
    with pytest.raises(ServesimError, match="'Mistral-7B' and 'mistral-7b' resolve to one catalogue model"):
        parse_grid(['model.name="Mistral-7B","mistral-7b"'])
    _, pct = parse_slo({"p99_ttft_ms": 1, "p99_itl_ms": 2, "p90_ttft_ms": 3})
    assert sorted(pct) == ["p90_ttft_ms", "p99_itl_ms", "p99_ttft_ms"]
    with pytest.raises(ServesimError, match="50th percentile of ttft"):
        parse_slo({"p50_ttft_ms": 1, "p050_ttft_ms": 2})
    assert translate("-tp2 --max-num-seqs 8").overrides == ["hardware.tensor_parallel_size=2", "engine.max_num_seqs=8"]
    assert translate("--model A --model B").model == "B"  # argparse: the last one
    assert translate("vllm serve M").model == "M"
    # a trace's sample: an int is a count, a float a fraction (the review of the first version of this check)
    assert parse_grid(["workload.sample=1,1.0"])["workload.sample"] == [1, 1.0]


def test_review_valid_inputs(tmp_path, capsys):
    """What the first version of these checks refused or consumed (the review's findings): an empty SLO
    or the default min_attainment with the throughput goal, unsigned 64-bit hash ids, an iterator that is
    not a generator (an endless one hung; it is now refused as before, in one line)."""
    res = servesim.size(SMALL, {}, goal="throughput", max_num_seqs=[4, 8], replications=1, min_attainment=0.99)
    assert res.recommended is not None
    u64 = _trace(tmp_path, "m.jsonl", ['{"timestamp": 0, "input_length": 600, "output_length": 5, '
                                       '"hash_ids": [18446744073709539271, 7]}'])
    assert main(["trace", "stats", u64, "--format", "mooncake"]) == 0
    capsys.readouterr()
    import itertools

    with pytest.raises(ServesimError) as info:
        servesim.run(SMALL, workload={"priority": {"levels": itertools.count()}})
    assert "\n" not in str(info.value) and "levels" in str(info.value)


def test_nearest_valid_cli(tmp_path, capsys):
    assert main(["plan", "--model", "Llama-3.1-8B", "--gpu", "4090", "--max-model-len", "2"]) == 0
    ok = _trace(tmp_path, "ok.jsonl", ['{"arrival_time": 0, "output_len": 5, "token_ids": [9223372036854775807, 3]}'])
    assert main(["trace", "stats", ok]) == 0
    capsys.readouterr()
    assert main(["compare", BENCH, "--max-per-stage", "3", "--set", "engine.max_num_seqs=8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["max_num_seqs"] == 8
