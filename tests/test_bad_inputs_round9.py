"""The hostile corpus, ninth round (2026-12-06): inputs that hung or were silently overridden. Each is now
one line and exit 2 before any engine runs; beside each, the nearest valid input still runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sim.cli.main import main
from tests.test_bad_inputs import no_simulation, run_bad_case  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[1]
QUICK = str(REPO / "examples" / "quickstart.toml")


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- sweep --backend ray --address: Ray's connect retried for ever where nothing answered ---------------------
def test_ray_address_where_nothing_listens_is_one_line(tmp_path, capsys, no_simulation):  # noqa: F811
    port = _closed_port()
    run_bad_case(["sweep", QUICK, "--grid", "engine.max_num_seqs=8,16", "--backend", "ray", "--address",
                  f"127.0.0.1:{port}", "--out", str(tmp_path / "s.csv")],
                 ["--address", f"127.0.0.1:{port}", "nothing answers", "ray start --head"], capsys)


def test_ray_address_that_listens_passes_the_probe():
    from sim.app.sweep import reach_ray_address

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        reach_ray_address(f"127.0.0.1:{port}")
        reach_ray_address(f"ray://127.0.0.1:{port}")
    for a in ("auto", "local"):
        reach_ray_address(a)  # nothing to reach: Ray finds or starts the instance


def test_ray_address_probe_gives_up_after_its_timeout(monkeypatch):
    """A host that drops the packets: the probe's own timeout, said, instead of Ray's endless retries."""
    from sim.app import sweep
    from sim.core.errors import ConfigError

    def slow(addr, timeout):
        assert timeout == 0.25
        raise TimeoutError("timed out")

    monkeypatch.setattr(sweep.socket, "create_connection", slow)
    with pytest.raises(ConfigError, match=r"nothing answers at 10\.1\.2\.3:6379 \(no answer in 0\.25 s\)"):
        sweep.reach_ray_address("10.1.2.3:6379", timeout_s=0.25)


# ---- --set of one key twice: the later silently replaced the earlier --------------------------------------------
@pytest.mark.parametrize("second", ["engine.max_num_seqs=16", 'engine."max_num_seqs" = 16', " engine.max_num_seqs=16"])
def test_set_one_key_twice_with_two_values(second, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "engine.max_num_seqs=8", "--set", second],
                 ["--set engine.max_num_seqs is given twice", "'8' then '16'", "one value"], capsys)


def test_set_twice_refused_in_every_subcommand_that_takes_it(tmp_path, capsys, no_simulation):  # noqa: F811
    run_bad_case(["sweep", QUICK, "--grid", "engine.max_num_seqs=8,16", "--set", "workload.rate=1",
                  "--set", "workload.rate=2", "--out", str(tmp_path / "s.csv")],
                 ["--set workload.rate is given twice", "'1' then '2'"], capsys)


def test_set_twice_with_one_value_and_layered_flags_still_run(capsys):
    """The same value twice is no contradiction; --vllm-args and --goodput layer under and over the user's
    --set as before (the user's --set wins over the vLLM flag)."""
    from sim.app.config import check_set_repeats

    check_set_repeats(["engine.max_num_seqs=8", "engine.max_num_seqs = 8", "workload.rate=1", "workload.rate=1.0"])
    check_set_repeats(["model.dtype=fp8", "model.dtype=fp8_e4m3"])  # two spellings of one dtype
    rc = main(["run", QUICK, "--json", "--set", "simulation.num_requests=12", "--set", "engine.max_num_seqs=8",
               "--set", "engine.max_num_seqs=8", "--vllm-args", "--max-num-seqs 4", "--goodput", "ttft:1000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert '"num_finished": 12' in out
    assert '"max_num_seqs": 8' in out and '"max_num_seqs": 4' not in out  # the user's --set, not the flag


# ---- vLLM's own start-up rules (a parity audit against vLLM 0.33's EngineArgs / SchedulerConfig) -----------------
def _limits(gpu: str = "RTX 4090", model: str = "Mistral-7B", **engine):
    from sim.app.config import config_from_dict
    from sim.app.setup import resolve

    return resolve(config_from_dict({"model": {"name": model}, "hardware": {"gpu": gpu},
                                     "engine": {"max_model_len": 4096, **engine}})).limits


@pytest.mark.parametrize(("gpu", "seqs", "budget"), [
    ("RTX 4090", 256, 2048), ("A100 80GB SXM", 256, 2048),  # under 70 GiB, or any A100
    ("H100 SXM", 1024, 8192), ("H200 SXM", 1024, 8192), ("RTX PRO 6000 Blackwell", 1024, 8192),  # 70 GiB and up
    ("B200", 1024, 16384), ("MI300X", 1024, 16384),  # 160 GiB and up
])
def test_vllm_batch_defaults_by_card(gpu, seqs, budget):
    lim = _limits(gpu)
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (seqs, budget)


def test_vllm_defaulted_limits_follow_each_other():
    """A defaulted max_num_seqs is at most the budget (it was refused: 'must be >= max_num_seqs (256)'); a
    defaulted budget is at least max_model_len without chunking and at most max_num_seqs x max_model_len."""
    lim = _limits(max_num_batched_tokens=64)
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (64, 64)
    assert _limits("H100 SXM", enable_chunked_prefill=False, max_model_len=16384).max_num_batched_tokens == 16384
    assert _limits("H100 SXM", enable_chunked_prefill=False).max_num_batched_tokens == 8192
    assert _limits(max_num_seqs=2, max_model_len=512).max_num_batched_tokens == 1024
    assert _limits(policy="vllm-v0").max_num_batched_tokens == 4096  # V0: max(len, 2048)
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(64\) must be >= max_num_seqs \(128\)"):
        _limits(max_num_batched_tokens=64, max_num_seqs=128)  # both given: vLLM refuses it too


def test_long_prefill_threshold_past_max_model_len(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "engine.long_prefill_token_threshold=100000"],
                 ["[engine] long_prefill_token_threshold", "100000", "<= max_model_len (8192)"], capsys)
    assert _limits(long_prefill_token_threshold=4096).long_prefill_token_threshold == 4096


def test_block_override_past_the_card(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "engine.num_gpu_blocks_override=1000000"],
                 ["[engine] num_gpu_blocks_override = 1000000", "beside the weights", "allowed: up to"], capsys)
    assert _limits(num_gpu_blocks_override=3000).num_gpu_blocks == 3000  # within the card: as given


def test_max_model_len_auto_fits_to_memory(capsys, no_simulation):  # noqa: F811
    lim = _limits(model="Llama-3.1-8B", max_model_len=-1)
    from sim.core.errors import MemoryPlanError

    with pytest.raises(MemoryPlanError, match=r"allowed: a max_model_len up to (\d+)") as exc:
        _limits(model="Llama-3.1-8B", max_model_len=None)  # vLLM's default, the model's 131072: refused
    assert lim.max_model_len == int(str(exc.value).split("up to ")[1].split()[0])
    from sim.app.vllm_args import translate

    assert translate("--max-model-len auto").overrides == ["engine.max_model_len=-1"]
    assert translate("--max-model-len -1").overrides == ["engine.max_model_len=-1"]
    for bad in ("0", "-5"):
        run_bad_case(["run", QUICK, "--set", f"engine.max_model_len={bad}"],
                     ["[engine] max_model_len", f"got {bad}", "or -1 (the longest that fits"], capsys)


@pytest.mark.parametrize(("flags", "fragments"), [
    ("--dtype fp8", ["--dtype 'fp8'", "vLLM's choices", "bfloat16"]),
    ("--dtype bf16", ["--dtype 'bf16'", "vLLM's choices"]),
    ("--quantization int4", ["--quantization 'int4'", "not a vLLM quantization method", "awq"]),
    ("--kv-cache-dtype float32", ["--kv-cache-dtype 'float32'", "vLLM's choices", "fp8_e5m2"]),
])
def test_vllm_args_values_vllm_refuses(flags, fragments, capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--vllm-args", flags], fragments, capsys)


def test_vllm_args_values_vllm_takes():
    from sim.app.vllm_args import translate

    assert translate("--dtype bfloat16 --kv-cache-dtype fp8").overrides == [
        'model.dtype="bfloat16"', 'engine.kv_cache_dtype="fp8"']
    assert translate("--dtype auto --kv-cache-dtype auto").overrides == []  # servesim's defaults
    assert translate("--quantization awq").overrides == ['model.dtype="awq"']
    assert translate("--watermark 0.1", ("watermark",)).overrides == ["engine.watermark=0.1"]
    assert translate("--watermark 0.1").ignored == ["--watermark (not modelled by this preset)"]
    t = translate("--max-num-seqs 4 --max-num-seqs 8")  # argparse keeps the last, and servesim says so
    assert t.overrides[-1] == "engine.max_num_seqs=8"
    assert t.ignored == ["--max-num-seqs 4 (given again later: vLLM keeps the last, 8)"]


def test_bf16_on_a_card_without_it(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", 'hardware.gpu="T4"', "--set", 'model.name="Qwen3-0.6B"',
                  "--set", "engine.max_model_len=4096", "--set", "model.dtype=bf16"],
                 ["[model] dtype = 'bf16'", "T4 has no bfloat16", "allowed: auto"], capsys)
    assert _limits("T4", model="Qwen3-0.6B").max_num_seqs == 256  # auto: float16 there, as vLLM falls back


def test_tensor_parallel_message_lists_the_sizes_that_divide(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "hardware.tensor_parallel_size=3"],
                 ["tensor_parallel_size 3 does not divide num_attention_heads 32", "allowed: 1, 2, 4, 8"], capsys)


