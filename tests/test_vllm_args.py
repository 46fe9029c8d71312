"""vLLM flags in (issue 15, item 4): ``--vllm-args`` maps each flag servesim models onto the config, names each
one it does not, and a malformed value is one line with exit code 2; ``servesim models`` / ``gpus`` list the
catalogues."""

from __future__ import annotations

import json

import pytest

from sim.app.vllm_args import FLAGS, translate
from sim.cli.main import main
from sim.core.errors import ConfigError

VLLM_V1 = ("long_prefill_token_threshold", "preemption_mode")  # the vllm preset's own keys used here


def test_every_modelled_flag_maps_to_its_config_key():
    t = translate("--max-num-seqs 64 --max-num-batched-tokens=8192 --max-model-len 32k --gpu-memory-utilization "
                  "0.85 --block-size 32 --kv-cache-dtype fp8 --dtype bfloat16 -tp 2 --enable-prefix-caching "
                  "--no-enable-chunked-prefill --scheduling-policy priority --async-scheduling "
                  "--num-gpu-blocks-override 900 --long-prefill-token-threshold 512 --preemption-mode recompute",
                  VLLM_V1)  # fmt: skip
    assert t.overrides == [
        "engine.max_num_seqs=64", "engine.max_num_batched_tokens=8192", "engine.max_model_len=32000",
        "engine.gpu_memory_utilization=0.85", "engine.block_size=32", 'engine.kv_cache_dtype="fp8"',
        'model.dtype="bfloat16"', "hardware.tensor_parallel_size=2", "engine.enable_prefix_caching=true",
        "engine.enable_chunked_prefill=false", 'engine.scheduling_policy="priority"', "engine.async_scheduling=true",
        "engine.num_gpu_blocks_override=900", "engine.long_prefill_token_threshold=512",
        'engine.preemption_mode="recompute"',
    ]  # fmt: skip
    assert t.ignored == []


def test_a_vllm_serve_line_names_the_model_and_lists_what_is_not_modelled():
    t = translate("vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 --max_num_seqs 16 --enforce-eager "
                  "--served-model-name llama --swap-space 4 --max-num-partial-prefills 2 --max-model-len auto")
    assert t.model == "meta-llama/Llama-3.1-8B-Instruct"
    # auto: the longest that fits (vLLM's _auto_fit_max_model_len), servesim's -1
    assert t.overrides == ['model.name="meta-llama/Llama-3.1-8B-Instruct"', "engine.max_num_seqs=16",
                           "engine.max_model_len=-1"]
    assert t.ignored == ["--port (not modelled)", "--enforce-eager (not modelled)",
                         "--served-model-name (not modelled)", "--swap-space (not modelled by this preset)",
                         "--max-num-partial-prefills (not modelled)"]  # fmt: skip
    assert translate("--swap-space 8 --preemption-mode swap", ("swap_space", "preemption_mode")).overrides == [
        "engine.swap_space=8.0", 'engine.preemption_mode="swap"']  # the vllm-v0 preset models both


def test_quantization_names_the_weights_and_wins_over_dtype():
    assert translate("--quantization awq --dtype half").overrides == ['model.dtype="awq"']
    assert translate("--dtype half -q fp8").overrides == ['model.dtype="fp8"']
    t = translate("-q bitsandbytes")
    assert t.overrides == [] and "its bits come from the checkpoint's quantization_config" in t.ignored[0]
    assert translate("-q gguf").ignored and translate("--quantization=MODELOPT_FP4").ignored  # vLLM's names


@pytest.mark.parametrize("text", ["-q bogusquant", "--quantization=int3", "--quantization awqq"])
def test_a_quantization_vllm_does_not_have_is_refused(text):
    """vLLM refuses a --quantization outside its choices; ignoring it would run the wrong model silently."""
    with pytest.raises(ConfigError, match=r"not a vLLM quantization method \(one of .*gptq"):
        translate(text)


