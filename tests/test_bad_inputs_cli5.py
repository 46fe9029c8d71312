"""The hostile corpus, the CLI's fifth round (fuzzC): size/plan/compare/trace/sweep/cluster and the price
flags. Each bad input ends in exit code 2 and one line before any engine runs (the harness of part one);
next to it, the nearest valid input still works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import QUICK, SIZING, no_simulation, run_bad_case  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
BENCH = str(REPO / "tests" / "data" / "runs" / "vllm_bench_result.json")
TRACE = str(REPO / "examples" / "sample_trace.jsonl")
POOLS = str(REPO / "examples" / "cluster_pools.toml")
N = ["--set", "workload.num_requests=10"]
SIZE = ["size", SIZING, "--jobs", "1", "--replications", "1", *N]
CARDS = [*SIZE, "--target-concurrency", "2", "--seqs-per-deployment", "1", "--gpus", "RTX 4090"]
SWEEP = ["sweep", QUICK, *N, "--jobs", "1", "--grid", "engine.max_num_seqs=4,8"]
PLAN = ["plan", "--model", "Llama-3.1-8B", "--gpu", "4090"]

CASES = [
    # H1: a --tol below float resolution never ended
    ("size-tol-tiny", lambda t: [*SIZE, "--tol", "1e-17"], ["--tol", "1e-17", "1e-06 <= value < 1"]),
    # E1: every deployment ruled out before any simulation (was exit 1, empty stderr)
    ("size-cards-tp3", lambda t: [*CARDS, "--tp", "3"], ["--tp 3", "no deployment can run", "does not divide"]),
    # S4: one variant twice ran twice
    ("cluster-variant-twice", lambda t: ["cluster", POOLS, *N, "--variant", "one-pool", "--variant", "one-pool"],
     ["--variant 'one-pool'", "given twice"]),
    # S5: an empty string read as "not given"
    ("compare-gpu-empty", lambda t: ["compare", BENCH, "--gpu", ""], ["--gpu ''", "empty", "GPU"]),
    ("compare-profile-empty", lambda t: ["compare", BENCH, "--profile", ""], ["--profile ''", "empty"]),
    ("sweep-vllm-args-empty", lambda t: [*SWEEP, "--out", str(t / "s.csv"), "--vllm-args", ""],
     ["--vllm-args ''", "empty"]),
    ("size-vllm-args-blank", lambda t: [*SIZE, "--vllm-args", " "], ["--vllm-args ' '", "empty"]),
    ("plan-model-empty", lambda t: ["plan", "--model", "", "--gpu", "H100"], ["--model ''", "empty"]),
    ("plan-gpu-empty", lambda t: ["plan", "--model", "Llama-3.1-8B", "--gpu", ""], ["--gpu ''", "empty"]),
    # S6: empty items of comma lists dropped silently
    ("size-max-num-seqs-trailing", lambda t: [*SIZE, "--max-num-seqs", "4,"], ["--max-num-seqs", "'4,'", "empty"]),
    ("size-max-num-seqs-inner", lambda t: [*SIZE, "--max-num-seqs", "4,,8"], ["--max-num-seqs", "empty"]),
    ("size-gpus-leading", lambda t: [*SIZE, "--target-concurrency", "2", "--gpus", ",RTX 4090"],
     ["--gpus", "empty"]),
    ("size-dtypes-trailing", lambda t: [*CARDS, "--dtypes", "fp16,"], ["--dtypes", "empty"]),
    ("size-kv-dtypes-trailing", lambda t: [*CARDS, "--kv-dtypes", "auto,"], ["--kv-dtypes", "empty"]),
    ("size-tp-trailing", lambda t: [*CARDS, "--tp", "1,"], ["--tp", "empty"]),
    ("size-instances-trailing", lambda t: [*CARDS, "--instances-per-gpu", "1,"], ["--instances-per-gpu", "empty"]),
    # S7: one dtype under two spellings
    ("size-dtypes-alias", lambda t: [*CARDS, "--dtypes", "fp16,half"], ["--dtypes", "'fp16' and 'half'", "same"]),
    ("size-kv-dtypes-alias", lambda t: [*CARDS, "--kv-dtypes", "fp8,fp8_e4m3"],
     ["--kv-dtypes", "'fp8' and 'fp8_e4m3'", "same"]),
    # S9: flags that did nothing
    ("size-throughput-slo", lambda t: [*SIZE, "--max-num-seqs", "4,8", "--goal", "throughput", "--slo", "ttft:1"],
     ["--slo", "--goal throughput"]),
    ("size-throughput-min-attainment", lambda t: [*SIZE, "--goal", "throughput", "--min-attainment", "0.5"],
     ["--min-attainment", "--goal throughput"]),
    ("size-min-attainment-percentile-only", lambda t: [*SIZE, "--slo", "p99_ttft:2000", "--min-attainment", "0.01"],
     ["--min-attainment 0.01", "per-request", "p99_ttft_ms"]),
    ("trace-seed-unused", lambda t: ["trace", "stats", TRACE, "--seed", "5"], ["--seed 5", "--sample"]),
    ("run-gpu-hour-unused-card", lambda t: ["run", QUICK, *N, "--gpu-hour", "H100=1"],
     ["--gpu-hour 'H100=1'", "H100 SXM", "RTX 4090"]),
    ("run-gpu-hour-usd-shadowed", lambda t: ["run", QUICK, *N, "--gpu-hour-usd", "2", "--gpu-hour", "RTX 4090=1"],
     ["--gpu-hour-usd 2", "--gpu-hour"]),
    ("size-gpu-hour-unused-card", lambda t: [*CARDS, "--gpu-hour", "H100=1"], ["--gpu-hour 'H100=1'"]),
    # S10: --grid and --vllm-args on one key
    ("sweep-grid-vllm-args", lambda t: [*SWEEP, "--out", str(t / "s.csv"), "--vllm-args", "--max-num-seqs 16"],
     ["--grid engine.max_num_seqs", "--vllm-args", "one of them"]),
    # S14: a context length twice printed its row twice
    ("plan-context-length-twice", lambda t: [*PLAN, "--max-model-len", "4096", "--context-length", "1024",
                                             "--context-length", "1024"], ["--context-length 1024", "given twice"]),
    # E4: the search's own axis under --vary
    ("size-vary-max-num-seqs", lambda t: [*SIZE, "--vary", "engine.max_num_seqs=4,8"],
     ["--vary engine.max_num_seqs=4,8", "--max-num-seqs 4,8"]),
    # E5: arrival without rate on a run that records its arrivals
    ("compare-arrival-no-rate", lambda t: ["compare", BENCH, "--max-per-stage", "5", "--set", "workload.arrival=gamma"],
     ["--set workload.arrival=gamma", "workload.rate=R"]),
    # E7: garbled messages
    ("run-gpu-hour-two-equals", lambda t: ["run", QUICK, *N, "--gpu-hour", "RTX 4090=1=2"],
     ["--gpu-hour 'RTX 4090=1=2'", "GPU=PRICE"]),
    ("plan-preset-unknown", lambda t: [*PLAN, "--preset", "VLLM"], ["--preset 'VLLM'", "unknown policy"]),
    ("plan-usable-gib-minus-inf", lambda t: [*PLAN, "--usable-gib", "-inf"], ["--usable-gib", "-inf"]),
    ("models-extra", lambda t: ["models", "extra"], ["unrecognized arguments: extra", "servesim models --help"]),
]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize("name,argv,fragments", CASES, ids=[c[0] for c in CASES])
def test_cli5_one_line_exit_2(name, argv, fragments, tmp_path, capsys):
    run_bad_case(argv(tmp_path), fragments, capsys)


def test_price_set_currency_message_no_usd_rate(capsys):
    """A CNY price set cannot be converted to USD: usd_rate is not offered ("USD per USD")."""
    run_bad_case(["run", QUICK, *N, "--price-set", "seeds-idc10000", "--currency", "USD"], ["CNY"], capsys)
    assert "usd_rate" not in capsys.readouterr().err


# ---- the nearest valid inputs ---------------------------------------------------------------------------


def _ok(argv: list[str], capsys) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_list_flags_still_parse():
    """Spaces around items, single values, and distinct dtypes are fine (parsing only)."""
    from sim.cli.main import build_parser

    p = build_parser()
    a = p.parse_args(["size", SIZING, "--max-num-seqs", " 4 , 8 ", "--gpus", "RTX 4090, L4", "--dtypes", "fp16,int8",
                      "--kv-dtypes", "auto,fp8", "--tp", "1", "--instances-per-gpu", "1,2", "--tol", "1e-6"])
    assert a.max_num_seqs == [4, 8] and a.gpus == ["RTX 4090", "L4"] and a.tol == 1e-6


def test_card_deployments_distinct_dtypes_valid():
    """fp16 and bf16, auto and fp8, awq and gptq (different kernels) stay distinct deployments."""
    from sim.app.card_search import deployments
    from sim.app.config import load_config

    cfg = load_config(SIZING)
    deps = deployments(cfg, ["RTX 4090"], ["fp16", "bf16", "awq", "gptq"], ["auto", "fp8"])
    assert len(deps) == 8


def test_size_cards_some_valid_tp_runs(capsys):
    """--tp 1,3: TP3 is ruled out in the table, TP1 still searched (no refusal when one deployment runs)."""
    rc = main([*CARDS, "--tp", "1,3", "--max-num-seqs", "4", "--json"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    labels = [d["deployment"]["tp"] if isinstance(d.get("deployment"), dict) else d for d in
              json.loads(out.out)["deployments"]]
    assert len(labels) == 2


def test_size_throughput_without_slo_and_min_attainment_with_per_request(capsys):
    _ok([*SIZE, "--max-num-seqs", "4,8", "--goal", "throughput"], capsys)
    main([*SIZE, "--max-num-seqs", "4", "--slo", "ttft:100000", "--min-attainment", "0.5"])
    assert "Traceback" not in capsys.readouterr().err


def test_cluster_distinct_variants(capsys):
    assert "one-pool" in _ok(["cluster", POOLS, *N, "--variant", "one-pool"], capsys)


def test_compare_gpu_and_arrival_with_rate(capsys):
    out = _ok(["compare", BENCH, "--max-per-stage", "5", "--set", "workload.arrival=gamma",
               "--set", "workload.rate=2", "--set", "workload.burstiness=0.5"], capsys)
    assert "overall" in out


def test_compare_all_timed_out_says_so(capsys):
    """V2: every request timed out: the empty table comes with a note."""
    out = _ok(["compare", BENCH, "--max-per-stage", "5", "--set", "workload.client_timeout_s=0.001"], capsys)
    assert "none of the" in out and "finished" in out
    assert "none of the" not in _ok(["compare", BENCH, "--max-per-stage", "5"], capsys)


def test_sweep_vllm_args_other_key(tmp_path, capsys):
    _ok([*SWEEP, "--out", str(tmp_path / "s.csv"), "--vllm-args", "--max-num-batched-tokens 2048"], capsys)


def test_sweep_footer_level(tmp_path, capsys):
    """E7: --level 0.99999999 was printed as 99%."""
    out = _ok([*SWEEP, "--out", str(tmp_path / "s.csv"), "--replications", "2", "--level", "0.99999999"], capsys)
    assert "99.999999% t-intervals" in out


def test_trace_seed_with_sample_or_drawn_arrivals(tmp_path, capsys):
    assert "seed 5" in _ok(["trace", "stats", TRACE, "--seed", "5", "--sample", "0.5"], capsys)
    f = tmp_path / "counts.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n30,7\n")
    assert "seed 5" in _ok(["trace", "stats", str(f), "--format", "token-counts", "--rate", "2",
                               "--seed", "5"], capsys)


def test_run_gpu_hour_for_its_card(capsys):
    out = _ok(["run", QUICK, *N, "--gpu-hour", "RTX 4090=1"], capsys)
    assert "RTX 4090" in out


def test_plan_seeds_example_gpu_uses_its_memory(capsys):
    """S13: --seeds-example --gpu H100 plans the H100's memory, not the example's 22.5 GiB."""
    out = _ok(["plan", "--seeds-example", "--gpu", "H100"], capsys)
    assert "H100" in out and "22.50 GiB" not in out and "79.60 GiB" in out
    kept = _ok(["plan", "--seeds-example", "--gpu", "H100", "--usable-gib", "22.5"], capsys)
    assert "22.50 GiB" in kept
    assert "22.50 GiB" in _ok(["plan", "--seeds-example"], capsys)


def test_plan_default_rows_within_max_model_len(capsys):
    """V1: the default concurrency rows stop at --max-model-len; asked-for lengths still print."""
    out = _ok([*PLAN, "--max-model-len", "4096"], capsys)
    assert "8,192" not in out and "4,096" in out
    out = _ok([*PLAN, "--max-model-len", "4096", "--context-length", "1024", "--context-length", "2048"], capsys)
    assert "2,048" in out
    assert "12" in _ok([*PLAN, "--max-model-len", "12"], capsys)


def test_plan_preset_and_negative_values(capsys):
    assert "Memory plan" in _ok([*PLAN, "--preset", "tgi"], capsys)
    run_bad_case([*PLAN, "--usable-gib=-1e5"], ["--usable-gib", "-100000"], capsys)


def test_models_help_and_plain(capsys):
    assert _ok(["models"], capsys)


# ---- the second review's mends ---------------------------------------------------------------------------
def test_intervals_take_the_vllm_flags_and_refuse_what_their_table_drops(capsys):
    """--vllm-args describe the engine the intervals replicate (they were dropped); goodput and price flags
    would be dropped (the table has no goodput or cost): refused."""
    base = ["run", QUICK, "--set", "workload.num_requests=12", "--intervals", "--replications", "2", "--json"]
    assert main(base) == 0
    wide = json.loads(capsys.readouterr().out)
    assert main([*base, "--vllm-args", "--max-num-seqs 1"]) == 0
    narrow = json.loads(capsys.readouterr().out)
    assert narrow != wide  # one sequence at a time: other latencies
    run_bad_case([*base, "--gpu-hour", "A100 80GB=2"], ["--gpu-hour", "not with --intervals"], capsys)
    run_bad_case([*base, "--goodput", "ttft:100"], ["--goodput", "not with --intervals"], capsys)


def test_one_price_list_for_a_file_whichever_variant_runs(tmp_path, capsys):
    """A --gpu-hour for a card another variant of the file uses is not refused when --variant picks one."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nname = "Llama-3.1-8B"\n[hardware]\ngpu = "H100 SXM"\n[workload]\nrate = 2.0\n'
                   "num_requests = 8\nprompt = 100\noutput = 10\n[cluster]\nreplicas = 1\n[variants.h100]\n"
                   '[variants.a100]\nhardware = {gpu = "A100 80GB"}\n')
    assert main(["cluster", str(cfg), "--variant", "h100", "--gpu-hour", "H100=2", "--gpu-hour", "A100 80GB=1.5",
                 "--json"]) == 0, capsys.readouterr().err