# ---- options that did nothing, and --gpu against the card a file names ------------------------------------------
def test_profile_under_the_constant_cost_model(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", 'engine.cost_model="constant"', "--set", 'hardware.profile="nope"'],
                 ["[hardware] profile = 'nope'", "roofline cost model only"], capsys)


def test_step_trace_setting_without_out(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", "simulation.record_step_trace=true"],
                 ["[simulation] record_step_trace = true", "--out"], capsys)


def test_level_and_replications_that_give_no_interval(tmp_path, capsys, no_simulation):  # noqa: F811
    grid = ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--out", str(tmp_path / "s.csv")]
    run_bad_case([*grid, "--level", "0.5"], ["--level 0.5", "--replications >= 2"], capsys)
    run_bad_case([*grid, "--replications", "2", "--level", "1.5"], ["--level", "1.5"], capsys)
    run_bad_case(["run", QUICK, "--intervals", "--replications", "1"],
                 ["--replications 1", "at least 2 seeds"], capsys)


def test_summarize_takes_a_result():
    import servesim
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match="summarize: expected a run's result.*got NoneType"):
        servesim.summarize(None)


def test_gpu_flag_against_the_card_the_file_names(tmp_path, capsys, no_simulation):  # noqa: F811
    run = str(REPO / "tests" / "data" / "runs" / "vllm_bench_result.json")
    run_bad_case(["compare", run, "--gpu", "h100"], ["--gpu h100", "says it ran on RTX 4090", "--gpu 'RTX 4090'"],
                 capsys)
    bench = str(REPO / "sim" / "cost" / "data" / "microbench" / "h200-sxm" / "qwen2-5-7b")
    run_bad_case(["fit", bench, "--gpu", "RTX 4090", "--out", str(tmp_path / "p.json")],
                 ["--gpu RTX 4090", "meta.json says the samples ran on H200 SXM", "leave --gpu out"], capsys)
    assert main(["fit", bench, "--gpu", "h200", "--out", str(tmp_path / "p.json")]) == 0  # the same card, named


