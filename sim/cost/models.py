"""Model architectures: the catalogue of named models and ``get_model`` (a name or a HF config.json path).

The catalogue is Python data for the models of ``shared/data/reference/models.csv`` (costmodel.md §4), plus
the published config.json keys of current models in sim/cost/data/models.toml (each with its source), read
once at import through the same HF-config reader a user's config.json goes through. Every entry's computed
parameter count is checked against its publisher's total (tests/test_models.py, tests/test_catalogue.py).

``ModelSpec`` and the dtype / byte arithmetic live in sim/cost/modelspec.py, HF config.json loading in
sim/cost/hf_config.py; they are re-exported here, so ``from sim.cost.models import ...`` keeps working.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, UnknownNameError
from sim.cost.hf_config import load_hf_config, spec_from_hf
from sim.cost.modelspec import (
    DTYPE_BYTES,
    QUANT_GROUP_OVERHEAD_BYTES,
    QUANT_GROUP_SIZE,
    GiB,
    ModelSpec,
    activation_dtype_bytes,
    kv_dtype_bytes,
    normalize_dtype,
)

__all__ = [
    "DTYPE_BYTES",
    "QUANT_GROUP_OVERHEAD_BYTES",
    "QUANT_GROUP_SIZE",
    "GiB",
    "ModelSpec",
    "activation_dtype_bytes",
    "get_model",
    "kv_dtype_bytes",
    "list_models",
    "load_hf_config",
    "normalize_dtype",
]

# ---------------------------------------------------------------------------------------------------
# Catalogue
# ---------------------------------------------------------------------------------------------------


def _llama(
    name: str,
    L: int,
    H: int,
    I: int,  # noqa: E741
    nh: int,
    nkv: int,
    V: int,
    max_pos: int,
    hd: int = 128,
    **kw: Any,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_hidden_layers=L,
        hidden_size=H,
        intermediate_size=I,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        vocab_size=V,
        max_position_embeddings=max_pos,
        **kw,
    )


_CATALOGUE: tuple[ModelSpec, ...] = (
    # models.csv rows (BLIS / Vidur / GenZ copies of HF config.json; costmodel.md §4). Published totals in
    # the comments; tests check them to 3 decimals.
    _llama("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, 4096),  # 6.738B
    _llama("Llama-2-13B", 40, 5120, 13824, 40, 40, 32000, 4096),  # 13.016B
    _llama("Llama-2-70B", 80, 8192, 28672, 64, 8, 32000, 4096),  # 68.977B
    _llama("Meta-Llama-3-8B", 32, 4096, 14336, 32, 8, 128256, 8192),  # 8.030B
    _llama("Meta-Llama-3-70B", 80, 8192, 28672, 64, 8, 128256, 8192),  # 70.554B
    _llama("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128256, 131072),  # 8.030B
    # Not in models.csv: HF meta-llama/Llama-3.1-70B config.json (same dims as Llama-3-70B, max_pos 131072);
    # confident (70.554B, matches the 70B total Meta publishes).
    _llama("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128256, 131072),
    _llama("Mistral-7B-v0.1", 32, 4096, 14336, 32, 8, 32000, 32768, sliding_window=4096),  # 7.242B
    _llama("Mixtral-8x7B", 32, 4096, 14336, 32, 8, 32000, 32768, num_experts=8, experts_per_tok=2),  # 46.703B
    _llama("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, 131072, qkv_bias=True),  # 7.616B
    _llama("Qwen2.5-14B", 48, 5120, 13824, 40, 8, 152064, 131072, qkv_bias=True),  # 14.770B
    _llama("Qwen2.5-72B", 80, 8192, 29568, 64, 8, 152064, 131072, qkv_bias=True),  # 72.706B
    # Not in models.csv: HF Qwen/Qwen3-32B config.json (64 layers, 5120, 25600, 64 heads, 8 KV, head_dim 128,
    # vocab 151936, max_pos 40960, q/k norm, no QKV bias); confident. Qwen reports 32.8B total.
    _llama("Qwen3-32B", 64, 5120, 25600, 64, 8, 151936, 40960, qk_norm=True),
    # Not in models.csv: HF Qwen/Qwen3-30B-A3B config.json (48 layers, 2048, 32 heads, 4 KV, head_dim 128,
    # 128 experts top-8, moe_intermediate_size 768, every layer MoE); confident. Qwen: 30.5B total, 3.3B active.
    _llama(
        "Qwen3-30B-A3B",
        48,
        2048,
        6144,
        32,
        4,
        151936,
        40960,
        qk_norm=True,
        num_experts=128,
        experts_per_tok=8,
        moe_intermediate_size=768,
    ),
    _llama("Yi-34B", 60, 7168, 20480, 56, 8, 64000, 4096),  # 34.389B
    # Not in models.csv: HF codellama/CodeLlama-34b-hf config.json (48 layers, 8192, 22016, 64 heads, 8 KV,
    # vocab 32000, max_pos 16384); confident. ~33.7B total.
    _llama("CodeLlama-34B", 48, 8192, 22016, 64, 8, 32000, 16384),
    # Gemma-2: head_dim 256 != hidden/heads (costmodel.md §1.1 note); 4 RMSNorms per layer; tied; 9.242B.
    _llama(
        "Gemma-2-9B",
        42,
        3584,
        14336,
        16,
        8,
        256000,
        8192,
        hd=256,
        tie_word_embeddings=True,
        norms_per_layer=4,
        sliding_window=4096,
    ),
    _llama("Phi-3-mini", 32, 3072, 8192, 32, 32, 32064, 4096, hd=96),  # 3.821B (4k variant)
    # OPT-13B: ReLU (non-gated, ffn_dim 20480), LayerNorm + biases, learned positions (2048 + 2 rows); 12.853B.
    _llama(
        "OPT-13B",
        40,
        5120,
        20480,
        40,
        40,
        50272,
        2048,
        tie_word_embeddings=True,
        gated_mlp=False,
        linear_bias=True,
        layer_norm=True,
        learned_pos_embeddings=2050,
    ),
    # DeepSeek-V2-Lite: MLA (kv_lora 512 + rope 64), 64 routed experts top-6 + 2 shared, first layer dense;
    # head_dim = qk head (128 nope + 64 rope); 15.706B total, 2.661B active.
    _llama(
        "DeepSeek-V2-Lite",
        27,
        2048,
        10944,
        16,
        16,
        102400,
        163840,
        hd=192,
        num_experts=64,
        experts_per_tok=6,
        num_shared_experts=2,
        moe_intermediate_size=1408,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    ),
    # The seeds' example model (seed article §"第二笔"): 7e9 parameters exactly, 32 layers, 8 KV heads,
    # head_dim 128. Other dims are Mistral-7B-like (our choice); the 7e9 override makes weights 14e9 B in FP16.
    _llama("seed-7b", 32, 4096, 14336, 32, 8, 32000, 4096, num_params_override=7_000_000_000),
)

DATA_FILE = Path(__file__).with_name("data") / "models.toml"


def _data_file_models() -> tuple[tuple[ModelSpec, ...], dict[str, str], dict[str, str]]:
    """(specs, aliases, sources) of models.toml: each entry's ``config`` table is its config.json's keys."""
    raw = tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))
    specs, aliases, sources = [], {}, {}
    for entry in raw["model"]:
        name = entry["name"]
        specs.append(spec_from_hf(entry["config"], f"{DATA_FILE.name} [{name}]", name=name))
        sources[name] = entry["source"]
        aliases.update({_norm(a): name for a in entry.get("aliases", ())})
    return tuple(specs), aliases, sources



# Extra spellings (already-normalized keys, see _norm) -> catalogue name.
_ALIASES: dict[str, str] = {
    "mistral7b": "Mistral-7B-v0.1",
    "mixtral8x7bv0.1": "Mixtral-8x7B",
    "phi3mini4k": "Phi-3-mini",
    "phi3mini4kinstruct": "Phi-3-mini",
    "seeds7b": "seed-7b",
    "seed": "seed-7b",
    "llama27bhf": "Llama-2-7B",
}

# Tokens that name a fine-tune or packaging, not an architecture: dropped wherever they appear.
_DROP_TOKENS = frozenset({"instruct", "chat", "hf", "it", "base", "2507"})


def _norm(name: str) -> str:
    """Lower-case, drop the org prefix and chat/instruct tokens, then drop separators."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    tokens = [t for t in re.split(r"[\s_\-]+", key) if t and t not in _DROP_TOKENS]
    if tokens and tokens[0] == "meta" and len(tokens) > 1:
        tokens = tokens[1:]
    return "".join(tokens)


