"""Per-step cost model: a batch summary (decode contexts, prefill chunks, logits, swaps) -> seconds.

The roofline model follows reference/costmodel.md §0/§1.2: per layer a smooth roofline per GEMM with the
weights read once per step for all M tokens, decode attention closed-form in (n, Σctx), prefill attention
per chunk, elementwise kernels, TP all-reduces; once per step the LM head, sampler and engine overheads.
Everything that depends only on the token count M is tabulated lazily, so a step costs a few list lookups
plus O(#prefill chunks) arithmetic (the simulator calls it ~10^5 times per run).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim.core.batch import BatchSummary
from sim.core.errors import ConfigError
from sim.core.plugins import registrar, resolve
from sim.cost.collectives import allreduce_seconds
from sim.cost.decode_price import decode_times
from sim.cost.hardware import GpuSpec
from sim.cost.models import ModelSpec, activation_dtype_bytes, kv_dtype_bytes, normalize_dtype
from sim.cost.profiles import CalibrationProfile, get_profile
from sim.cost.quant import select_kernel
from sim.cost.smooth import pow_c, smooth
from sim.cost.step_price import NEED_TABLES, StepPricer


@runtime_checkable
class CostModel(Protocol):
    """What the engine needs from a cost model."""

    def step_time(self, batch: BatchSummary) -> float: ...

    def decode_step_times(
        self, num_decode: int | np.ndarray, ctx_sums: np.ndarray, num_logits: int | None = None
    ) -> np.ndarray: ...

    def breakdown(self, batch: BatchSummary) -> dict[str, float]: ...


class RooflineCostModel:
    """Roofline step time for one replica (`tensor_parallel_size` GPUs) of `model` on `gpu`."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        dtype: str = "bf16",
        kv_cache_dtype: str = "auto",
        tensor_parallel_size: int = 1,
        profile: CalibrationProfile | str | None = None,
        block_size: int = 16,
    ) -> None:
        canon = normalize_dtype(dtype)  # ConfigError naming the dtype when unknown
        b_kv = kv_dtype_bytes(kv_cache_dtype, canon)
        t = tensor_parallel_size
        if not isinstance(t, int) or t < 1:
            raise ConfigError(f"tensor_parallel_size={t!r}: must be a positive integer")
        if model.num_attention_heads % t:
            raise ConfigError(
                f"tensor_parallel_size={t} does not divide num_attention_heads="
                f"{model.num_attention_heads} of {model.name}"
            )
        if block_size < 1:
            raise ConfigError(f"block_size={block_size!r}: must be >= 1")
        if profile is None or isinstance(profile, str):
            profile = get_profile(gpu, profile)
        self.model, self.gpu, self.profile, self.tp = model, gpu, profile, t
        self.dtype = canon
        self.block_size = block_size
        pr = profile

        self._b_a = float(activation_dtype_bytes(self.dtype))  # 16-bit activations for quantized weights
        self._b_kv = float(b_kv)
        half_peak = gpu.fp16_flops if self.dtype == "fp16" else gpu.bf16_flops
        if self.dtype == "fp32":
            half_peak = gpu.bf16_flops / 2  # TF32 tensor cores run at half the bf16 rate (A100, H100, Ada)
        # The linear layers' kernel (sim/cost/quant.py): FP8/INT8 tensor cores, or weight-only with dequant work
        self.quant_kernel = select_kernel(dtype, gpu, half_peak)
        self._b_w = self.quant_kernel.weight_bytes
        self._gemm_peak = self.quant_kernel.peak * pr.eta_compute
        self._head_peak = half_peak * pr.eta_compute  # the LM head stays 16-bit in quantized checkpoints
        self._head_bw = gpu.mem_bandwidth * pr.eta_bandwidth
        self._gemm_bw = self._head_bw * self.quant_kernel.bandwidth_factor
        self._ew_bw = gpu.mem_bandwidth * pr.eta_elementwise
        self._attn_peak = half_peak * pr.eta_fa

        # ---- geometry per GPU (heads and widths divided by TP; KV heads replicated down to 1)
        m = model
        H, hd, L = m.hidden_size, m.head_dim, m.num_hidden_layers
        nh = m.num_attention_heads // t
        nkv = max(1, math.ceil(m.num_key_value_heads / t))
        self._layers = L
        if m.kv_lora_rank > 0:  # MLA (DeepSeek-V2): the latent cache is replicated on every rank
            rope = m.qk_rope_head_dim
            nope = hd - rope
            if nope <= 0:
                raise ConfigError(f"{m.name}: head_dim {hd} must exceed qk_rope_head_dim {rope} for MLA")
            v_hd = nope  # DeepSeek-V2/V3: v_head_dim == qk_nope_head_dim (128); no field for it in ModelSpec
            lat = m.kv_lora_rank + rope
            self._attn_gemms = [(H, nh * hd), (H, lat), (m.kv_lora_rank, nh * (nope + v_hd)), (nh * v_hd, H)]
            self._kv_tok = lat * self._b_kv  # costmodel.md §1.2: (kv_lora_rank + rope) elements per token
            dec_flops = 2.0 * nh * (lat + m.kv_lora_rank)  # weight-absorbed decode: QK over 576, PV over 512
            self._fa_coef = 2.0 * nh * (hd + v_hd)
            self._mla_up = 2.0 * m.kv_lora_rank * nh * (nope + v_hd)  # prefill up-projects the cached latent
            self._mixed_factor = 1.0
            ew_attn = (nh * rope + rope) * 2 * self._b_a + lat * (self._b_a + self._b_kv)
        else:
            self._attn_gemms = [(H, (nh + 2 * nkv) * hd), (nh * hd, H)]
            self._kv_tok = 2.0 * nkv * hd * self._b_kv  # costmodel.md §1.3: KV heads, not query heads
            dec_flops = 4.0 * nh * hd
            self._fa_coef = 4.0 * nh * hd  # causal: 4·nh·hd per (query, key) pair (§1.2)
            self._mla_up = 0.0
            self._mixed_factor = 1.0 + pr.mixed_decode_gqa_reread * (nh / nkv - 1.0)
            ew_attn = (nh + nkv) * hd * 2 * self._b_a + 2 * nkv * hd * (self._b_a + self._b_kv)
        # mixed-step decode floor: CTA waves (per query head) and one sequence's serial stream (profiles.py)
        self._mix_head = pr.mixed_decode_head_token_s * nh
        self._mix_seq = pr.mixed_decode_seq_token_s
        # Decode attention per layer is linear in Σctx: the larger of the byte and FLOP coefficients.
        self._kv_coef = max(self._kv_tok / (gpu.mem_bandwidth * pr.eta_kv), dec_flops / self._attn_peak)
        self._dec_seq = self._kv_coef * pr.attn_ctx_pad_tokens + pr.attn_per_seq_s
        self._attn_t0 = pr.attn_t0_s
        self._inv_attn_peak = 1.0 / self._attn_peak
        self._kv_bw = gpu.mem_bandwidth * pr.eta_kv
        self._pf_floor, self._pf_sat = pr.prefill_kv_floor, pr.prefill_kv_sat_tokens
        self._pf_ramp, self._pf_t0 = pr.prefill_causal_ramp_tokens, pr.prefill_chunk_t0_s

        # ---- MLP / MoE layers
        n_mats = 3 if m.gated_mlp else 2
        self._n_mats = n_mats
        if m.num_experts > 0:
            self._moe_layers = L - m.first_k_dense_replace
            self._ie = m.moe_intermediate_size or m.intermediate_size
        else:
            self._moe_layers, self._ie = 0, 0
        self._dense_layers = L - self._moe_layers
        act_width = m.intermediate_size * self._dense_layers
        if self._moe_layers:
            act_width += (m.experts_per_tok + m.num_shared_experts) * self._ie * self._moe_layers
        act_width /= L * t  # mean SiLU·mul width per layer per GPU
        # Per token per layer: two fused add+RMSNorm (≈2H each: the residual stream stays in L2 on the RTX 4090
        # data), RoPE, KV write, SiLU·mul (reads 2 widths, writes 1; non-gated: 1 and 1).
        ew_tok_layer = 4 * H * self._b_a + ew_attn + (n_mats * act_width) * self._b_a
        self._ew_tok_layer = ew_tok_layer
        link = gpu.interconnect_bandwidth if gpu.interconnect_bandwidth > 0 else gpu.host_bandwidth
        self._ar_bw = link * pr.allreduce_bw_eff
        self._graph_max = max(pr.cuda_graph_sizes) if pr.cuda_graphs else 0

        # ---- per-step constants
        self._step_oh, self._seq_oh = pr.step_overhead_s, pr.per_seq_overhead_s
        self.kv_bytes_per_token = L * self._kv_tok  # one GPU's share, all layers
        host = gpu.host_bandwidth * pr.host_bw_eff
        self._swap_block_s = block_size * self.kv_bytes_per_token / host if host > 0 else math.inf
        if pr.cuda_graphs:
            sizes = pr.cuda_graph_sizes
            pad, j = [0], 0
            for n in range(1, sizes[-1] + 1):
                while sizes[j] < n:
                    j += 1
                pad.append(sizes[j])
            self._pad = pad
        else:
            self._pad = [0]
        self._pad_arr = np.asarray(self._pad, dtype=np.int64)
        self._pad_mixed = pr.cuda_graphs and pr.cuda_graph_pad_mixed
        self._tok: list[float] = []
        self._head: list[float] = []
        self._grow_tok(1023)
        self._grow_head(255)
        self._pricer = self._make_pricer()

    def _make_pricer(self, cls: type[StepPricer] = StepPricer) -> StepPricer:
        """The pricer of this model's coefficients (``cls``: another build of the class, for tests)."""
        return cls(
            self._tok, self._head, self._pad, self._pad_mixed, self._step_oh, self._seq_oh, self._layers, self._attn_t0,
            self._kv_coef, self._dec_seq, self._mixed_factor, self._mix_head, self._mix_seq, self._fa_coef,
            self._mla_up, self._kv_tok, self._pf_floor, self._pf_sat, self._kv_bw, self._inv_attn_peak,
            self._pf_ramp, self._pf_t0, self._swap_block_s)  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a sweep's worker, a saved result) without the compiled pricer, which is rebuilt."""
        state = dict(self.__dict__)
        del state["_pricer"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pricer = self._make_pricer()

    # ------------------------------------------------------------------ token-level parts (vectorized in M)
    def _gemm(self, k: float, n: float, M: np.ndarray, b_w: float | None = None) -> np.ndarray:
        b_w = self._b_w if b_w is None else b_w
        pr = self.profile
        return smooth(
            2.0 * M * k * n,
            k * n * b_w + M * (k + n) * self._b_a,
            self._gemm_peak,
            self._gemm_bw,
            pr.roofline_p,
            pr.t0_gemm_s,
        )

    def _mlp(self, width: float, M: np.ndarray) -> np.ndarray:
        H, t = self.model.hidden_size, self.tp
        up = self._gemm(H, (self._n_mats - 1) * width / t, M)
        return up + self._gemm(width / t, H, M)

    def _token_parts(self, M: np.ndarray) -> dict[str, np.ndarray]:
        """Seconds per step, summed over layers, of everything that depends only on the token count M."""
        m, pr, t, L = self.model, self.profile, self.tp, self._layers
        H = m.hidden_size
        M = np.asarray(M, dtype=np.float64)
        attn_gemm = sum(self._gemm(k, n, M) for k, n in self._attn_gemms)
        gemm = L * attn_gemm
        if self._dense_layers:
            gemm = gemm + self._dense_layers * self._mlp(m.intermediate_size, M)
        moe = np.zeros_like(M)
        if self._moe_layers:
            E, k, ie = m.num_experts, m.experts_per_tok, self._ie
            router = self._gemm(H, E, M)
            # costmodel.md §1.2: distinct experts touched E_eff = E·(1 − (1 − k/E)^M) under uniform routing.
            e_eff = E * (1.0 - pow_c(1.0 - k / E, M))
            w = self._n_mats * H * ie / t
            flops = 2.0 * M * k * w
            nbytes = e_eff * w * self._b_w + M * k * (2 * H + self._n_mats * ie / t) * self._b_a
            experts = smooth(
                flops, nbytes, self._gemm_peak, self._gemm_bw, pr.roofline_p, 2 * pr.t0_gemm_s
            )  # fused MoE: two grouped kernels (w13, w2)
            layer = router + experts
            if m.num_shared_experts:
                layer = layer + self._mlp(m.num_shared_experts * ie, M)
            moe = self._moe_layers * layer
        # Small M: the ~5 tiny kernels per layer cost a fixed time (launch/latency bound), large M: bytes/BW.
        elementwise = L * np.maximum(M * self._ew_tok_layer / self._ew_bw, pr.layer_fixed_s) + np.maximum(
            M * 4 * H * self._b_a / self._ew_bw, pr.step_elementwise_fixed_s
        )  # embedding gather + final norm, once
        if t > 1 and pr.allreduce_model == "profile":  # the profile's own ring fit (servesim calibrate)
            allreduce = 2 * L * (pr.allreduce_latency_s + 2 * (t - 1) / t * M * H * self._b_a / self._ar_bw)
        elif t > 1:  # two all-reduces of M·H·b_a per layer (Megatron), per interconnect (sim/cost/collectives.py)
            nb = M * H * self._b_a
            graph = M <= self._graph_max  # V1 runs batches up to the largest capture size inside a graph
            allreduce = 2 * L * np.where(
                graph,
                allreduce_seconds(nb, t, self.gpu, graph=True),
                allreduce_seconds(nb, t, self.gpu, graph=False),
            )
        else:
            allreduce = np.zeros_like(M)
        parts = {"gemm": gemm, "moe": moe, "elementwise": elementwise, "allreduce": allreduce}
        zero = M <= 0
        return {k: np.where(zero, 0.0, v) for k, v in parts.items()}

    def _head_parts(self, S: np.ndarray) -> dict[str, np.ndarray]:
        """LM head for S logit rows (vLLM computes logits only for sampled positions) and the sampler."""
        m, pr = self.model, self.profile
        S = np.asarray(S, dtype=np.float64)
        H, V = m.hidden_size, m.vocab_size
        vr = V / self.tp
        b16 = self._b_a
        lm = smooth(
            2.0 * S * H * vr,
            H * vr * b16 + S * (H + vr) * b16,
            self._head_peak,
            self._head_bw,
            pr.roofline_p,
            pr.t0_gemm_s,
        )
        sampler = pr.sampler_t0_s + S * V * pr.sampler_bytes_per_elem / self._ew_bw
        zero = S <= 0
        return {"lm_head": np.where(zero, 0.0, lm), "sampler": np.where(zero, 0.0, sampler)}

    def _grow_tok(self, m: int) -> None:
        cap = max(1024, 2 * len(self._tok), m + 1)
        parts = self._token_parts(np.arange(cap))
        self._tok_arr = parts["gemm"] + parts["moe"] + parts["elementwise"] + parts["allreduce"]
        self._tok = self._tok_arr.tolist()  # a list: scalar indexing in step_time is cheaper
        if (pricer := self.__dict__.get("_pricer")) is not None:
            pricer.tok = self._tok

    def _grow_head(self, s: int) -> None:
        cap = max(256, 2 * len(self._head), s + 1)
        parts = self._head_parts(np.arange(cap))
        self._head_arr = parts["lm_head"] + parts["sampler"]
        self._head = self._head_arr.tolist()
        if (pricer := self.__dict__.get("_pricer")) is not None:
            pricer.head = self._head

    def _padded(self, n: int) -> int:
        return self._pricer.padded(n)

    # ------------------------------------------------------------------ public API
    def step_pricer(self) -> StepPricer | None:
        """The compiled pricer whose ``step_time`` / ``decode_list`` answer as this model's ``step_time`` /
        ``decode_step_list`` do (or NEED_TABLES / IndexError: then call those, which grow the tables), for
        a caller that prices every step (the engine: no interpreted call per step). None for a subclass
        that prices otherwise."""
        cls, own = type(self), self.__dict__
        if (cls.step_time is not RooflineCostModel.step_time or "step_time" in own
                or cls.decode_step_list is not RooflineCostModel.decode_step_list or "decode_step_list" in own):
            return None
        return self._pricer

    def step_time(self, batch: BatchSummary) -> float:
        """One step's seconds (sim/cost/step_price.py: the compiled arithmetic, from the coefficients above)."""
        t = self._pricer.step_time(batch)
        if t == NEED_TABLES:  # a step past the token or head table: grow it, then price
            self._grow_to(self._pricer.token_row(batch.num_decode, batch.num_prefill, batch), batch.num_logits)
            t = self._pricer.step_time(batch)
        return t

    def _grow_to(self, tok_row: int, head_row: int) -> None:
        """Grow the token and head tables to hold these rows (the pricers raise or answer NEED_TABLES)."""
        if tok_row >= len(self._tok):
            self._grow_tok(tok_row)
        if head_row >= len(self._head):
            self._grow_head(head_row)

    def decode_step_times(
        self, num_decode: int | np.ndarray, ctx_sums: np.ndarray, num_logits: int | None = None
    ) -> np.ndarray:
        """Times of consecutive decode-only steps; ctx_sums[i] = Σctx of step i.

        ``num_decode`` is the rows of every step, or one count per step (rows leave a run as they
        finish; every row samples then). Each element is computed with the same operations as
        ``step_time``, so the two agree exactly."""
        ctx = np.asarray(ctx_sums, dtype=np.float64)
        if np.ndim(num_decode):
            if num_logits is not None:
                raise ValueError("decode_step_times: with a row count per step every row samples; "
                                 "num_logits applies to a single count")
            n = np.asarray(num_decode, dtype=np.int64)
            if not n.size:
                return np.zeros(ctx.shape)
            top = int(n.max())
            if top == int(n.min()):  # the same rows throughout: the scalar path below
                return self.decode_step_times(top, ctx)
            if top <= 0:
                return np.zeros(ctx.shape)
            pad = self._pad_arr
            mg = np.where(n < len(pad), pad[np.minimum(n, len(pad) - 1)], n)
            if int(mg.max()) >= len(self._tok):
                self._grow_tok(int(mg.max()))
            if top >= len(self._head):
                self._grow_head(top)
            const = self._tok_arr[mg] + self._head_arr[n] + self._step_oh + self._seq_oh * n
            t = const + self._layers * (self._attn_t0 + (self._kv_coef * ctx + n * self._dec_seq))
            return np.where(n > 0, t, 0.0)
        n = int(num_decode)
        if n <= 0:
            return np.zeros(ctx.shape)
        s = n if num_logits is None else int(num_logits)
        mg = self._padded(n)
        if mg >= len(self._tok):
            self._grow_tok(mg)
        if s >= len(self._head):
            self._grow_head(s)
        const = self._tok[mg] + self._head[s] + self._step_oh + self._seq_oh * n
        return const + self._layers * (self._attn_t0 + (self._kv_coef * ctx + n * self._dec_seq))

    def decode_step_list(self, rows: list[int], ctx_sums: list[int]) -> list[float]:
        """``decode_step_times`` over lists, every row sampling (the fast-forward's runs); the same values.
        The tables are grown only when a row count is past them (decode_times raises IndexError: rare, so
        the usual call checks nothing here)."""
        for _ in range(2):
            try:
                return decode_times(self._tok, self._head, self._pad, self._step_oh, self._seq_oh,
                                    float(self._layers), self._attn_t0, self._kv_coef, self._dec_seq, rows, ctx_sums)
            except IndexError:
                self._grow_to(max(map(self._padded, rows), default=0), max(rows, default=0))
        raise RuntimeError("decode_step_list: the tables were grown and still did not cover the rows")

    def breakdown(self, batch: BatchSummary) -> dict[str, float]:
        """Per-operator seconds of one step; the values sum to step_time(batch)."""
        d, pc = batch.decode_ctx, batch.prefill_chunk
        n, npf = len(d), len(pc)
        swaps = batch.swap_in_blocks + batch.swap_out_blocks
        keys = (
            "gemm",
            "moe",
            "elementwise",
            "allreduce",
            "attention_fixed",
            "attention_decode",
            "attention_prefill",
            "lm_head",
            "sampler",
            "step_overhead",
            "seq_overhead",
            "swap",
        )
        out = dict.fromkeys(keys, 0.0)
        if not n and not npf and not swaps:
            return out
        mt = n + int(pc.sum()) if npf else n
        mg = (self._padded(mt) if self._pad_mixed else mt) if npf else self._padded(n)
        for k, v in self._token_parts(np.array([mg])).items():
            out[k] = float(v[0])
        for k, v in self._head_parts(np.array([batch.num_logits])).items():
            out[k] = float(v[0])
        out["step_overhead"] = self._step_oh
        out["seq_overhead"] = self._seq_oh * (n + npf)
        if n or npf:
            L = self._layers
            out["attention_fixed"] = L * self._attn_t0
            if n:
                dec = self._kv_coef * int(d.sum()) + n * self._dec_seq
                out["attention_decode"] = L * (self._pricer.mixed_decode(batch) if npf else dec)
            if npf:
                out["attention_prefill"] = L * self._pricer.prefill_attn(pc.tolist(), batch.prefill_ctx.tolist())
        out["swap"] = swaps * self._swap_block_s if swaps else 0.0
        return out


class ConstantCostModel:
    """Every non-empty step takes step_s + per_token_s × tokens (tests, vLLM-oracle comparisons)."""

    def __init__(self, step_s: float = 1.0, per_token_s: float = 0.0) -> None:
        if not (step_s >= 0 and per_token_s >= 0):
            raise ConfigError(
                f"constant cost model: step_s={step_s!r}, per_token_s={per_token_s!r} must be >= 0"
            )
        self.step_s, self.per_token_s = float(step_s), float(per_token_s)

    def step_time(self, batch: BatchSummary) -> float:
        if batch.is_empty:
            return 0.0
        return self.step_s + self.per_token_s * batch.num_tokens

    def decode_step_times(
        self, num_decode: int | np.ndarray, ctx_sums: np.ndarray, num_logits: int | None = None
    ) -> np.ndarray:
        shape = np.shape(ctx_sums)
        n = np.broadcast_to(np.asarray(num_decode, dtype=np.int64), shape)
        return np.where(n > 0, self.step_s + self.per_token_s * n, 0.0).astype(np.float64)

    def decode_step_list(self, rows: list[int], ctx_sums: list[int]) -> list[float]:
        step, per = self.step_s, self.per_token_s
        return [step + per * n if n > 0 else 0.0 for n in rows]

    def breakdown(self, batch: BatchSummary) -> dict[str, float]:
        if batch.is_empty:
            return {"step": 0.0, "tokens": 0.0}
        return {"step": self.step_s, "tokens": self.per_token_s * batch.num_tokens}


_REGISTRY: dict[str, type] = {"roofline": RooflineCostModel, "constant": ConstantCostModel}


# ``@register_cost_model(name)`` on a class built like the roofline, ``cls(model=ModelSpec, gpu=GpuSpec,
# dtype=, kv_cache_dtype=, tensor_parallel_size=, profile=, block_size=)``, offering what CostModel lists.
register_cost_model = registrar(_REGISTRY)


def resolve_cost_model(spec: str) -> str:
    """The registered name of ``spec``: a name, ``"package.module:Class"`` or a ``servesim.cost_models``
    entry point (sim/core/plugins.py); a class named by module path is registered under ``spec``."""
    return resolve(spec, _REGISTRY, kind="cost model", where="[engine] cost_model", adopt=_REGISTRY.__setitem__)


def make_cost_model(name: str, **kwargs: Any) -> CostModel:
    """Build a registered cost model. For "roofline", `model` and `gpu` may also be catalogue names."""
    name = resolve_cost_model(name)
    if name == "roofline":
        if isinstance(kwargs.get("model"), str):
            from sim.cost import models

            kwargs["model"] = _lookup(models, "get_model", kwargs["model"])
        if isinstance(kwargs.get("gpu"), str):
            from sim.cost import hardware

            kwargs["gpu"] = _lookup(hardware, "get_gpu", kwargs["gpu"])
    try:
        cost = _REGISTRY[name](**kwargs)
    except TypeError as e:
        raise ConfigError(f"cost model {name!r}: {e}") from None
    if not isinstance(cost, CostModel):
        missing = [m for m in ("step_time", "decode_step_times", "breakdown") if not hasattr(cost, m)]
        raise ConfigError(f"cost model {name!r}: built a {type(cost).__name__}, which lacks {', '.join(missing)}")
    return cost


def _lookup(module: Any, func: str, key: str) -> Any:
    getter = getattr(module, func, None)
    if getter is None:
        raise ConfigError(f"cannot resolve {key!r}: {module.__name__}.{func} is not available")
    return getter(key)
