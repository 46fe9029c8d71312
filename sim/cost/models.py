"""Model architectures: catalogue, HF config.json loading, parameter / weight / KV-byte arithmetic.

The catalogue is Python data (no file read at run time). Dims come from the HF config.json of each model
as collected in ``shared/data/reference/models.csv`` (costmodel.md §4); each is cross-checked by an exact
match of the computed parameter count with the published total (tests/test_models.py).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError, UnknownNameError

GiB = 1 << 30

# ---------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------

# vLLM --dtype / --quantization spellings -> canonical weight dtype. "auto" = bf16 (DESIGN.md, config.py).
_DTYPE_ALIASES: dict[str, str] = {
    "auto": "bf16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "fp8_e4m3fn": "fp8",
    "float8": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "smoothquant": "int8",
    "int4": "int4",
    "awq": "int4",
    "gptq": "int4",
    "w4a16": "int4",
    "awq_marlin": "int4",
    "gptq_marlin": "int4",
}
# Bytes per weight of the quantized linear layers; the seeds: FP16/BF16 2, INT8 1, FP8 1, 4-bit 0.5.
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}

# KV-cache dtypes vLLM accepts (--kv-cache-dtype); "auto" = the model's activation dtype.
_KV_DTYPE_ALIASES: dict[str, str] = {
    "auto": "auto",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "fp8_inc": "fp8",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
}

# Group-wise 4-bit (GPTQ/AWQ style): one fp16 scale + one fp16 zero per group of 128 weights.
QUANT_GROUP_SIZE = 128
QUANT_GROUP_OVERHEAD_BYTES = 4


def normalize_dtype(dtype: str) -> str:
    """Canonical weight dtype ("bf16", "fp16", "fp32", "fp8", "int8", "int4") for a vLLM spelling."""
    key = str(dtype).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_ALIASES)}")
    return _DTYPE_ALIASES[key]


def activation_dtype_bytes(dtype: str) -> int:
    """Bytes of an activation element: quantized weights (fp8/int8/int4) still compute in 16-bit."""
    return 4 if normalize_dtype(dtype) == "fp32" else 2


def kv_dtype_bytes(kv_cache_dtype: str = "auto", dtype: str = "bf16") -> int:
    """Bytes per KV element: fp8 variants 1, "auto" = the activation dtype of ``dtype``."""
    key = str(kv_cache_dtype).strip().lower()
    if key not in _KV_DTYPE_ALIASES:
        raise ConfigError(
            f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of {sorted(_KV_DTYPE_ALIASES)}"
        )
    canon = _KV_DTYPE_ALIASES[key]
    if canon == "auto":
        return activation_dtype_bytes(dtype)
    return {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}[canon]


# ---------------------------------------------------------------------------------------------------
# ModelSpec
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts the memory planner and cost model need (names follow HF config.json)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int  # per expert for MoE
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU/GeGLU: 3 matrices; OPT-style: 2
    num_experts: int = 0  # routed experts; 0 = dense
    experts_per_tok: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0  # per-expert width when it differs from intermediate_size
    first_k_dense_replace: int = 0  # leading dense layers in an MoE model (DeepSeek)
    kv_lora_rank: int = 0  # MLA; 0 = standard attention
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    num_params_override: int | None = None  # exact published count when the formula cannot know it
    # --- added fields (defaults keep the original constructor valid); they only refine num_params ---
    qkv_bias: bool = False  # Qwen2: biases on q/k/v projections
    linear_bias: bool = False  # OPT: every linear layer has a bias
    layer_norm: bool = False  # LayerNorm (weight + bias) instead of RMSNorm (weight only)
    norms_per_layer: int = 2  # Gemma-2 has 4 (pre/post attention and feed-forward)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    learned_pos_embeddings: int = 0  # rows of a learned position table (OPT: max_pos + 2)
    qk_nope_head_dim: int = 0  # MLA
    v_head_dim: int = 0  # MLA
    q_lora_rank: int = 0  # MLA; 0 = plain q projection
    shared_expert_intermediate_size: int = 0  # 0 = num_shared_experts × expert width

    # ---- dims the cost model needs ----------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def q_size(self) -> int:
        """Width of the query projection output (nh × hd)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the K (or V) projection output (nkv × hd)."""
        return self.num_key_value_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace if self.is_moe else 0

    # ---- parameter counts ---------------------------------------------------------------------------
    def _attn_params(self) -> int:
        h, nh = self.hidden_size, self.num_attention_heads
        if self.is_mla:  # DeepSeek-V2 modeling code: q(_a/_b)_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk_head
            else:
                q = h * nh * qk_head
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # + kv_a_layernorm
            kv_b = self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + nh * self.v_head_dim * h
        q, kv = self.q_size, self.kv_size
        n = h * (q + 2 * kv) + q * h
        if self.qkv_bias or self.linear_bias:
            n += q + 2 * kv
        if self.linear_bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def _mlp_params(self, width: int) -> int:
        n = self.mlp_matrices * self.hidden_size * width
        if self.linear_bias:
            n += (self.mlp_matrices - 1) * width + self.hidden_size
        return n

    @property
    def shared_expert_width(self) -> int:
        """Width of the always-on shared expert MLP (0 = none)."""
        return self.shared_expert_intermediate_size or self.num_shared_experts * self.expert_intermediate_size

    def _layer_params(self, active: bool) -> tuple[int, int]:
        """(dense-layer params, MoE-layer params) excluding norms; active=True counts top-k experts."""
        dense = self._attn_params() + self._mlp_params(self.intermediate_size)
        if not self.is_moe:
            return dense, 0
        experts = self.experts_per_tok if active else self.num_experts
        moe = self._attn_params() + self.hidden_size * self.num_experts  # router
        moe += experts * self._mlp_params(self.expert_intermediate_size)
        if self.shared_expert_width:
            moe += self._mlp_params(self.shared_expert_width)
        return dense, moe

    @property
    def norm_params(self) -> int:
        per_norm = self.hidden_size * (2 if self.layer_norm else 1)
        return per_norm * (self.norms_per_layer * self.num_hidden_layers + 1)

    @property
    def embedding_params(self) -> int:
        """Token embedding + LM head (unless tied) + learned positions: kept 16-bit when quantized."""
        n = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return n + self.learned_pos_embeddings * self.hidden_size

    def _count(self, active: bool) -> int:
        dense, moe = self._layer_params(active)
        n_dense = self.num_hidden_layers - self.num_moe_layers
        return n_dense * dense + self.num_moe_layers * moe + self.norm_params + self.embedding_params

    @property
    def num_params(self) -> int:
        """Total parameters from the config (embeddings, norms, biases included); override wins."""
        if self.num_params_override is not None:
            return self.num_params_override
        return self._count(active=False)

    @property
    def num_active_params(self) -> int:
        """Parameters touched per token: MoE counts only the top-k routed experts plus shared ones."""
        if not self.is_moe:
            return self.num_params
        return self._count(active=True)

    # ---- bytes --------------------------------------------------------------------------------------
    def weight_bytes(self, dtype: str = "bf16", *, simple: bool = False) -> int:
        """Bytes of the weights in ``dtype``.

        simple=True is the seeds' arithmetic: num_params × bytes/param (INT4: 7e9 × 0.5 = 3.5e9 B = 3.26 GiB).
        simple=False (default) is closer to a real checkpoint: 8-/4-bit formats quantize only the linear
        layers; embeddings, LM head and norms stay 16-bit, and 4-bit adds an fp16 scale + fp16 zero per
        group of 128 weights (GPTQ/AWQ, group_size 128). Scales of fp8/int8 (per tensor/channel) are ignored.
        """
        canon = normalize_dtype(dtype)
        bpp = DTYPE_BYTES[canon]
        total = self.num_params
        if simple or canon in ("bf16", "fp16", "fp32"):
            return math.ceil(total * bpp)
        kept = self.embedding_params + self.norm_params  # stays 16-bit
        linear = max(total - kept, 0)
        n = linear * bpp + kept * 2
        if canon == "int4":
            n += math.ceil(linear / QUANT_GROUP_SIZE) * QUANT_GROUP_OVERHEAD_BYTES
        return math.ceil(n)

    def kv_heads_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """KV heads each TP rank stores: split across GPUs, replicated when tp > nkv (vLLM: min 1)."""
        if tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        return max(1, self.num_key_value_heads // tensor_parallel_size)

    def kv_elements_per_token_layer(self, tensor_parallel_size: int = 1) -> int:
        """K+V elements per token per layer on one GPU (MLA: the latent, replicated on every rank)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads_per_gpu(tensor_parallel_size) * self.head_dim

    def kv_bytes_per_token(
        self, kv_cache_dtype: str = "auto", dtype: str = "bf16", tensor_parallel_size: int = 1
    ) -> int:
        """2 × L × nkv × head_dim × bytes (MLA: L × (kv_lora_rank + rope dim) × bytes); DESIGN.md facts."""
        b = kv_dtype_bytes(kv_cache_dtype, dtype)
        return self.num_hidden_layers * self.kv_elements_per_token_layer(tensor_parallel_size) * b

    def kv_bytes_per_block_layer(
        self,
        block_size: int = 16,
        kv_cache_dtype: str = "auto",
        dtype: str = "bf16",
        tensor_parallel_size: int = 1,
    ) -> int:
        """vLLM's page_size_bytes for one layer: 2 × block × nkv × head_size × bytes (engines.md §1.4)."""
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        b = kv_dtype_bytes(kv_cache_dtype, dtype)
        return block_size * self.kv_elements_per_token_layer(tensor_parallel_size) * b


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

