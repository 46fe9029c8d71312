"""Model architecture facts and byte arithmetic: dtypes, ``ModelSpec`` (parameters, weight and KV bytes).

The catalogue of named models and ``get_model`` are in sim/cost/models.py, HF config.json loading in
sim/cost/hf_config.py; all three modules' public names are importable from sim.cost.models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.core.errors import ConfigError

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


# Spellings of one format, as vLLM reads them. Unlike the tables above (by width), formats of one width
# stay apart: fp8_e5m2 is not fp8_e4m3 (vLLM's "fp8"), and the 4-bit methods pick different kernels.
_SAME_FORMAT = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3", "float8": "fp8_e4m3"}  # fmt: skip


def dtype_format(dtype: str) -> str:
    """The format a (weight or KV) dtype spelling names: ``half`` is ``fp16``, ``fp8`` is ``fp8_e4m3``;
    ``auto`` and other names as given (lower case). Two spellings of one format compare equal."""
    key = str(dtype).strip().lower()
    return _SAME_FORMAT.get(key, key)


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
    quantization: str | None = None  # the checkpoint's weight dtype (quantization_config), None: as run

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