@pytest.mark.parametrize("text, words", [
    ("--max-num-seqs abc", ["--max-num-seqs 'abc'", "expected an integer"]),
    ("--max-num-seqs", ["--max-num-seqs: expects a value"]),
    ("--gpu-memory-utilization high", ["--gpu-memory-utilization 'high'", "expected a number"]),
    ("--enable-prefix-caching=yes", ["is a switch and takes no value"]),
    ("--max-model-len 1.5k7", ["expected an integer"]),
    ("model-a model-b", ["unexpected argument 'model-b'"]),
    ("--max-num-seqs '64", ["cannot split it as a shell line"]),
])  # fmt: skip
def test_malformed_values_are_config_errors(text, words):
    with pytest.raises(ConfigError) as e:
        translate(text)
    for w in words:
        assert w in str(e.value)


def test_the_table_uses_vllm_names():
    # Each flag is an EngineArgs field in kebab case (vllm/engine/arg_utils.py); none is a servesim-only name.
    assert all(f.startswith("--") and "_" not in f for f in FLAGS)
    assert {"--max-num-seqs", "--enable-prefix-caching", "--tensor-parallel-size", "--kv-cache-dtype"} <= set(FLAGS)


CFG = """[model]
name = "Llama-3.1-8B"
[hardware]
gpu = "H100 SXM"
[engine]
max_model_len = 4096
cost_model = "constant"
[workload]
rate = 50.0
num_requests = 12
prompt = {dist = "fixed", value = 64}
output = {dist = "fixed", value = 8}
"""


def test_run_takes_the_flags_and_set_still_wins(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text(CFG, encoding="utf-8")
    rc = main(["run", str(p), "--json", "--set", "engine.max_num_batched_tokens=4096", "--vllm-args",
               "vllm serve Qwen/Qwen3-8B --max-num-seqs 3 --max-num-batched-tokens 1024 --host 0.0.0.0 "
               "--no-enable-prefix-caching"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0
    s = json.loads(out)
    assert s["config"]["model"]["name"] == "Qwen/Qwen3-8B" and s["config"]["engine"]["max_num_seqs"] == 3
    assert s["config"]["engine"]["max_num_batched_tokens"] == 4096  # --set after the vLLM flags
    assert s["config"]["engine"]["enable_prefix_caching"] is False
    assert err.strip().splitlines() == ["servesim: ignored: --host (not modelled)"]


@pytest.mark.parametrize("flags, words", [
    ("--max-num-seqs abc", ["--max-num-seqs 'abc'"]),
    ("vllm serve Qwen/Qwen3-235B-A22B", ["not in the catalogue; pass a config.json", "nearest:"]),
    ("--block-size 48", ["block_size", "48"]),
])  # fmt: skip
def test_bad_flags_from_the_cli_are_one_line(tmp_path, capsys, flags, words):
    p = tmp_path / "c.toml"
    p.write_text(CFG, encoding="utf-8")
    assert main(["run", str(p), "--vllm-args", flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for w in words:
        assert w in err


def test_size_and_sweep_accept_vllm_args():
    from sim.cli.main import build_parser

    parser = build_parser()
    for cmd in (["size", "c.toml"], ["sweep", "c.toml", "--out", "x.parquet"]):
        assert parser.parse_args([*cmd, "--vllm-args", "--max-num-seqs 8"]).vllm_args == "--max-num-seqs 8"


def test_models_and_gpus_list_the_catalogues(capsys):
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["Qwen3-8B"]["layers"] == 36 and rows["gpt-oss-120b"]["experts"] == "4/128"
    assert rows["Llama-3.1-8B"]["kv_kib_per_token"] == 128.0  # 2 x 32 x 8 x 128 x 2 bytes
    assert main(["gpus", "--json"]) == 0
    gpus = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert gpus["H100 SXM"]["bandwidth_gb_s"] > 3000 and gpus["RTX 4090"]["memory_gib"] < 24
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "Llama-4-Scout-17B-16E" in text and "e+" not in text
