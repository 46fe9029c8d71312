"""The hostile corpus, tenth round, config side: a swap_space whose bytes overflowed (a traceback) or were
refused as a derived num_cpu_blocks, a user's workload.rate_scale without the bound time_scale has, a --set
on a table and then on one of its keys, a variant's bad workload (unnamed, and
after the other variants ran), a nested [variants] table, device_overlap's range, negative --vllm-args
integers; and what was refused or left unsaid wrongly: vLLM's block_size 256, plan --max-model-len auto /
32k, another card's [hardware] profile (run, with a note), a sessions workload's unused clients and cap, and
client_timeout_s in the allowed keys. Each bad input is one line and exit code 2 before any engine runs;
beside each, the nearest valid input still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.app.config import check_set_repeats, load_config
from sim.cli.main import main
from sim.core.errors import ConfigError
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)
from tests.test_bad_inputs_cluster4 import _write, no_cluster  # noqa: F401  (a fixture)

# One small engine: constant 10 ms steps, five short requests
BASE = """[model]
name = "Mistral-7B"
[hardware]
gpu = "RTX 4090"
[engine]
cost_model = "constant"
constant_step_s = 0.01
max_model_len = 4096
[workload]
rate = 20.0
num_requests = 5
prompt = { dist = "fixed", value = 64 }
output = { dist = "fixed", value = 8 }
"""
CLUSTER = BASE.replace("Mistral-7B", "Llama-3.1-8B").replace("RTX 4090", "H100 SXM")
POOLS = '[[replica]]\nname = "s"\npool = "short"\n[[replica]]\nname = "l"\npool = "long"\n'
TRACE = '{"arrival_time":0.0,"prompt_len":10,"output_len":5}\n{"arrival_time":0.5,"prompt_len":20,"output_len":5}\n'
SESSIONS = BASE.split("[workload]")[0] + """[workload]
kind = "sessions"
num_sessions = 3
turns = {dist = "uniform", low = 2, high = 3}
message = 50
output = 20
num_clients = 2
think_time = 1.0
"""


def _trace_cfg(tmp: Path) -> str:
    (tmp / "t.jsonl").write_text(TRACE)
    return _write(tmp, BASE.split("[workload]")[0] + '[workload]\ntrace = "t.jsonl"\n')


def _ok(argv: list[str], capsys) -> tuple[str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out, out.err


# ---- 1, 20: swap_space past any host: an OverflowError traceback, or a refusal naming num_cpu_blocks ----------
@pytest.mark.parametrize("value", ["1e308", "1e300", "1e12", "1e7"])
def test_swap_space_too_large_is_named(value, tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, BASE), "--set", 'engine.policy="vllm-v0"', "--set",
                  f"engine.swap_space={value}"], ["[engine] swap_space", "from 0 to 1048576 GiB", "got 1"], capsys)


def test_swap_space_past_int32_blocks_is_named_as_swap_space(tmp_path, capsys, no_simulation):  # noqa: F811
    """1-token blocks of 128 KiB: a PiB of swap is 2^33 CPU blocks; said as the swap_space given."""
    run_bad_case(["run", _write(tmp_path, BASE), "--set", 'engine.policy="vllm-v0"', "--set", "engine.block_size=1",
                  "--set", "engine.swap_space=1048576"],
                 ["[engine] swap_space must be at most", "131,072-byte KV blocks", "got 1048576"], capsys)


def test_swap_space_within_the_bound_runs(tmp_path, capsys):
    out, _ = _ok(["run", _write(tmp_path, BASE), "--json", "--set", 'engine.policy="vllm-v0"', "--set",
                  "engine.swap_space=100000"], capsys)
    assert json.loads(out)["completed"] == 5


# ---- 7: a user's rate_scale, bounded as time_scale is (the sizing search's is not) ----------------------------
@pytest.mark.parametrize("value", ["1e308", "1e7", "1000001"])
def test_rate_scale_past_a_million_is_refused(value, tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _trace_cfg(tmp_path), "--set", f"workload.rate_scale={value}"],
                 ["workload.rate_scale", "allowed rate_scale <= 1e+06", "time_scale >= 1e-06"], capsys)


def test_rate_scale_in_a_file_a_stream_a_variant_or_a_grid_is_refused(tmp_path, capsys, no_cluster):  # noqa: F811
    cfg = _trace_cfg(tmp_path)
    text = Path(cfg).read_text().replace('trace = "t.jsonl"', 'trace = "t.jsonl"\nrate_scale = 2e6')
    run_bad_case(["run", _write(tmp_path, text, "f.toml")], ["workload.rate_scale", "2000000.0"], capsys)
    variant = Path(cfg).read_text() + "[cluster]\n[variants.a]\nworkload = {rate_scale = 3e6}\n"
    run_bad_case(["run", _write(tmp_path, variant, "v.toml")], ["[variants.a] workload.rate_scale", "3000000.0"],
                 capsys)
    run_bad_case(["sweep", cfg, "--grid", "workload.rate_scale=2,3e7", "--out", str(tmp_path / "s.csv")],
                 ["--grid workload.rate_scale", "30000000.0", "<= 1e+06"], capsys)
    stream = CLUSTER.split("[workload]")[0] + ('[cluster]\nreplicas = 1\n[[stream]]\nname = "a"\ntrace = "t.jsonl"\n'
                                               "rate_scale = 5e6\n")
    run_bad_case(["run", _write(tmp_path, stream, "s.toml")], ["[[stream]] #1.rate_scale", "5000000.0"], capsys)


def test_rate_scale_of_a_million_and_the_sizing_offline_point_run(tmp_path, capsys):
    from sim.app.cluster import simulate_cluster
    from sim.app.simulate import simulate
    from sim.app.sizing import OFFLINE_SCALE, LoadKnob

    cfg = _trace_cfg(tmp_path)
    out, _ = _ok(["run", cfg, "--json", "--set", "workload.rate_scale=1e6"], capsys)
    assert json.loads(out)["completed"] == 2
    offline = LoadKnob("rate_scale", 1.0, "req/s").offline(load_config(cfg))  # the sizing search's own scale
    assert offline.workload["rate_scale"] == OFFLINE_SCALE
    assert len(simulate(offline).requests) == 2
    raw = {k: v for k, v in offline.to_dict().items() if v is not None or k == "frontend"}
    raw["cluster"] = {"replicas": 2}  # the card search's shared-card runs go through a raw cluster config
    assert len(simulate_cluster(raw).requests) == 2


# ---- 9: another card's profile runs, with a note ---------------------------------------------------------------
@pytest.mark.parametrize("profile", ["h100-sxm", "H100 SXM"])
def test_another_cards_profile_runs_with_one_note(profile, tmp_path, capsys):
    base = BASE.replace('cost_model = "constant"\nconstant_step_s = 0.01\n', "")
    _, err = _ok(["run", _write(tmp_path, base), "--set", f'hardware.profile="{profile}"'], capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: note: [hardware] profile"), err
    assert "measured on the H100 SXM, not on this run's RTX 4090" in lines[0]


def test_the_cards_own_profile_and_a_cluster_of_another(tmp_path, capsys):
    base = BASE.replace('cost_model = "constant"\nconstant_step_s = 0.01\n', "")
    _, err = _ok(["run", _write(tmp_path, base), "--set", 'hardware.profile="rtx-4090"'], capsys)
    assert err.strip() == ""
    cl = CLUSTER.replace('cost_model = "constant"\nconstant_step_s = 0.01\n', "") + "[cluster]\nreplicas = 2\n"
    _, err = _ok(["run", _write(tmp_path, cl), "--set", 'hardware.profile="rtx-4090"'], capsys)
    assert err.count("servesim: note:") == 1 and "not on this run's H100 SXM" in err, err


# ---- 11: --set on a table, then on one of its keys --------------------------------------------------------------
@pytest.mark.parametrize("sets", [['workload.prompt={dist="fixed",value=5}', "workload.prompt.value=6"],
                                  ["workload.prompt.value=6", 'workload.prompt={dist="fixed",value=5}']])
def test_set_on_a_table_and_one_of_its_keys(sets, tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, BASE), "--set", sets[0], "--set", sets[1]],
                 ["the table workload.prompt and its key workload.prompt.value", "allowed:"], capsys)


def test_set_on_a_table_and_the_same_value_of_its_key():
    check_set_repeats(['workload.prompt={dist="fixed",value=5}', "workload.prompt.value=5"])
    check_set_repeats(['workload.prompt={dist="fixed",value=5}', "workload.output.value=5"])  # another table
    # the table, then a key it does not give: the key joins the table (nothing replaced, review of round 10)
    check_set_repeats(['workload.prompt={value=5}', 'workload.prompt.dist="fixed"'])
    # the key, then a table without it: the table replaces the key
    with pytest.raises(ConfigError, match="the table workload.prompt and its key workload.prompt.dist"):
        check_set_repeats(['workload.prompt.dist="fixed"', 'workload.prompt={value=5}'])


def test_set_on_a_table_then_a_new_key_of_it_runs(tmp_path, capsys):
    """As before round 10: the later key is added to the table the earlier --set gave."""
    from sim.app.config import apply_overrides

    sets = ['workload.prompt={dist="lognormal", mean=1000, std=600}', "workload.prompt.max=6000"]
    check_set_repeats(sets)
    assert apply_overrides({}, sets)["workload"]["prompt"] == {"dist": "lognormal", "mean": 1000, "std": 600,
                                                                "max": 6000}


# ---- 12: pool labels under a router that routes by none: kept (the reports group replicas by pool) ---------
@pytest.mark.parametrize("router", ['"least-kv"', '"round-robin"', '{name = "session-affinity"}'])
def test_pool_labels_under_any_router_load(router, tmp_path):
    """Not refused: a pool label also names a group of replicas in the load-balance report and the tables'
    pool column (sim/app/cluster_metrics.py), whichever router routes."""
    from sim.app.cluster_config import load_cluster

    cfgs = load_cluster(_write(tmp_path, CLUSTER + f"[cluster]\nrouter = {router}\n" + POOLS))
    assert [r.pool for r in cfgs[""].replicas] == ["short", "long"]


@pytest.mark.parametrize("router", ['{name = "length-pools", threshold = 100}',
                                    '{name = "session-affinity", fallback = "length-pools"}'])
def test_pool_labels_a_pool_router_reads_load(router, tmp_path):
    from sim.app.cluster_config import load_cluster

    cfgs = load_cluster(_write(tmp_path, CLUSTER + f"[cluster]\nrouter = {router}\n" + POOLS))
    assert [r.pool for r in cfgs[""].replicas] == ["short", "long"]


# ---- 13: a sessions workload says what the closed loop and a trace say ------------------------------------------
def test_sessions_notes_unused_clients_and_a_cap_past_the_turns(tmp_path, capsys):
    cfg = _write(tmp_path, SESSIONS)
    out, _ = _ok(["run", cfg, "--set", "workload.num_clients=100"], capsys)
    assert "note: workload: num_clients = 100 for 3 conversations: only 3 clients run a conversation" in out
    out, _ = _ok(["run", cfg, "--set", "workload.num_requests=1000000"], capsys)
    assert "note: workload: num_requests = 1000000, but the 3 conversations drawn have only 8 turns: 8 requests" in out
    out, _ = _ok(["run", cfg], capsys)
    assert "note:" not in out


# ---- 14: vLLM's block_size 256 --------------------------------------------------------------------------------
def test_block_size_256_is_accepted_everywhere(tmp_path, capsys):
    cfg = _write(tmp_path, BASE)
    for argv in (["--set", "engine.block_size=256"], ["--vllm-args", "--block-size 256"],
                 ["--set", 'engine.policy="trtllm"', "--set", "engine.tokens_per_block=256"]):
        out, _ = _ok(["run", cfg, "--json", *argv], capsys)
        assert json.loads(out)["completed"] == 5
    out, _ = _ok(["plan", "--model", "Mistral-7B", "--gpu", "4090", "--block-size", "256", "--json"], capsys)
    assert json.loads(out)["block_size"] == 256


def test_block_size_512_is_still_refused(tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, BASE), "--set", "engine.block_size=512"],
                 ["[engine] block_size: got 512", "128 or 256"], capsys)


# ---- 15: plan --max-model-len in vLLM's spellings ----------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [("auto", 32768), ("32k", 32000), ("1K", 1024), ("4096", 4096)])
def test_plan_max_model_len_as_vllm_reads_it(value, expected, capsys):
    out, _ = _ok(["plan", "--model", "Mistral-7B", "--gpu", "4090", "--max-model-len", value, "--json"], capsys)
    assert json.loads(out)["max_model_len"] == expected


def test_plan_max_model_len_not_a_length(capsys):
    run_bad_case(["plan", "--model", "Mistral-7B", "--gpu", "4090", "--max-model-len", "x"],
                 ["--max-model-len 'x'", "expected an integer"], capsys)


# ---- 17: device_overlap's range ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-0.5", "2"])
def test_device_overlap_range_is_0_to_1(value, tmp_path, capsys, no_cluster):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, CLUSTER + "[cluster]\nreplicas = 2\n"), "--set",
                  f"cluster.device_overlap={value}"], ["[cluster].device_overlap", "from 0 to 1,", value], capsys)


# ---- 18, 19: a variant's bad workload, and a nested [variants] -----------------------------------------------------
@pytest.mark.parametrize("bad, fragment", [("rate = -2.0", "workload.rate: must be > 0.0, got -2.0"),
                                           ("num_requests = 0", "workload.num_requests: must be >= 1, got 0")])
def test_a_variants_bad_workload_is_named_before_any_variant_runs(bad, fragment, tmp_path, capsys, monkeypatch,
                                                                  no_cluster):  # noqa: F811
    text = CLUSTER + f"[cluster]\n[variants.a]\nworkload = {{ rate = 2.0 }}\n[variants.b]\nworkload = {{ {bad} }}\n"
    run_bad_case(["run", _write(tmp_path, text)], ["[variants.b]: " + fragment], capsys)
    from sim.app.cluster import simulate_variants

    with pytest.raises(ConfigError, match=r"^\[variants\.b\]: workload"):
        simulate_variants(tmp_path / "c.toml")


def test_variants_with_good_workloads_run(tmp_path, capsys):
    text = CLUSTER + "[cluster]\n[variants.a]\nworkload = { rate = 2.0 }\n[variants.b]\nworkload = { rate = 4.0 }\n"
    out, _ = _ok(["run", _write(tmp_path, text), "--json"], capsys)
    assert {v["completed"] for v in json.loads(out).values()} == {5}


def test_nested_variants_say_they_cannot_be_nested(tmp_path, capsys, no_cluster):  # noqa: F811
    text = CLUSTER + "[cluster]\n[variants.a]\ncluster = { replicas = 1 }\n[variants.a.variants.b]\ncluster = { replicas = 2 }\n"
    run_bad_case(["run", _write(tmp_path, text)], ["[variants.a]", "variants cannot be nested"], capsys)
    assert "sim.app" not in capsys.readouterr().err


# ---- 21: a negative integer in --vllm-args --------------------------------------------------------------------------
@pytest.mark.parametrize("flags, fragments", [("--max-num-seqs -5", ["max_num_seqs", "got -5", "allowed 1 <= value"]),
                                              ("--num-gpu-blocks-override -1",
                                               ["num_gpu_blocks_override", "got -1", "allowed 1 <= value"])])
def test_vllm_args_negative_integer_says_the_range(flags, fragments, tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, BASE), "--vllm-args", flags], fragments, capsys)


def test_vllm_args_integer_spellings():
    from sim.core.fields import human_int, max_model_len

    assert [human_int(t, "x") for t in ("64", "-5", "+8", "32k", "1K")] == [64, -5, 8, 32000, 1024]
    assert max_model_len("auto", "x") == max_model_len("-1", "x") == -1
    with pytest.raises(ConfigError, match="expected an integer"):
        human_int("5x", "x")


# ---- 23: client_timeout_s among every workload kind's allowed keys ------------------------------------------------
@pytest.mark.parametrize("text, kind", [(BASE, "open loop"), (SESSIONS, "sessions"),
                                        (BASE.replace("rate = 20.0", 'kind = "closed"\nnum_clients = 2'), "closed loop")])
def test_allowed_keys_name_client_timeout_s(text, kind, tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", _write(tmp_path, text), "--set", "workload.max_concurrency=2"],
                 [f"workload ({kind}): unknown key 'max_concurrency'", "client_timeout_s"], capsys)


def test_client_timeout_s_passes_a_sweeps_workload_check(tmp_path, capsys):
    out, _ = _ok(["sweep", _write(tmp_path, BASE), "--grid", "engine.max_num_seqs=4,8", "--set",
                  "workload.client_timeout_s=5", "--out", str(tmp_path / "s.csv")], capsys)
    assert (tmp_path / "s.csv").is_file()


# ---- the review of round 10 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-5", "0"])
def test_plan_max_model_len_out_of_range_offers_auto(value, capsys):
    run_bad_case(["plan", "--model", "Mistral-7B", "--gpu", "4090", f"--max-model-len={value}"],
                 [f"got {value}", "allowed 2 <= value", "-1 / auto"], capsys)


def test_an_unmodelled_flag_keeps_its_negative_value():
    """``--max-logprobs -1`` is a flag and its value (vLLM takes -1 there), not two flags."""
    from sim.app.vllm_args import translate

    t = translate("vllm serve m --max-logprobs -1 --max-num-seqs 8")
    assert t.ignored == ["--max-logprobs (not modelled)"]
    assert "engine.max_num_seqs=8" in t.overrides