def test_device_overlap_without_shared_cards_in_the_card_search(capsys, no_simulation):  # noqa: F811
    run_bad_case(["size", QUICK, "--gpus", "RTX 4090", "--target-rate", "5", "--device-overlap", "0.5"],
                 ["--device-overlap 0.5", "only with --instances-per-gpu above 1"], capsys)


def test_a_closed_loops_note_is_not_called_a_traces():
    from sim.app.simulate import format_summary

    class _R:  # what format_summary reads of a result beside the summary
        meta: dict = {}

    base = {"num_finished": 1, "config": {"workload": {"kind": "closed"}}, "trace_notes": ["only 12 clients send"]}
    assert "note: workload: only 12 clients send" in format_summary(base, _R())
    traced = {**base, "config": {"workload": {"trace": "t.jsonl"}}}
    assert "note: trace: only 12 clients send" in format_summary(traced, _R())


class RouteOnly:
    """A plug-in router with route() alone (no on_routed / on_done hooks): it used to fail at the first
    request with an AttributeError, mid-run."""

    reads_engine_metrics = False

    def route(self, spec, candidates, now):
        return candidates[0]


def _route_only(options, ctx):
    return RouteOnly()


def test_a_plugin_router_with_route_alone_runs(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(Path(QUICK).read_text() + '\n[cluster]\nreplicas = 2\nrouter = "tests.test_bad_inputs_round9:_route_only"\n')
    assert main(["run", str(cfg), "--set", "workload.num_requests=20", "--json"]) == 0, capsys.readouterr().err
    assert '"num_finished": 20' in capsys.readouterr().out


# ---- the review of this round's first version (helper-33) ----------------------------------------------------------
@pytest.mark.parametrize(("device", "card"), [
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),  # it resolved to the A100 80GB by its first word
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("H200", "H200 SXM"),
])
def test_device_names_as_vllm_records_them(device, card):
    """torch's device names (what vLLM records): the chip, its memory and form together, then shorter."""
    from sim.app.replay import resolve_gpu
    from sim.cost.hardware import device_gpu

    assert device_gpu(device) == resolve_gpu(device, "run") == card


