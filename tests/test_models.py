"""Model catalogue: parameter counts vs published totals, KV bytes, dtypes, config.json loading, names."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from sim.core.errors import ConfigError, UnknownNameError
from sim.cost.hf_config import load_hf_config
from sim.cost.models import (
    GiB,
    ModelSpec,
    get_model,
    kv_dtype_bytes,
    list_models,
    normalize_dtype,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"

# Published totals (billions, 3 decimals) copied from shared/data/reference/models.csv params_total_B /
# params_active_B; the four models not in that CSV use the totals their publishers state.
PUBLISHED_B = {
    "Llama-2-7B": 6.738,
    "Llama-2-13B": 13.016,
    "Llama-2-70B": 68.977,
    "Meta-Llama-3-8B": 8.030,
    "Meta-Llama-3-70B": 70.554,
    "Llama-3.1-8B": 8.030,
    "Mistral-7B-v0.1": 7.242,
    "Qwen2.5-7B": 7.616,
    "Qwen2.5-14B": 14.770,
    "Qwen2.5-72B": 72.706,
    "Mixtral-8x7B": 46.703,
    "Yi-34B": 34.389,
    "Gemma-2-9B": 9.242,
    "Phi-3-mini": 3.821,
    "DeepSeek-V2-Lite": 15.706,
    "OPT-13B": 12.853,
}
ACTIVE_B = {"Mixtral-8x7B": 12.880, "DeepSeek-V2-Lite": 2.661}
# Publisher round numbers for the rest: Qwen3-32B 32.8B, Qwen3-30B-A3B 30.5B (3.3B active),
# CodeLlama-34B ~33.7B, Llama-3.1-70B 70.6B.
ROUGH_B = {
    "Qwen3-32B": (32.8, None),
    "Qwen3-30B-A3B": (30.5, 3.3),
    "CodeLlama-34B": (33.7, None),
    "Llama-3.1-70B": (70.6, None),
}
CSV_NAME = {"Phi-3-mini": "Phi-3-mini-4k"}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_param_count_matches_published_total(name: str) -> None:
    assert round(get_model(name).num_params / 1e9, 3) == pytest.approx(PUBLISHED_B[name], abs=1e-9)


@pytest.mark.parametrize("name", sorted(ACTIVE_B))
def test_moe_active_params(name: str) -> None:
    m = get_model(name)
    assert m.is_moe
    assert round(m.num_active_params / 1e9, 3) == pytest.approx(ACTIVE_B[name], abs=1e-9)
    assert m.num_active_params < m.num_params


@pytest.mark.parametrize("name", sorted(ROUGH_B))
def test_models_outside_csv_match_publisher_numbers(name: str) -> None:
    total, active = ROUGH_B[name]
    m = get_model(name)
    assert round(m.num_params / 1e9, 1) == pytest.approx(total, abs=0.051)
    if active is not None:  # Qwen states "3.3B activated"; the config gives 3.353B (publisher truncates)
        assert m.num_active_params / 1e9 == pytest.approx(active, abs=0.06)


def test_exact_counts_quoted_in_costmodel_md() -> None:
    # costmodel.md §4: exact published totals.
    assert get_model("Llama-2-7B").num_params == 6_738_415_616
    assert get_model("Meta-Llama-3-8B").num_params == 8_030_261_248
    assert get_model("Phi-3-mini").num_params == 3_821_079_552


def test_catalogue_against_shared_csv() -> None:
    path = SHARED / "data" / "reference" / "models.csv"
    if not path.exists():
        pytest.skip("shared data absent")
    rows = {r["model"]: r for r in csv.DictReader(path.open())}
    checked = 0
    for name in list_models():
        row = rows.get(CSV_NAME.get(name, name))
        if row is None:
            continue
        m = get_model(name)
        assert round(m.num_params / 1e9, 3) == pytest.approx(float(row["params_total_B"]), abs=1e-9), name
        assert round(m.num_active_params / 1e9, 3) == pytest.approx(
            float(row["params_active_B"]), abs=1e-9
        ), name
        assert m.kv_bytes_per_token(dtype="fp16") == int(row["kv_bytes_per_token_fp16"]), name
        assert m.num_hidden_layers == int(row["num_hidden_layers"]), name
        assert m.head_dim == int(row["head_dim"]), name
        assert m.vocab_size == int(row["vocab_size"]), name
        assert m.max_position_embeddings == int(row["max_position_embeddings"]), name
        checked += 1
    assert checked == 16


def test_required_catalogue_entries() -> None:
    names = set(list_models())
    for n in (
        "Llama-2-7B",
        "Llama-3.1-70B",
        "Qwen3-32B",
        "Qwen3-30B-A3B",
        "CodeLlama-34B",
        "seed-7b",
        "DeepSeek-V2-Lite",
        "OPT-13B",
        "Gemma-2-9B",
        "Phi-3-mini",
        "Mixtral-8x7B",
    ):
        assert n in names


def test_gemma2_head_dim_from_config_not_hidden_over_heads() -> None:
    g = get_model("gemma-2-9b")
    assert g.head_dim == 256
    assert g.hidden_size // g.num_attention_heads == 224
    assert g.q_size == 4096 != g.hidden_size
    assert g.kv_bytes_per_token(dtype="fp16") == 2 * 42 * 8 * 256 * 2 == 344_064


def test_mla_kv_bytes_deepseek_v2_lite() -> None:
    m = get_model("DeepSeek-V2-Lite")
    assert m.is_mla
    assert m.kv_bytes_per_token(dtype="fp16") == 31_104  # 27 × (512 + 64) × 2
    assert m.kv_bytes_per_token(kv_cache_dtype="fp8") == 15_552
    # MLA's latent is not split by TP (every rank holds it).
    assert m.kv_bytes_per_token(tensor_parallel_size=2) == 31_104
    assert m.kv_bytes_per_block_layer(16) == 16 * 576 * 2


def test_seed_7b_is_the_seeds_model() -> None:
    s = get_model("seed-7b")
    assert s.num_params == 7_000_000_000
    assert (s.num_hidden_layers, s.num_key_value_heads, s.head_dim) == (32, 8, 128)
    assert s.kv_bytes_per_token(dtype="fp16") == 131_072  # 128 KiB
    assert s.weight_bytes("fp16") == 14_000_000_000
    assert round(s.weight_bytes("fp16") / GiB, 2) == 13.04
    mha = dataclasses.replace(s, num_key_value_heads=32)
    assert mha.kv_bytes_per_token(dtype="fp16") == 524_288  # 512 KiB
    assert s.kv_bytes_per_token(kv_cache_dtype="fp8") == 65_536


def test_int4_weights_simple_and_detailed() -> None:
    s = get_model("seed-7b")
    assert s.weight_bytes("int4", simple=True) == 3_500_000_000
    assert round(s.weight_bytes("int4", simple=True) / GiB, 2) == 3.26
    assert s.weight_bytes("awq", simple=True) == s.weight_bytes("gptq", simple=True) == 3_500_000_000
    detailed = s.weight_bytes("int4")
    # Embeddings + LM head stay 16-bit and groups add scales: more than the simple figure, far below fp16.
    emb = s.embedding_params + s.norm_params
    linear = s.num_params - emb
    assert detailed == linear // 2 + -(-linear // 128) * 4 + emb * 2
    assert 3_500_000_000 < detailed < 7_000_000_000
    assert s.weight_bytes("int8", simple=True) == s.weight_bytes("fp8", simple=True) == 7_000_000_000
    assert s.weight_bytes("int8") == linear + 2 * emb


def test_dtype_names() -> None:
    assert normalize_dtype("auto") == "bf16"
    assert normalize_dtype("float16") == normalize_dtype("half") == "fp16"
    assert normalize_dtype("bfloat16") == "bf16"
    assert normalize_dtype("gptq") == normalize_dtype("awq") == "int4"
    assert kv_dtype_bytes("auto", "bf16") == 2
    assert kv_dtype_bytes("auto", "int4") == 2  # quantized weights still compute / cache in 16-bit
    for kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert kv_dtype_bytes(kv) == 1
    with pytest.raises(ConfigError, match="float13"):
        normalize_dtype("float13")
    with pytest.raises(ConfigError, match="int3"):
        kv_dtype_bytes("int3")
    with pytest.raises(ConfigError):
        get_model("seed-7b").weight_bytes("nf3")


def test_dims_for_cost_model() -> None:
    m = get_model("Llama-3.1-8B")
    assert (m.q_size, m.kv_size, m.mlp_matrices, m.num_layers) == (4096, 1024, 3, 32)
    assert not m.is_moe and not m.is_mla
    assert get_model("OPT-13B").mlp_matrices == 2


@pytest.mark.parametrize(
    "alias,name",
    [
        ("llama-3.1-8b", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "Meta-Llama-3-8B"),
        ("mistral-7b", "Mistral-7B-v0.1"),
        ("Mistral-7B", "Mistral-7B-v0.1"),
        ("mistralai/Mistral-7B-Instruct-v0.1", "Mistral-7B-v0.1"),
        ("LLAMA-2-7B-HF", "Llama-2-7B"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
        ("facebook/opt-13b", "OPT-13B"),
        ("google/gemma-2-9b-it", "Gemma-2-9B"),
        ("microsoft/Phi-3-mini-4k-instruct", "Phi-3-mini"),
        ("codellama/CodeLlama-34b-Instruct-hf", "CodeLlama-34B"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", "DeepSeek-V2-Lite"),
    ],
)
def test_aliases(alias: str, name: str) -> None:
    assert get_model(alias).name == name


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(UnknownNameError, match="did you mean.*Llama-3.1-8B") as exc:
        get_model("llama-3.1-9b")
    assert "llama-3.1-9b" in str(exc.value)
    with pytest.raises(ConfigError):  # UnknownNameError is a ConfigError
        get_model("no-such-model-xyz")


def _write(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_hf_config_llama_roundtrip(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    m = get_model(str(_write(tmp_path, cfg)))
    ref = get_model("Llama-3.1-8B")
    assert m.head_dim == 128  # default hidden/heads
    assert m.num_params == ref.num_params
    assert m.kv_bytes_per_token() == ref.kv_bytes_per_token()
    assert get_model(str(tmp_path)).num_params == ref.num_params  # a directory holding config.json


def test_hf_config_defaults_and_head_dim(tmp_path: Path) -> None:
    cfg = {
        "model_type": "gemma2",
        "num_hidden_layers": 42,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "sliding_window": 4096,
    }
    m = load_hf_config(_write(tmp_path, cfg))
    assert m.head_dim == 256 and m.norms_per_layer == 4
    assert m.num_params == get_model("Gemma-2-9B").num_params
    mha = {k: v for k, v in cfg.items() if k not in ("num_key_value_heads", "head_dim")}
    m2 = load_hf_config(_write(tmp_path, mha, "mha.json"))
    assert m2.num_key_value_heads == 16 and m2.head_dim == 224


def test_hf_config_moe_mla_qwen_opt(tmp_path: Path) -> None:
    ds = {
        "model_type": "deepseek_v2",
        "num_hidden_layers": 27,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 102400,
        "max_position_embeddings": 163840,
        "n_routed_experts": 64,
        "num_experts_per_tok": 6,
        "n_shared_experts": 2,
        "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": None,
        "tie_word_embeddings": False,
    }
    m = load_hf_config(_write(tmp_path, ds, "ds.json"))
    ref = get_model("DeepSeek-V2-Lite")
    assert (m.num_params, m.num_active_params) == (ref.num_params, ref.num_active_params)
    assert m.kv_bytes_per_token(dtype="fp16") == 31_104

    mix = {
        "model_type": "mixtral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    assert (
        load_hf_config(_write(tmp_path, mix, "mix.json")).num_params == get_model("Mixtral-8x7B").num_params
    )

    qw = {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }
    q = load_hf_config(_write(tmp_path, qw, "qw.json"))
    assert q.qkv_bias and q.num_params == get_model("Qwen2.5-7B").num_params

    q3 = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "tie_word_embeddings": False,
    }
    assert load_hf_config(_write(tmp_path, q3, "q3.json")).num_params == get_model("Qwen3-30B-A3B").num_params

    opt = {
        "model_type": "opt",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "ffn_dim": 20480,
        "num_attention_heads": 40,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
        "activation_function": "relu",
        "tie_word_embeddings": True,
    }
    o = load_hf_config(_write(tmp_path, opt, "opt.json"))
    assert not o.gated_mlp and o.mlp_matrices == 2
    assert o.num_params == get_model("OPT-13B").num_params


def test_hf_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_hf_config(_write(tmp_path, {"hidden_size": 8}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json"):
        get_model(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        get_model(str(tmp_path / "missing.json"))


def test_modelspec_original_constructor_still_valid() -> None:
    m = ModelSpec("x", 2, 64, 128, 4, 2, 16, 100, 512)
    assert m.num_params > 0 and m.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2
    assert m.kv_heads_per_gpu(4) == 1  # replicated when tp > nkv