_FILE_MODELS, _FILE_ALIASES, SOURCES = _data_file_models()
_CATALOGUE = (*_CATALOGUE, *_FILE_MODELS)
_BY_NAME: dict[str, ModelSpec] = {m.name: m for m in _CATALOGUE}
_LOOKUP: dict[str, str] = {_norm(n): n for n in _BY_NAME} | _ALIASES | _FILE_ALIASES


def list_models() -> list[str]:
    return [m.name for m in _CATALOGUE]


def get_model(name_or_path: str) -> ModelSpec:
    """A catalogue model by (alias-tolerant) name, or a ModelSpec read from a HF config.json path."""
    if isinstance(name_or_path, ModelSpec):  # convenience for callers holding a spec already
        return name_or_path
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.endswith(".json") or path.is_dir() or path.is_file():
        folder = path.is_dir()
        if folder:
            path = path / "config.json"
        if path.is_file():
            return load_hf_config(path)
        if folder:
            raise ConfigError(f"model folder {text} holds no config.json; allowed: a catalogue name, a config.json "
                              "path, or a folder holding one")
        if text.endswith(".json"):
            raise ConfigError(f"model config file not found: {text}")
    key = _norm(text)
    if key in _LOOKUP:
        return _BY_NAME[_LOOKUP[key]]
    close = difflib.get_close_matches(key, list(_LOOKUP), n=4, cutoff=0.5)
    names = sorted({_LOOKUP[c] for c in close})
    if "/" in text:  # a Hub id ("org/name"): the catalogue cannot fetch it, a downloaded config.json can
        near = f"; nearest: {', '.join(names)}" if names else ""
        raise UnknownNameError(f"model {text!r} is not in the catalogue; pass a config.json path (the model's "
                               f"config.json from the Hub, or a folder holding it){near} (servesim models lists "
                               "the catalogue)")  # fmt: skip
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    raise UnknownNameError(f"unknown model {text!r}{hint} Known: {', '.join(list_models())}")
