"""vLLM-style GPU memory planner: weights + activation peak + non-torch vs utilization × capacity -> KV blocks.

vLLM V1 semantics (engines.md §1.4; V0 is the same arithmetic, §1.5 V0-1):
    requested  = total_gpu_memory × gpu_memory_utilization        (a fraction of TOTAL, not of free memory)
    available  = requested − weights − activation peak − non-torch
    page bytes = block_size × (2 × kv_heads × head_dim) × kv bytes × layers   (per GPU under TP)
    num_gpu_blocks = floor(available / page bytes)               (num_gpu_blocks_override wins)
    max_concurrency (logged) = num_gpu_blocks / ceil(max_model_len / block_size)

Engines that size the KV from the memory left free once loaded (TensorRT-LLM, TGI, llama.cpp, Ollama, HF;
``free_fraction``) use ``available = free_fraction × (requested − CUDA context − weights − activation −
non-torch)`` instead; each preset's rule and overheads: policies/options.py MemoryRule,
sim/app/engine_memory.py, docs/memory_reservations.md.

The seeds' worked example (DESIGN.md "Facts") is ``SEEDS_EXAMPLE`` / ``seeds_example_plan()``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError, MemoryPlanError
from sim.cost.hardware import GpuSpec, get_gpu, validate_tp
from sim.cost.models import ModelSpec, activation_dtype_bytes, get_model, kv_dtype_bytes, normalize_dtype
from sim.cost.quantconfig import weight_dtype

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

# ---- default activation-peak / non-torch estimate ----------------------------------------------------
# vLLM measures these in profile_run(): a dummy forward over max_num_batched_tokens tokens, then a dummy
# sampler run over min(max_num_seqs, tokens) rows of logits. The forward intermediates are freed before the
# sampler runs, so the torch peak is the larger of the two:
#   forward  = max_num_batched_tokens × (4·H + (q + 2·kv)/tp + 3·I_active/tp) × activation bytes
#              (residual, normed input, attention output, QKV and gate/up/act buffers of one layer)
#   sampler  = min(max_num_seqs, max_num_batched_tokens) × vocab × SAMPLER_BYTES_PER_LOGIT
#              (fp32 logits plus the sampler's temporaries: sort values + int64 indices, probs, masks, ...)
# SAMPLER_BYTES_PER_LOGIT is fitted to the one real run we have (shared/data/e2e/rtx4090-llama-3.1-8b-
# vllm-0.19: RTX 4090, Llama-3.1-8B bf16, util 0.9, 2048 tokens, 256 seqs -> 2588 blocks). That run implies
# activation + non-torch = 1.1507-1.1526 GiB (21.16 GiB requested - 14.96 GiB weights - 2588 x 2 MiB).
# With 34 B/logit and the 0.13 GiB non-torch below the planner gives 2579 blocks: it MISSES BY 9 BLOCKS
# (0.35 %, too few); tests/test_memory.py asserts a miss below 1 %. The run's own non-torch overhead (and any
# CUDA-graph memory vLLM 0.19 may reserve) is unknown, so this one run does not identify the split.
# Cross-check: a public vLLM 0.11 H100 profiling table (code index id 27349653019; 8192 tokens, 1024 seqs)
# lists 4.76 GiB activation for Llama-3.1-8B and 5.56-5.64 GiB for Qwen3 (vocab 151936), i.e. ~39 B/logit;
# 34 B/logit under-estimates those by ~13 % (about 0.6 GiB of 79 GiB).
SAMPLER_BYTES_PER_LOGIT = 34
# Non-torch increase (NCCL buffers, cuBLAS workspaces, CUDA context growth) from the same public table:
# ~0.13 GiB at TP=1 and ~0.55 GiB at TP=2 (custom all-reduce / NCCL buffers).
NON_TORCH_BYTES_TP1 = int(0.13 * GiB)
NON_TORCH_BYTES_TP = int(0.55 * GiB)

DEFAULT_CONTEXT_LENGTHS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)


MAX_GPU_BLOCKS = 1 << 24  # KV blocks one engine may have: 268 M tokens at block_size 16, far past any card


def forward_activation_bytes(
    model: ModelSpec, tokens: int, *, tensor_parallel_size: int = 1, dtype: str = "bf16"
) -> int:
    """One layer's live intermediates for a forward over ``tokens`` tokens (the forward term above)."""
    tp = tensor_parallel_size
    if model.is_moe:
        inter = model.experts_per_tok * model.expert_intermediate_size + model.shared_expert_width
        if model.first_k_dense_replace:
            inter = max(inter, model.intermediate_size)
    else:
        inter = model.intermediate_size
    per_token = 4 * model.hidden_size + (model.q_size + 2 * model.kv_size) / tp + 3 * inter / tp
    return int(math.ceil(tokens * per_token * activation_dtype_bytes(dtype)))


