"""A ``ModelSpec`` from a HF config.json (Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek/OPT keys).

``sim.cost.models.get_model`` calls this for a path; ``load_hf_config`` is also importable from sim.cost.models.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.cost.modelspec import ModelSpec
from sim.cost.quantconfig import checkpoint_dtype

_MAX_DIM = 10**7  # no real config comes near: a guard against typos and absurd values


def _int(cfg: dict[str, Any], key: str, where: Path, *, lo: int = 1, default: Any = ..., hi: int = _MAX_DIM) -> Any:
    """``cfg[key]`` as an integer in [lo, hi] (integral floats accepted); missing/null: ``default``
    (``...``: required). The error names the file, the key, the value and what is allowed."""
    v = cfg.get(key)
    if v is None:
        if default is ...:
            raise ConfigError(f"{where}: missing required key {key!r}")
        return default
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{where}: {key}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def load_hf_config(path: str | Path) -> ModelSpec:
    """Build a ModelSpec from a HF config.json (Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek/OPT keys)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a JSON text file (not UTF-8 at byte {exc.start})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not readable JSON: arrays or objects nested too deeply") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return spec_from_hf(cfg, path, name=cfg.get("_name_or_path") or path.parent.name or str(path))


def spec_from_hf(cfg: dict[str, Any], path: Path | str, name: str | None = None) -> ModelSpec:
    """A ModelSpec from the keys of a HF config.json (a file's, or the catalogue's copy in
    sim/cost/data/models.toml); ``path`` names the source in errors. Multimodal wrappers
    (Gemma-3, Llama-4, Mistral-3) are read from their ``text_config``."""
    path = Path(path)
    name = name or cfg.get("_name_or_path") or str(path)
    quant = cfg.get("quantization_config")  # top level, also for multimodal wrappers
    wrapper_tie = cfg.get("tie_word_embeddings")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model here
    model_type = str(cfg.get("model_type", "")).lower()
    gemma = model_type.startswith("gemma")
    llama4 = model_type.startswith("llama4")
    L = _int(cfg, "num_hidden_layers", path)
    H = _int(cfg, "hidden_size", path)
    nh = _int(cfg, "num_attention_heads", path)
    nkv = _int(cfg, "num_key_value_heads", path, default=nh) or nh
    if nh % nkv:
        raise ConfigError(f"{path}: num_key_value_heads: must divide num_attention_heads ({nh}), got {nkv}")
    if "head_dim" not in cfg and H % nh:  # transformers' own default is hidden_size // heads, exactly
        raise ConfigError(f"{path}: hidden_size {H} is not a multiple of num_attention_heads {nh}; allowed: a "
                          "multiple, or head_dim given")
    for key in ("attention_bias", "tie_word_embeddings", "enable_bias", "use_sliding_window"):
        if key in cfg and cfg[key] is not None and not isinstance(cfg[key], bool):
            raise ConfigError(f"{path}: {key}: expected true or false, got {cfg[key]!r}")
    hd = _int(cfg, "head_dim", path, default=H // nh) or H // nh
    if hd < 1:
        raise ConfigError(f"{path}: hidden_size {H} / num_attention_heads {nh} gives head_dim 0; set head_dim")
    for key in ("max_position_embeddings", "num_local_experts", "num_experts", "n_routed_experts",
                "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
                "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace",
                "shared_expert_intermediate_size", "ffn_dim", "intermediate_size", "vocab_size", "experts_per_token"):
        # a context of 0 is no context (absent, it is 2048 as in vLLM); the others may be 0 (not used)
        pos = key == "max_position_embeddings"
        _int(cfg, key, path, lo=1 if pos else 0, default=None, hi=10**9 if pos else _MAX_DIM)
    sw = cfg.get("sliding_window")
    if sw is not None and sw is not False:
        _int(cfg, "sliding_window", path, lo=0, hi=10**9)
    is_opt = model_type == "opt" or "ffn_dim" in cfg
    inter = cfg.get("intermediate_size") or cfg.get("ffn_dim")
    if inter is None and (cfg.get("intermediate_size") == 0 or cfg.get("ffn_dim") == 0):
        key = "intermediate_size" if "intermediate_size" in cfg else "ffn_dim"
        raise ConfigError(f"{path}: {key}: got 0; allowed an integer >= 1 (the MLP's width)")
    if inter is None:
        raise ConfigError(f"{path}: missing required key 'intermediate_size' (or 'ffn_dim')")
    gated = not is_opt  # Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek MLPs are gated (SwiGLU/GeGLU); OPT is not
    max_pos = int(cfg.get("max_position_embeddings") or 2048)
    n_experts = int(
        cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    )
    per_tok = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)  # gpt-oss: both
    if n_experts and not 1 <= per_tok <= n_experts:
        raise ConfigError(f"{path}: num_experts_per_tok: expected an integer in [1, {n_experts}] (the routed "
                          f"experts), got {cfg.get('num_experts_per_tok')!r}")
    if not n_experts and per_tok and any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise ConfigError(f"{path}: num_experts_per_tok {per_tok} with 0 routed experts; allowed: experts >= "
                          f"{per_tok}, or no expert keys for a dense model")
    dense_first = int(cfg.get("first_k_dense_replace") or 0) if n_experts else 0  # >= 0: checked with the keys
    # vLLM and transformers pick per layer (index >= first_k_dense_replace is MoE): a value past the layers
    # (a DeepSeek config cut to fewer layers) makes every layer dense
    dense_first = min(dense_first, L)
    kv_lora = int(cfg.get("kv_lora_rank") or 0)
    qk_rope = int(cfg.get("qk_rope_head_dim") or 0)
    if kv_lora:
        hd = int(cfg.get("qk_nope_head_dim") or 0) + qk_rope or hd
    sw = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) is not False else None
    moe_width = int(cfg.get("moe_intermediate_size") or 0) if n_experts else 0
    shared = int(cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0))
    if llama4 and n_experts:  # Llama-4: intermediate_size is each expert's (and the shared expert's) width,
        step = _int(cfg, "interleave_moe_layer_step", path, default=1)  # intermediate_size_mlp the dense one
        if step != 1:
            raise ConfigError(f"{path}: interleave_moe_layer_step {step}: only every-layer MoE (1, Llama-4-Scout) "
                              "is modelled")
        moe_width, shared = int(inter), 1
        inter = _int(cfg, "intermediate_size_mlp", path, default=int(inter))
    tie = cfg.get("tie_word_embeddings", wrapper_tie)
    return ModelSpec(
        name=str(name),
        num_hidden_layers=L,
        hidden_size=H,
        intermediate_size=int(inter),
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        vocab_size=_int(cfg, "vocab_size", path),
        max_position_embeddings=_derived_max_len(cfg, max_pos, path),
        tie_word_embeddings=bool(tie if tie is not None else (is_opt or gemma)),  # Gemma's default ties them
        gated_mlp=gated,
        num_experts=n_experts,
        experts_per_tok=per_tok if n_experts else 0,
        num_shared_experts=shared,
        moe_intermediate_size=moe_width,
        first_k_dense_replace=dense_first,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=qk_rope,
        sliding_window=int(sw) if sw else None,
        qkv_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        linear_bias=is_opt or model_type == "gpt_oss" or bool(cfg.get("enable_bias", False)),  # gpt-oss: every
        # linear layer (attention and experts) has a bias
        layer_norm=is_opt,
        norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
        qk_norm=model_type.startswith(("qwen3", "gemma3")),  # RMSNorm weights on q and k (Llama-4's has none)
        learned_pos_embeddings=max_pos + 2 if is_opt else 0,  # OPT's position table has a 2-row offset
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        quantization=checkpoint_dtype(quant, path),
    )


def _derived_max_len(cfg: dict[str, Any], max_pos: int, path: Any) -> int:
    """The longest context vLLM derives from a config (``_get_and_verify_max_len``): ``rope_scaling`` stretches
    ``max_position_embeddings`` by its ``factor``, from ``original_max_position_embeddings`` for yarn, except
    for the types that carry their own length (su, longrope, llama3). Checked: a scaling that is not a table,
    or whose factor or original length is not a positive number, is refused."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        return max_pos
    if not isinstance(rs, dict):
        raise ConfigError(f"{path}: rope_scaling: expected a table (rope_type, factor, ...), got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))
    if kind in ("su", "longrope", "llama3"):
        return max_pos
    factor = rs.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < 1e6:
        raise ConfigError(f"{path}: rope_scaling.factor: expected a number > 0, got {factor!r}")
    base = max_pos
    if kind == "yarn":
        base = rs.get("original_max_position_embeddings")
        if isinstance(base, bool) or not isinstance(base, int) or base < 1:
            raise ConfigError(f"{path}: rope_scaling.original_max_position_embeddings: expected an integer >= 1 "
                              f"(yarn scales it), got {base!r}")
    return int(base * factor)