def test_a_device_name_whose_memory_no_card_has_asks_for_gpu():
    from sim.app.replay import resolve_gpu
    from sim.core.errors import ConfigError
    from sim.cost.hardware import device_gpu

    assert device_gpu("NVIDIA A100 24GB") is None  # an A100, but not one of the catalogue's
    with pytest.raises(ConfigError, match="its memory is not A100 80GB SXM's; give --gpu NAME"):
        resolve_gpu("NVIDIA A100 24GB", "run.json")


def test_gpu_flag_against_a_vllm_device_name(tmp_path, capsys, no_simulation):  # noqa: F811
    import json
    import shutil

    src = REPO.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"
    if not src.is_dir():
        pytest.skip("../shared is not here")
    run = tmp_path / "run"
    shutil.copytree(src, run)
    meta = json.loads((run / "meta.json").read_text())
    text = json.dumps(meta).replace("NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3")
    if text == json.dumps(meta):
        pytest.skip("the run's meta.json names its card otherwise")
    (run / "meta.json").write_text(text)
    run_bad_case(["compare", str(run), "--gpu", "RTX 4090"], ["says it ran on H100 SXM"], capsys)


def _plan_json(argv, capsys) -> dict:
    import json

    assert main(["plan", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_plan_takes_the_batch_defaults_run_takes(capsys):
    args = ["--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192"]
    assert (_plan_json(args, capsys)["num_gpu_blocks"] == _plan_json([*args, "--preset", "vllm"], capsys)["num_gpu_blocks"]
            == _limits("H100 SXM", model="Llama-3.1-8B", max_model_len=8192).num_gpu_blocks)
    fit = ["--model", "llama-3.1-8b", "--gpu", "4090", "--max-model-len", "-1"]
    assert _plan_json(fit, capsys)["max_model_len"] == _plan_json([*fit, "--preset", "vllm"], capsys)["max_model_len"] > 8192


def test_minus_one_is_refused_where_a_slot_knob_sizes_the_context(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", 'engine.policy="llamacpp"', "--set", "engine.max_model_len=-1"],
                 ["max_model_len = -1", "'llamacpp' sizes its context by n_ctx"], capsys)
    assert _limits(policy="tgi", max_model_len=-1).max_model_len > 4096  # TGI: the longest that fits


def test_fp8_on_a_t4_offers_no_bf16(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", 'hardware.gpu="T4"', "--set", 'model.name="Qwen3-0.6B"',
                  "--set", "engine.max_model_len=4096", "--set", "model.dtype=fp8"],
                 ["allowed there: fp16, int8, awq, gptq"], capsys)


@pytest.mark.parametrize("argv", [
    ["sweep", QUICK, "--grid", "engine.max_num_seqs=4,8", "--out", "OUT/s.csv"],
    ["size", QUICK, "--max-num-seqs", "4,8"],
    ["run", QUICK, "--intervals"],
    ["run", str(REPO / "examples" / "cluster_pools.toml")],
])
def test_step_trace_setting_nothing_writes(argv, tmp_path, capsys, no_simulation):  # noqa: F811
    argv = [a.replace("OUT", str(tmp_path)) for a in argv]
    run_bad_case([*argv, "--set", "simulation.record_step_trace=true"], ["[simulation] record_step_trace = true"],
                 capsys)


def test_size_level_with_one_replication(capsys, no_simulation):  # noqa: F811
    run_bad_case(["size", QUICK, "--replications", "1", "--level", "0.9"],
                 ["--level 0.9", "--replications >= 2"], capsys)


def test_a_shared_profile_in_a_sweep_over_cost_models_runs(tmp_path, capsys):
    """The profile is used by the roofline points: shared, it stands (it is refused for one constant run)."""
    out = tmp_path / "s.csv"
    assert main(["sweep", QUICK, "--set", 'hardware.profile="prior"', "--set", "workload.num_requests=10",
                 "--grid", "engine.cost_model=roofline,constant", "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.exists()


def test_vllm_kv_dtypes_servesim_does_not_model(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--vllm-args", "--kv-cache-dtype nvfp4"],
                 ["--kv-cache-dtype 'nvfp4'", "servesim does not model", "fp8_e5m2"], capsys)


def test_set_of_one_card_by_two_names():
    from sim.app.config import check_set_repeats

    check_set_repeats(["hardware.gpu=4090", 'hardware.gpu="RTX 4090"'])


def test_plan_seeds_example_takes_minus_one_and_checks_the_budget(capsys, no_simulation):  # noqa: F811
    got = _plan_json(["--model", "llama-3.1-8b", "--gpu", "h100", "--seeds-example", "--max-model-len", "-1"], capsys)
    assert got["max_model_len"] > 4096  # the example's 4096 gave way to the longest that fits
    run_bad_case(["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "5000",
                  "--max-num-batched-tokens", "100"], ["--max-num-batched-tokens 100 must be >= --max-num-seqs 5000"],
                 capsys)


def test_a_slot_engines_kv_message_does_not_offer_minus_one(capsys, no_simulation):  # noqa: F811
    run_bad_case(["run", QUICK, "--set", 'engine.policy="llamacpp"', "--set", 'model.name="Llama-3.1-8B"',
                  "--set", "engine.max_model_len=131072"], ["[engine] n_ctx", "allowed: a max_model_len up to"], capsys)
    assert "-1 picks it" not in capsys.readouterr().err


def test_the_shared_device_hint_sums_within_the_card(tmp_path):
    import tomllib

    from sim.app.cluster_config import cluster_from_dict
    from sim.core.errors import ConfigError

    raw = tomllib.loads(Path(QUICK).read_text() + '[[replica]]\nname = "a"\ncount = 6\ndevice = "g0"\n')
    with pytest.raises(ConfigError, match=r"e\.g\. 0\.16 each") as exc:
        cluster_from_dict(raw)
    assert "0.17" not in str(exc.value)
    raw["replica"][0]["engine"] = {"gpu_memory_utilization": 0.16}
    cluster_from_dict(raw)  # the hint's value is accepted


def test_profile_under_constant_through_the_api():
    import servesim
    from sim.core.errors import ConfigError

    with pytest.raises(ConfigError, match="applies to the roofline cost model only"):
        servesim.run(QUICK, engine={"cost_model": "constant"}, hardware={"profile": "prior"})