def estimate_activation_bytes(
    model: ModelSpec,
    *,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    tensor_parallel_size: int = 1,
    dtype: str = "bf16",
) -> int:
    """Torch peak of vLLM's profile run: max(forward over the token budget, sampler over the seq budget)."""
    forward = forward_activation_bytes(
        model, max_num_batched_tokens, tensor_parallel_size=tensor_parallel_size, dtype=dtype
    )
    sampler = min(max_num_seqs, max_num_batched_tokens) * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return max(forward, int(sampler))


def estimate_non_torch_bytes(tensor_parallel_size: int = 1) -> int:
    return NON_TORCH_BYTES_TP1 if tensor_parallel_size == 1 else NON_TORCH_BYTES_TP


# ---- plan --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextRow:
    """Concurrency at one context length: by bytes (the seeds' division) and by whole blocks (vLLM)."""

    context_len: int
    kv_bytes_per_request: int
    concurrency: int  # floor(kv_budget / (ctx × kv bytes/token))
    blocks_per_request: int
    concurrency_blocks: int  # floor(num_gpu_blocks / ceil(ctx / block_size))


@dataclass(frozen=True)
class MemoryPlan:
    """Everything the planner derived, per GPU; ``format()`` shows the arithmetic like the seeds."""

    model: str
    gpu: str
    dtype: str  # canonical weight dtype
    kv_cache_dtype: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    block_size: int
    total_memory_bytes: int
    requested_memory_bytes: int
    num_params: int
    weight_bytes: int  # per GPU
    activation_bytes: int
    non_torch_bytes: int
    overhead_estimated: bool  # True: activation / non-torch came from the estimate, not the caller
    kv_budget_bytes: int
    kv_heads_per_gpu: int
    kv_dtype_bytes: int
    kv_bytes_per_token: int  # per GPU, all layers
    block_bytes: int  # per GPU, all layers
    num_gpu_blocks: int
    kv_tokens_capacity: int
    max_model_len: int
    max_concurrency: float  # vLLM's log line: blocks / ceil(max_model_len / block_size)
    contexts: tuple[ContextRow, ...]
    num_layers: int
    kv_elements_per_token_layer: int
    notes: tuple[str, ...] = ()
    is_mla: bool = False
    context_bytes: int = 0  # CUDA context, counted by engines that size the KV from free memory
    free_fraction: float | None = None  # None: vLLM's util x total rule; else the share of free memory
    overhead_source: str = "estimate"  # what the activation / non-torch figures stand for

    @property
    def non_kv_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes + self.non_torch_bytes + self.context_bytes

    def concurrency_at(self, context_len: int) -> int:
        """Seeds-style concurrency for any context length (bytes, not blocks)."""
        return self.kv_budget_bytes // (context_len * self.kv_bytes_per_token)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["contexts"] = [dataclasses.asdict(r) for r in self.contexts]
        d["notes"] = list(self.notes)
        d["non_kv_bytes"] = self.non_kv_bytes
        return d

    def format(self) -> str:
        g = _g
        tp = f", TP={self.tensor_parallel_size} (per GPU)" if self.tensor_parallel_size > 1 else ""
        kvd = {1: "fp8", 2: "16-bit", 4: "fp32"}[self.kv_dtype_bytes]
        src = self.overhead_source if self.overhead_estimated else "given"
        lines = [
            f"Memory plan: {self.model} on {self.gpu}{tp}; weights {self.dtype}, KV cache {kvd}, "
            f"block_size {self.block_size}",
            f"  GPU memory                 {g(self.total_memory_bytes):>9} GiB",
            f"  x utilization {self.gpu_memory_utilization:<4.2f}      = {g(self.requested_memory_bytes):>9} GiB"
            " requested",
            f"  - weights                  {g(self.weight_bytes):>9} GiB  ({self.num_params:,} params, "
            f"{self.weight_bytes:,} B{' per GPU' if self.tensor_parallel_size > 1 else ''})",
            f"  - activation peak          {g(self.activation_bytes):>9} GiB  ({src})",
            f"  - non-torch                {g(self.non_torch_bytes):>9} GiB  "
            f"({'estimate' if self.overhead_estimated else 'given'})",
        ]
        if self.context_bytes:
            lines.append(f"  - CUDA context             {g(self.context_bytes):>9} GiB")
        if self.free_fraction is not None:
            free = self.requested_memory_bytes - self.non_kv_bytes
            lines.append(f"  = free after loading       {g(free):>9} GiB  x {self.free_fraction:.2f} (the engine's "
                         "share of free memory)")
        lines.append(f"  = KV cache budget          {g(self.kv_budget_bytes):>9} GiB")
        if self.is_mla:
            lines.append(
                f"KV per token: {self.num_layers} layers x {self.kv_elements_per_token_layer} latent elems "
                f"x {self.kv_dtype_bytes} B = {self.kv_bytes_per_token:,} B "
                f"({self.kv_bytes_per_token / KiB:.2f} KiB)"
            )
        else:
            lines.append(
                f"KV per token: 2 x {self.num_layers} layers x {self.kv_heads_per_gpu} KV heads x "
                f"{self.kv_elements_per_token_layer // (2 * self.kv_heads_per_gpu)} head_dim x "
                f"{self.kv_dtype_bytes} B = {self.kv_bytes_per_token:,} B "
                f"({self.kv_bytes_per_token / KiB:.2f} KiB)"
            )
        lines.append(
            f"Block: {self.block_size} tokens x {self.kv_bytes_per_token:,} B = {self.block_bytes:,} B "
            f"({self.block_bytes / MiB:.2f} MiB); num_gpu_blocks = {self.num_gpu_blocks:,} "
            f"-> {self.kv_tokens_capacity:,} tokens"
        )
        per_req = math.ceil(self.max_model_len / self.block_size) * self.block_bytes
        lines.append(
            f"max_model_len {self.max_model_len:,}: {g(per_req)} GiB per request; "
            f"maximum concurrency {self.max_concurrency:.2f}x"
        )
        shown = [r for r in self.contexts if r.context_len <= self.max_model_len]  # a longer one cannot run
        if shown:
            lines.append("Concurrency by context length (KV budget / per-request KV):")
            lines.append("  context   per request        concurrent   (whole blocks)")
            for r in shown:
                lines.append(
                    f"  {r.context_len:>7,}   {r.kv_bytes_per_request / MiB:>9.2f} MiB   "
                    f"{g(self.kv_budget_bytes)} / {g(r.kv_bytes_per_request)} = {r.concurrency:<4d}"
                    f" ({r.concurrency_blocks})"
                )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _g(n: float) -> str:
    return f"{n / GiB:.2f}"


