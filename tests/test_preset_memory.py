"""Each preset sizes its KV cache by its engine's start-up rule (docs/memory_reservations.md): the default
configs start where the real engine starts, and the KV budgets stay in the documented ranges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.app.config import config_from_dict
from sim.app.engine_memory import CUDA_CONTEXT_BYTES, ggml_graph_bytes
from sim.app.simulate import resolve
from sim.core.errors import ConfigError, MemoryPlanError, ServesimError
from sim.cost.models import get_model

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "4090": ("Llama-3.1-8B", "RTX 4090", 1),
    "a100": ("Llama-3.1-8B", "A100 80GB", 1),
    "mixtral-tp2": ("Mixtral-8x7B", "H100", 2),
    "70b-tp4": ("Llama-3.1-70B", "H100", 4),
}
# KV budget per GPU in GiB at max_model_len 8192 (docs/memory_reservations.md, "after"); the engines'
# CUDA context and non-torch memory are known to about +-0.5 GiB, so each range is the value +-0.6 GiB.
DOCUMENTED = {
    "vllm": (5.04, 55.87, 26.56, 34.08),  # H100: vLLM's defaults there, 8192 tokens / 1024 sequences
    "vllm-v0": (4.59, 55.43, 26.20, 36.75),
    "orca": (5.04, 55.87, 27.34, 37.20),
    "sarathi": (3.79, 48.98, 20.13, 30.77),
    "trtllm": (6.28, 57.12, 30.74, 40.39),
    "tgi": (6.30, 57.14, 31.16, 39.41),
    "static": (7.73, 64.22, 34.87, 45.53),
    "hf-static": (7.73, 64.22, 34.87, 45.53),
    "llamacpp": (8.80, 65.29, 35.49, 46.22),
    "ollama": (8.80, 65.29, 35.49, 46.22),
}


def setup_for(preset: str, case: str = "4090", **engine):
    model, gpu, tp = CASES[case]
    return resolve(config_from_dict({"model": {"name": model},
                                     "hardware": {"gpu": gpu, "tensor_parallel_size": tp},
                                     "engine": {"policy": preset, **engine}}))


@pytest.mark.parametrize("preset", sorted(DOCUMENTED))
@pytest.mark.parametrize("i,case", list(enumerate(CASES)))
def test_kv_budget_in_documented_range(preset, i, case):
    plan = setup_for(preset, case, max_model_len=8192).memory
    want = DOCUMENTED[preset][i]
    assert abs(plan.kv_budget_bytes / GIB - want) <= 0.6, (preset, case, plan.kv_budget_bytes / GIB)


@pytest.mark.parametrize("preset", ["tgi", "static", "hf-static", "llamacpp", "ollama"])
def test_defaults_start_on_a_4090_like_the_engine(preset):
    """TGI infers max_total_tokens from memory, HF checks nothing, llama.cpp / Ollama allocate n_ctx /
    num_ctx (4096): none refuses Llama-3.1-8B on 24 GB for its 131072-token context."""
    setup = setup_for(preset)
    assert setup.limits.num_gpu_blocks > 1000
    assert 4096 <= setup.limits.max_model_len <= 131072
    if preset in ("llamacpp", "ollama"):
        assert setup.limits.max_model_len == 4096 and setup.limits.num_gpu_blocks == 4097  # n_ctx + 1 slots


@pytest.mark.parametrize("preset", ["vllm", "vllm-v0"])
def test_vllm_refuses_the_full_context_on_a_4090(preset):
    """vLLM raises "max seq len (131072) is larger than the maximum number of tokens that can be stored in
    KV cache" at start-up; so does the plan."""
    with pytest.raises(MemoryPlanError, match="max_model_len 131072"):
        setup_for(preset)


def test_preset_default_utilization():
    assert setup_for("vllm", max_model_len=8192).memory.gpu_memory_utilization == 0.9
    assert setup_for("sarathi", max_model_len=8192).memory.gpu_memory_utilization == 0.8  # WorkerConfig
    for preset in ("trtllm", "tgi", "static", "llamacpp", "ollama"):
        assert setup_for(preset, max_model_len=8192).memory.gpu_memory_utilization == 1.0, preset
    # an explicit value is the card's share, for every preset
    half = setup_for("trtllm", "a100", max_model_len=8192, gpu_memory_utilization=0.5).memory
    full = setup_for("trtllm", "a100", max_model_len=8192).memory
    assert abs(full.kv_budget_bytes - half.kv_budget_bytes - 0.9 * 0.5 * full.total_memory_bytes) < 2**20