_BY_NAME: dict[str, ModelSpec] = {m.name: m for m in _CATALOGUE}

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


_LOOKUP: dict[str, str] = {_norm(n): n for n in _BY_NAME} | _ALIASES


def list_models() -> list[str]:
    return [m.name for m in _CATALOGUE]


def get_model(name_or_path: str) -> ModelSpec:
    """A catalogue model by (alias-tolerant) name, or a ModelSpec read from a HF config.json path."""
    if isinstance(name_or_path, ModelSpec):  # convenience for callers holding a spec already
        return name_or_path
    text = str(name_or_path)
    path = Path(text).expanduser()
    if text.endswith(".json") or path.is_dir() or path.is_file():
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return load_hf_config(path)
        if text.endswith(".json"):
            raise ConfigError(f"model config file not found: {text}")
    key = _norm(text)
    if key in _LOOKUP:
        return _BY_NAME[_LOOKUP[key]]
    close = difflib.get_close_matches(key, list(_LOOKUP), n=4, cutoff=0.5)
    names = sorted({_LOOKUP[c] for c in close})
    hint = f"; did you mean {', '.join(names)}?" if names else ""
    raise UnknownNameError(f"unknown model {text!r}{hint} Known: {', '.join(list_models())}")


def _req(cfg: dict[str, Any], key: str, where: Path) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{where}: missing required key {key!r}")
    return cfg[key]


