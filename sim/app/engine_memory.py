"""What each engine reserves besides weights and KV at start-up, by the pass it measures (MemoryRule.profile).

sim/app/memory.py holds vLLM's estimate (profile_run: forward over the token budget, sampler over the
sequence budget). The other engines measure something else; the facts and their sources are in
docs/memory_reservations.md, summarised per function here:

- vLLM V0 (vllm/worker/worker.py determine_num_available_blocks, 0.6.x): the same profile run, but its
  ``non_torch_allocations`` is all non-torch memory in use after it (CUDA context included), not V1's
  increase over a baseline.
- Sarathi-Serve (sarathi/model_executor/model_runner.py profile_num_available_blocks): one forward of a
  ``chunk_size`` chunk, no sampler; ``peak = torch.cuda.max_memory_allocated()`` (no non-torch term).
- TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator): dummy context requests of
  min(max_num_tokens, max_seq_len) tokens fill max_num_tokens, max_tokens=1 (one logits row each);
  ``_cal_max_memory``: KV = (total - peak) x free_gpu_memory_fraction, peak = torch peak + non-torch
  (CUDA context, NCCL, CUDA graphs).
- TGI (server/text_generation_server/models/flash_causal_lm.py warmup; backends/v3 grpc_client.rs warmup):
  one prefill of max_batch_prefill_tokens with ``prefill_logprobs: true``, so the LM head returns logits
  for every prefill token; then KV = TGI_WIGGLE_ROOM x free memory (get_cuda_free_memory).
- llama.cpp / Ollama: KV is n_ctx tokens, allocated up front; the ggml compute buffer is sized for one
  ubatch at that context; the token-embedding table stays in host memory (src/llama-model.cpp
  load_tensors, dev_input). Ollama's own estimate of that buffer (fs/ggml/ggml.go GraphSize, llama
  family) is the formula below; it also keeps 457 MiB per CUDA GPU (discover/gpu.go cudaMinimumMemory).
- HF transformers generate: no reservation; DynamicCache grows until the GPU is full, so the budget is the
  device less the CUDA context, weights and one prefill's intermediates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.options import MemoryRule
from sim.app.memory import (
    MiB,
    estimate_activation_bytes,
    estimate_non_torch_bytes,
    forward_activation_bytes,
)
from sim.core.errors import ConfigError
from sim.cost.models import ModelSpec, activation_dtype_bytes

# The CUDA context and runtime (cuBLAS handles, kernels) an engine finds used before it loads anything;
# it counts against engines that size the KV from free memory. Ollama keeps exactly this much per CUDA
# GPU free for it (discover/gpu.go: cudaMinimumMemory = 457 MiB); PyTorch users report 0.3-0.8 GiB
# depending on CUDA version and lazy loading (discuss.pytorch.org/t/73021, /t/81330).
CUDA_CONTEXT_BYTES = 457 * MiB
UBATCH = 512  # llama.cpp n_ubatch default (common/common.h), the physical batch the graph is sized for

PROFILES = ("vllm", "vllm-v0", "sarathi", "trtllm", "tgi", "hf", "llamacpp", "ollama")


@dataclass(frozen=True)
class Overheads:
    """Bytes per GPU the plan subtracts besides weights (``offload_bytes``: weights that stay on the host)."""

    activation_bytes: int
    non_torch_bytes: int
    context_bytes: int
    offload_bytes: int
    source: str  # what the activation figure stands for, for `servesim plan`


def ggml_graph_bytes(model: ModelSpec, context: int, batch: int) -> int:
    """Ollama's full-offload estimate of the ggml compute buffer, llama family (fs/ggml/ggml.go GraphSize):
    max(4·b·(1 + 4·H + ctx·(1 + heads)), 4·b·(H + vocab)); f32 scores for one ubatch, or its logits."""
    h, heads, vocab = model.hidden_size, model.num_attention_heads, model.vocab_size
    return max(4 * batch * (1 + 4 * h + context * (1 + heads)), 4 * batch * (h + vocab))


def host_embedding_bytes(model: ModelSpec, dtype: str) -> int:
    """llama.cpp keeps the input embedding in host memory; a tied model copies it back for its LM head."""
    if model.tie_word_embeddings:
        return 0
    return model.vocab_size * model.hidden_size * activation_dtype_bytes(dtype)


def engine_overheads(
    rule: MemoryRule,
    model: ModelSpec,
    *,
    tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    tensor_parallel_size: int = 1,
    dtype: str = "bf16",
) -> Overheads:
    """The activation peak, non-torch memory and CUDA context of ``rule.profile`` for this model.

    ``tokens``: the token budget of the engine's start-up pass (max_num_batched_tokens, max_num_tokens,
    max_batch_prefill_tokens, chunk_size, n_batch / num_batch)."""
    tp = tensor_parallel_size
    kind = rule.profile
    if kind not in PROFILES:
        raise ConfigError(f"memory rule: unknown profile {kind!r}; known: {', '.join(PROFILES)}")
    nt = estimate_non_torch_bytes(tp)
    fwd = forward_activation_bytes(model, tokens, tensor_parallel_size=tp, dtype=dtype)

    def vllm_peak(seqs: int) -> int:
        return estimate_activation_bytes(
            model, max_num_batched_tokens=tokens, max_num_seqs=seqs, tensor_parallel_size=tp, dtype=dtype
        )

    if kind == "vllm":
        return Overheads(vllm_peak(max_num_seqs), nt, 0, 0, f"vLLM profile run, {tokens} tokens")
    if kind == "vllm-v0":
        return Overheads(vllm_peak(max_num_seqs), nt + CUDA_CONTEXT_BYTES, 0, 0,
                         f"vLLM V0 profile run, {tokens} tokens; non-torch includes the CUDA context")
    if kind == "sarathi":
        chunk = min(tokens, max_model_len)
        return Overheads(forward_activation_bytes(model, chunk, tensor_parallel_size=tp, dtype=dtype), 0, 0, 0,
                         f"Sarathi-Serve profile: one {chunk}-token chunk, torch peak only")
    if kind == "trtllm":
        rows = -(-tokens // max(1, min(tokens, max_model_len)))  # dummy context requests, one logits row each
        return Overheads(vllm_peak(min(max_num_seqs, rows)), nt, CUDA_CONTEXT_BYTES, 0,
                         f"TensorRT-LLM dummy context requests, {tokens} tokens")
    if kind == "tgi":
        copies = 1 if tp == 1 else 2  # TP: local shard + the all-gathered full-vocab logits
        logits = tokens * model.vocab_size * activation_dtype_bytes(dtype) * copies
        return Overheads(max(fwd, logits), nt, CUDA_CONTEXT_BYTES, 0,
                         f"TGI warmup prefill of {tokens} tokens with prefill logprobs (logits for all)")
    if kind == "hf":
        return Overheads(vllm_peak(max_num_seqs), nt, CUDA_CONTEXT_BYTES, 0,
                         f"HF generate: one {tokens}-token prefill (no reservation)")
    context = rule.context_tokens or max_model_len
    graph = ggml_graph_bytes(model, context, min(tokens, UBATCH))
    if kind == "llamacpp":
        return Overheads(graph, 0, CUDA_CONTEXT_BYTES, host_embedding_bytes(model, dtype),
                         f"ggml compute buffer for a {min(tokens, UBATCH)}-token ubatch at n_ctx {context}")
    return Overheads(graph, 0, CUDA_CONTEXT_BYTES, host_embedding_bytes(model, dtype),
                     f"Ollama GraphSize at num_ctx x num_parallel = {context}, num_batch {tokens}")


def fraction_of(rule: MemoryRule) -> float | None:
    """The free-memory fraction, checked (a plug-in's rule may say anything)."""
    f = rule.free_fraction
    if f is not None and not (isinstance(f, int | float) and not isinstance(f, bool) and 0 < f <= 1
                              and math.isfinite(f)):
        raise ConfigError(f"memory rule: free_fraction must be in (0, 1], got {f!r}")
    return f