def plan_memory(
    model: ModelSpec | str,
    gpu: GpuSpec | str,
    *,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    tensor_parallel_size: int = 1,
    num_gpu_blocks_override: int | None = None,
    activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    usable_memory_bytes: int | None = None,
    context_lengths: tuple[int, ...] | list[int] = DEFAULT_CONTEXT_LENGTHS,
    simple_weights: bool = False,
    fit_max_model_len: bool = False,
    free_fraction: float | None = None,
    context_bytes: int = 0,
    offload_bytes: int = 0,
    overhead_source: str | None = None,
) -> MemoryPlan:
    """Plan GPU memory the way vLLM does at start-up (engines.md §1.4).

    activation_bytes / non_torch_bytes: measured or assumed values; None = the estimate above.
    usable_memory_bytes: overrides the GPU's reported capacity (the seeds' "22.5 GiB usable").
    simple_weights: weights = params × bytes/param (the seeds' arithmetic; see ModelSpec.weight_bytes).
    fit_max_model_len: with max_model_len None, cap the model's max_position_embeddings to what fits
    instead of raising (vLLM itself raises).
    free_fraction: None is vLLM's rule above; a number sizes the KV from free memory instead (TensorRT-LLM,
    TGI, llama.cpp; policies/options.py MemoryRule): free_fraction x (requested - context_bytes - non-KV).
    offload_bytes: weights that stay in host memory (llama.cpp's input embedding).
    Raises MemoryPlanError when the model or one max_model_len request does not fit, ConfigError on bad input.
    """
    spec = get_model(model) if isinstance(model, str) else model
    card = get_gpu(gpu) if isinstance(gpu, str) else gpu
    dtype = weight_dtype(dtype, spec.quantization)  # a quantized checkpoint decides its weights
    if isinstance(gpu_memory_utilization, bool) or not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    for key, val in (
        ("block_size", block_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
    ):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ConfigError(f"{key} must be a positive integer, got {val!r}")
    for key, val in (
        ("activation_bytes", activation_bytes),
        ("non_torch_bytes", non_torch_bytes),
        ("num_gpu_blocks_override", num_gpu_blocks_override),
        ("context_bytes", context_bytes),
        ("offload_bytes", offload_bytes),
    ):
        if val is not None and val < 0:
            raise ConfigError(f"{key} must be >= 0, got {val!r}")
    if num_gpu_blocks_override is not None and num_gpu_blocks_override > MAX_GPU_BLOCKS:
        raise ConfigError(f"num_gpu_blocks_override: got {num_gpu_blocks_override}; allowed at most {MAX_GPU_BLOCKS:,} "
                          "(each block is simulated; a 141 GB card holds ~3.5 M blocks of a 125M-parameter model)")
    if free_fraction is not None and not 0 < free_fraction <= 1:
        raise ConfigError(f"free_fraction must be in (0, 1], got {free_fraction!r}")
    if usable_memory_bytes is not None and usable_memory_bytes <= 0:
        raise ConfigError(f"usable_memory_bytes must be > 0, got {usable_memory_bytes!r}")
    tp = tensor_parallel_size
    validate_tp(card, tp, spec)
    wdtype = normalize_dtype(dtype)
    kvb = kv_dtype_bytes(kv_cache_dtype, wdtype)
    if max_model_len is not None:
        if max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {max_model_len}")
        if max_model_len > spec.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {max_model_len} exceeds {spec.name}'s max_position_embeddings "
                f"{spec.max_position_embeddings}; allowed: 2 to {spec.max_position_embeddings} (vLLM refuses a "
                "longer one too)"
            )
    ctxs = tuple(int(c) for c in context_lengths)
    if any(c < 1 for c in ctxs):
        raise ConfigError(f"context lengths must be >= 1, got {list(ctxs)}")

    total = int(usable_memory_bytes if usable_memory_bytes is not None else card.memory_bytes)
    requested = int(math.floor(total * gpu_memory_utilization))
    weights = math.ceil(max(0, spec.weight_bytes(wdtype, simple=simple_weights) - offload_bytes) / tp)
    # overhead_source: the caller passes an engine's estimate (sim/app/engine_memory.py), not a measurement
    estimated = activation_bytes is None or non_torch_bytes is None or overhead_source is not None
    act = (
        int(activation_bytes)
        if activation_bytes is not None
        else estimate_activation_bytes(
            spec,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tp,
            dtype=wdtype,
        )
    )
    non_torch = int(non_torch_bytes) if non_torch_bytes is not None else estimate_non_torch_bytes(tp)
    non_kv = weights + act + non_torch + context_bytes
    available = requested - non_kv
    if free_fraction is not None and available > 0:
        available = int(math.floor(available * free_fraction))
    if available <= 0:
        raise MemoryPlanError(
            f"model does not fit: needs {_g(non_kv)} GiB, budget {_g(requested)} GiB "
            f"(short by {_g(non_kv - requested)} GiB): weights {_g(weights)} + activation {_g(act)} + "
            f"non-torch {_g(non_torch)}{f' + CUDA context {_g(context_bytes)}' if context_bytes else ''} GiB "
            f"vs {_g(total)} GiB x gpu_memory_utilization {gpu_memory_utilization} "
            f"for {spec.name} on {card.name}{f' at TP={tp}' if tp > 1 else ''}"
        )

    elems = spec.kv_elements_per_token_layer(tp)
    per_token = spec.num_hidden_layers * elems * kvb
    block_bytes = block_size * per_token
    if num_gpu_blocks_override is not None and num_gpu_blocks_override * block_bytes > requested - weights:
        # vLLM allocates the override as given (0.33 kv_cache_planning): past the card it runs out of memory at
        # start-up. Only the weights are counted against it, so a real run's override (a replay) always passes.
        most = max(int((requested - weights) // block_bytes), 0)
        raise ConfigError(
            f"[engine] num_gpu_blocks_override = {num_gpu_blocks_override} needs "
            f"{_g(num_gpu_blocks_override * block_bytes)} GiB of KV cache, more than the {_g(requested - weights)} GiB "
            f"{card.name} x gpu_memory_utilization {gpu_memory_utilization} leaves beside the weights (vLLM would "
            f"run out of memory at start-up); allowed: up to {most} blocks")
    blocks = available // block_bytes if num_gpu_blocks_override is None else int(num_gpu_blocks_override)
    largest = min(blocks * block_size, spec.max_position_embeddings)
    if max_model_len is None:
        mml = largest if fit_max_model_len else spec.max_position_embeddings
    else:
        mml = max_model_len
    need_blocks = math.ceil(mml / block_size)
    if blocks < need_blocks or mml < 1:
        if blocks == 0:
            raise MemoryPlanError(
                f"no room for a single KV block: {_g(available)} GiB left after weights and overheads, "
                f"one block needs {block_bytes / MiB:.2f} MiB ({spec.name} on {card.name})"
            )
        unset = "" if max_model_len is not None else " (the model's, as it was left unset)"
        raise MemoryPlanError(
            f"[engine] max_model_len {mml}{unset} needs {need_blocks} KV blocks ({_g(need_blocks * block_bytes)} GiB) "
            f"for one request, more than the pool's {blocks} ({_g(blocks * block_bytes)} GiB); allowed: a max_model_len up "
            f"to {blocks * block_size} (-1 picks it), or "
            + (f"a num_gpu_blocks_override of at least {need_blocks}." if num_gpu_blocks_override is not None
               else "a higher gpu_memory_utilization.")
        )

    if context_lengths is not DEFAULT_CONTEXT_LENGTHS and any(c > mml for c in ctxs):  # asked for: refused
        raise ConfigError(f"context length {max(ctxs)} exceeds max_model_len {mml}: no request can be that "
                          f"long; allowed: 1 to {mml}")
    kv_budget = int(available)
    rows = tuple(
        ContextRow(
            context_len=c,
            kv_bytes_per_request=c * per_token,
            concurrency=kv_budget // (c * per_token),
            blocks_per_request=math.ceil(c / block_size),
            concurrency_blocks=blocks // math.ceil(c / block_size),
        )
        for c in ctxs
    )
    notes: list[str] = []
    if spec.sliding_window:
        notes.append(
            f"{spec.name} has sliding_window {spec.sliding_window}; the plan assumes full attention "
            "(an engine that caps sliding-window KV needs less per long request)"
        )
    if num_gpu_blocks_override is not None:
        notes.append(
            f"num_gpu_blocks_override = {num_gpu_blocks_override} replaces the computed "
            f"{available // block_bytes}"
        )
    return MemoryPlan(
        model=spec.name,
        gpu=card.name,
        dtype=wdtype,
        kv_cache_dtype=str(kv_cache_dtype),
        tensor_parallel_size=tp,
        gpu_memory_utilization=float(gpu_memory_utilization),
        block_size=block_size,
        total_memory_bytes=total,
        requested_memory_bytes=requested,
        num_params=spec.num_params,
        weight_bytes=weights,
        activation_bytes=act,
        non_torch_bytes=non_torch,
        overhead_estimated=estimated,
        kv_budget_bytes=kv_budget,
        kv_heads_per_gpu=0 if spec.is_mla else spec.kv_heads_per_gpu(tp),
        kv_dtype_bytes=kvb,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        num_gpu_blocks=int(blocks),
        kv_tokens_capacity=int(blocks) * block_size,
        max_model_len=mml,
        max_concurrency=blocks / need_blocks,
        contexts=rows,
        num_layers=spec.num_hidden_layers,
        kv_elements_per_token_layer=elems,
        notes=tuple(notes),
        is_mla=spec.is_mla,
        context_bytes=int(context_bytes),
        free_fraction=free_fraction,
        overhead_source=overhead_source or ("estimate" if estimated else "given"),
    )


# ---- the seeds' worked example --------------------------------------------------------------------------

# Seed article (shared/seeds/000_*.txt, "第二笔" and "把算式套回这张 24G 的卡"): a 7B model (32 layers, 8 KV heads,
# head_dim 128, FP16) on a 24 GB card with 22.5 GiB usable, utilization 0.90, weights 14e9 B = 13.04 GiB,
# ~1.5 GiB of other overhead -> ~5.7 GiB of KV = 11 requests of 4K.
SEEDS_EXAMPLE: dict[str, Any] = {
    "model": "seed-7b",
    "gpu": "24GB",
    "dtype": "fp16",
    "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.90,
    "usable_memory_bytes": int(22.5 * GiB),
    "activation_bytes": int(1.5 * GiB),  # the seeds' "零碎开销约 1.5 GiB", all of it
    "non_torch_bytes": 0,
    "max_model_len": 4096,
    "context_lengths": (2048, 4096),
    "simple_weights": True,
}


def seeds_example_plan(**overrides: Any) -> MemoryPlan:
    """The seeds' worked example; keyword overrides replace SEEDS_EXAMPLE entries (e.g. kv_cache_dtype="fp8")."""
    kwargs = {**SEEDS_EXAMPLE, **overrides}
    return plan_memory(kwargs.pop("model"), kwargs.pop("gpu"), **kwargs)


def seeds_example_variants() -> dict[str, MemoryPlan]:
    """The seeds' what-ifs: GQA vs MHA, FP8 KV, INT4 weights (each at 2K and 4K contexts)."""
    seed = get_model("seed-7b")
    return {
        "GQA (8 KV heads), FP16 KV": seeds_example_plan(),
        "MHA (32 KV heads)": seeds_example_plan(
            model=dataclasses.replace(seed, name="seed-7b-mha", num_key_value_heads=32)
        ),
        "FP8 KV cache": seeds_example_plan(kv_cache_dtype="fp8"),
        "INT4 weights (0.5 B/param)": seeds_example_plan(dtype="int4"),
    }


def format_seeds_variants() -> str:
    lines = [
        "The seeds' what-ifs (concurrent requests = KV budget / per-request KV):",
        f"  {'variant':<28} {'weights':>9} {'KV budget':>10} {'KV/token':>10} {'2K':>4} {'4K':>4}",
    ]
    for label, p in seeds_example_variants().items():
        c = {r.context_len: r.concurrency for r in p.contexts}
        lines.append(
            f"  {label:<28} {_g(p.weight_bytes):>5} GiB {_g(p.kv_budget_bytes):>6} GiB "
            f"{p.kv_bytes_per_token // KiB:>6} KiB {c[2048]:>4} {c[4096]:>4}"
        )
    return "\n".join(lines)