def load_hf_config(path: str | Path) -> ModelSpec:
    """Build a ModelSpec from a HF config.json (Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek/OPT keys)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # multimodal wrappers keep the language model here
    model_type = str(cfg.get("model_type", "")).lower()
    L = int(_req(cfg, "num_hidden_layers", path))
    H = int(_req(cfg, "hidden_size", path))
    nh = int(_req(cfg, "num_attention_heads", path))
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or H // nh)
    is_opt = model_type == "opt" or "ffn_dim" in cfg
    inter = cfg.get("intermediate_size") or cfg.get("ffn_dim")
    if inter is None:
        raise ConfigError(f"{path}: missing required key 'intermediate_size' (or 'ffn_dim')")
    gated = not is_opt  # Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek MLPs are gated (SwiGLU/GeGLU); OPT is not
    max_pos = int(cfg.get("max_position_embeddings") or 2048)
    n_experts = int(
        cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    )
    kv_lora = int(cfg.get("kv_lora_rank") or 0)
    qk_rope = int(cfg.get("qk_rope_head_dim") or 0)
    if kv_lora:
        hd = int(cfg.get("qk_nope_head_dim") or 0) + qk_rope or hd
    sw = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) is not False else None
    name = cfg.get("_name_or_path") or path.parent.name or str(path)
    return ModelSpec(
        name=str(name),
        num_hidden_layers=L,
        hidden_size=H,
        intermediate_size=int(inter),
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=hd,
        vocab_size=int(_req(cfg, "vocab_size", path)),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", is_opt)),
        gated_mlp=gated,
        num_experts=n_experts,
        experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if n_experts else 0,
        num_shared_experts=int(
            cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0)
        ),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if n_experts else 0,
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0) if n_experts else 0,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=qk_rope,
        sliding_window=int(sw) if sw else None,
        qkv_bias=bool(cfg.get("attention_bias", model_type.startswith("qwen2"))),
        linear_bias=is_opt or bool(cfg.get("enable_bias", False)),
        layer_norm=is_opt,
        norms_per_layer=4 if model_type in ("gemma2", "gemma3") else 2,
        qk_norm=model_type.startswith("qwen3"),
        learned_pos_embeddings=max_pos + 2 if is_opt else 0,  # OPT's position table has a 2-row offset
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
    )