def test_trtllm_takes_its_fraction_of_free_memory():
    """_cal_max_memory: KV = (total - peak) x free_gpu_memory_fraction."""
    p9 = setup_for("trtllm", max_model_len=8192).memory
    p5 = setup_for("trtllm", max_model_len=8192, free_gpu_memory_fraction=0.5).memory
    free = p9.total_memory_bytes - p9.non_kv_bytes
    assert p9.context_bytes == CUDA_CONTEXT_BYTES and p9.free_fraction == 0.9
    assert abs(p9.kv_budget_bytes - 0.9 * free) < 2 and abs(p5.kv_budget_bytes - 0.5 * free) < 2
    with pytest.raises(ConfigError, match="free_gpu_memory_fraction"):
        setup_for("trtllm", max_model_len=8192, free_gpu_memory_fraction=1.5)


def test_tgi_warmup_counts_logits_for_every_prefill_token():
    """prefill_logprobs in the warmup request: 4096 x vocab bf16 logits (~0.98 GiB for Llama-3.1-8B)
    dominate the forward's intermediates; the KV is TGI_WIGGLE_ROOM of what is left."""
    plan = setup_for("tgi", max_model_len=8192).memory
    model = get_model("Llama-3.1-8B")
    assert plan.activation_bytes == 4096 * model.vocab_size * 2
    assert setup_for("tgi", max_model_len=8192, wiggle_room=0.5).memory.kv_budget_bytes < 0.6 * plan.kv_budget_bytes
    with pytest.raises(ConfigError, match="wiggle_room"):
        setup_for("tgi", wiggle_room=1.0)


def test_llamacpp_keeps_the_input_embedding_on_the_host():
    vllm = setup_for("vllm", max_model_len=8192).memory
    llama = setup_for("llamacpp").memory
    model = get_model("Llama-3.1-8B")
    assert vllm.weight_bytes - llama.weight_bytes == model.vocab_size * model.hidden_size * 2


def test_ollama_graph_size_matches_its_formula():
    """fs/ggml/ggml.go GraphSize, llama: max(4b(1+4H+ctx(1+heads)), 4b(H+vocab)); b=512, ctx=4096."""
    m = get_model("Llama-3.1-8B")
    assert ggml_graph_bytes(m, 4096, 512) == 4 * 512 * (1 + 4 * 4096 + 4096 * 33)
    assert ggml_graph_bytes(m, 16, 512) == 4 * 512 * (4096 + 128256)  # logits win at a short context
    assert setup_for("ollama").memory.activation_bytes == ggml_graph_bytes(m, 4096, 512)
    assert setup_for("ollama", num_parallel=2).memory.activation_bytes == ggml_graph_bytes(m, 8192, 512)


def test_slot_engine_context_that_cannot_fit_names_its_knob():
    with pytest.raises(MemoryPlanError, match=r"n_ctx = 1000000 tokens"):
        setup_for("llamacpp", n_ctx=1_000_000)
    with pytest.raises(ServesimError, match="num_ctx x num_parallel"):
        setup_for("ollama", num_ctx=32768, num_parallel=4)  # 16 GiB of KV on a 24 GB card
    with pytest.raises(ServesimError, match="num_ctx x num_parallel"):
        setup_for("ollama", num_ctx=8192, num_parallel=8)  # fits the graph, not the 8 GiB pool


def test_vllm_v0_profiles_the_budget_it_schedules():
    """No chunked prefill: max_num_batched_tokens = max_model_len, and profile_run covers it (32768 tokens
    of intermediates, ~4 GiB on an 8B model); V0 counts the CUDA context among non-torch memory."""
    plan = setup_for("vllm-v0", "a100", max_model_len=32768).memory
    assert plan.activation_bytes > 3.5 * GIB
    v1 = setup_for("vllm", "a100", max_model_len=32768).memory  # chunked prefill: a 2048-token profile
    assert v1.activation_bytes < 1.1 * GIB
    assert plan.non_torch_bytes > v1.non_torch_bytes + 0.4 * GIB
    with pytest.raises(MemoryPlanError, match="max_model_len 32768"):  # 4 GiB of intermediates on 24 GB
        setup_for("vllm-v0", max_model_len=32768)


def test_plan_cli_preset():
    def plan(*args):
        return subprocess.run([sys.executable, "-m", "sim.cli.main", "plan", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})

    r = plan("--preset", "trtllm", "--model", "llama-3.1-8b", "--gpu", "4090", "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    assert "free after loading" in r.stdout and "x 0.90" in r.stdout and "CUDA context" in r.stdout
    r = plan("--preset", "tgi")
    assert r.returncode == 2 and "--preset needs --model and --gpu" in r.stderr and "Traceback" not in r.stderr
