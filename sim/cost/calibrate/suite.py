"""The microbenchmark suite behind ``servesim calibrate`` (needs PyTorch: ``pip install servesim[calibrate]``).

What it times (costmodel.md §2.1), all per GPU and written as samples (sim/cost/calibrate/samples.py):

* copy:        ``y.copy_(x)`` over buffers well above L2 -> achievable HBM bandwidth (diagnostic)
* gemm:        bf16 ``x @ W`` for a model's own (K, N) shapes (fused QKV, O, gate_up, down, LM head),
               M = 1 ... 16384 tokens; under a CUDA graph of repeated launches so launch cost is not timed
* attention:   decode (n sequences × context) and prefill (chunk after cached context), FlashAttention when
               ``flash_attn`` is installed, else PyTorch SDPA (GQA); bottom-right causal masks
* elementwise: RMSNorm ×2, RoPE, SiLU·mul per layer; embedding + final norm per step (eager PyTorch kernels,
               so slower than vLLM's fused ones: the fitted terms are an upper bound)
* sampler:     softmax + exponential-race sampling over the vocabulary, vs sequences
* allreduce:   ``torch.distributed.all_reduce`` over every visible GPU (NCCL; gloo on CPU), when > 1
* step:        a minimal scheduling loop on the host (Python bookkeeping for n sequences, input tensors to the
               device, one tiny kernel, sampled ids back) -> per-step and per-sequence CPU cost

``smoke=True`` shrinks every shape (CPU in CI: seconds, not minutes); such output is marked as not a GPU
profile in its metadata and must never be shipped.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.cost.calibrate.samples import Microbench, make_frame
from sim.cost.calibrate.timing import Timer, copies, environment, rotate
from sim.cost.models import ModelSpec, get_model


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only where torch is absent
        raise ConfigError(
            "servesim calibrate needs PyTorch: pip install 'servesim[calibrate]' (or torch) first"
        ) from None
    return torch


@dataclass(frozen=True)
class SuiteConfig:
    model: str = "Llama-3.1-8B"
    tp: int = 1
    device: str = "auto"  # "auto" (cuda if available), "cuda", "cpu"
    smoke: bool = False
    max_tokens: int = 16384
    iters: int = 20  # timed repetitions per point (median)
    warmup: int = 3
    seed: int = 0


# ---------------------------------------------------------------------------------------------- benchmarks


def _smoke_model(m: ModelSpec) -> ModelSpec:
    """The same architecture shrunk 16× in width (heads kept proportional) so CPU runs take seconds."""
    from dataclasses import replace

    nh = max(2, m.num_attention_heads // 8)
    nkv = max(1, m.num_key_value_heads // 8)
    return replace(m, name=f"{m.name} (smoke /16)", hidden_size=m.hidden_size // 16,
                   intermediate_size=m.intermediate_size // 16, num_attention_heads=nh, num_key_value_heads=nkv,
                   head_dim=32, vocab_size=m.vocab_size // 64)


def _token_grid(max_tokens: int, smoke: bool) -> list[int]:
    if smoke:
        return [1, 4, 16, 64]
    grid = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
            6144, 8192, 12288, 16384]
    return [m for m in grid if m <= max_tokens]


def run_suite(cfg: SuiteConfig = SuiteConfig(), log: Callable[[str], None] | None = None) -> Microbench:
    """Run every benchmark; return the samples plus the environment (``meta``)."""
    torch = _torch()
    log = log or (lambda _msg: None)
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device visible to PyTorch")
    torch.manual_seed(cfg.seed)
    model = get_model(cfg.model)
    if cfg.smoke:
        model = _smoke_model(model)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a_bytes = 2 if dtype == torch.bfloat16 else 4
    timer = Timer(torch, device, max(3, cfg.iters // (4 if cfg.smoke else 1)), cfg.warmup if not cfg.smoke else 1)
    env = environment(torch, device)
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    sections = (
        ("copy", _bench_copy), ("gemm", _bench_gemm), ("attention", _bench_attention),
        ("elementwise", _bench_elementwise), ("sampler", _bench_sampler), ("allreduce", _bench_allreduce),
        ("step", _bench_step),
    )
    ctx = dict(torch=torch, device=device, dtype=dtype, a_bytes=a_bytes, model=model, tp=cfg.tp, cfg=cfg,
               timer=timer, log=log)
    for name, fn in sections:
        t0 = time.perf_counter()
        got = fn(**ctx)
        rows += got
        log(f"{name}: {len(got)} samples in {time.perf_counter() - t0:.1f} s")
    meta = {
        **env,
        "format": "servesim-samples",
        "suite": "servesim calibrate",
        "model": model.name,
        "tp": cfg.tp,
        "dtype": "bf16" if a_bytes == 2 else "fp32",
        "smoke": cfg.smoke,
        "gpu_profile": device == "cuda" and not cfg.smoke,
        "attention_backend": _attention_backend(torch, device),
        "wall_s": round(time.perf_counter() - t_start, 2),
        "notes": [
            "elementwise kernels are eager PyTorch (unfused): an upper bound on vLLM's fused kernels",
            "no mixed prefill+decode attention kernel is timed: the mixed-batch terms keep their prior",
        ],
    }
    name = env["device_name"]
    if device == "cuda":
        from sim.cost.calibrate.importers import gpu_name

        name = gpu_name(name)
    return Microbench(name, make_frame(rows, file="samples.csv"), meta)


def _bench_copy(torch, device, dtype, a_bytes, timer, cfg, **_) -> list[dict[str, Any]]:
    sizes = [8 << 20, 32 << 20] if cfg.smoke else [256 << 20, 512 << 20, 1 << 30]
    rows = []
    for nb in sizes:
        x = torch.empty(nb // 2, dtype=torch.float16, device=device).uniform_()
        y = torch.empty_like(x)
        t = timer(lambda x=x, y=y: y.copy_(x), reps=4)
        rows.append(dict(op="copy", name="copy", time_s=t, nbytes=2 * nb))  # read + write
        del x, y
    return rows


def _gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    H, hd = model.hidden_size, model.head_dim
    nh, nkv = model.num_attention_heads // tp, max(1, math.ceil(model.num_key_value_heads / tp))
    inter = model.intermediate_size // tp
    return {
        "qkv_proj": (H, (nh + 2 * nkv) * hd),
        "o_proj": (nh * hd, H),
        "gate_up_proj": (H, (2 if model.gated_mlp else 1) * inter),
        "down_proj": (inter, H),
        "lm_head": (H, model.vocab_size // tp),
    }


def _bench_gemm(torch, device, dtype, a_bytes, model, tp, timer, cfg, **_) -> list[dict[str, Any]]:
    rows = []
    grid = _token_grid(cfg.max_tokens, cfg.smoke)
    for name, (k, n) in _gemm_shapes(model, tp).items():
        ws = [torch.randn(k, n, dtype=dtype, device=device) * 0.02
              for _ in range(copies(k * n * a_bytes, cfg.smoke, device, torch))]
        for m in grid if name != "lm_head" else [m for m in grid if m <= 512]:
            x = torch.randn(m, k, dtype=dtype, device=device)
            t = timer(rotate(ws, lambda w, x=x: x @ w), reps=max(8, len(ws)))
            rows.append(dict(op="gemm", name=name, time_s=t, m=m, k=k, n=n, w_bytes=a_bytes, a_bytes=a_bytes))
        del ws
    return rows


def _attention_backend(torch, device) -> str:
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attn"
        except ImportError:
            pass
    return "torch-sdpa"


def _sdpa(torch, q, k, v, causal_lower_right: bool):
    """SDPA with GQA (q: B×nh×S×d, k/v: B×nkv×T×d) and a bottom-right causal mask when asked.

    The mask is given in the form that lets PyTorch pick its flash kernel, as vLLM's FlashAttention would run:
    ``is_causal`` when there is no cached context (S == T), else a lower-right ``CausalBias``; a materialised
    boolean mask (which rules the flash kernel out) only where neither is available.
    """
    F = torch.nn.functional
    s, t = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if not (causal_lower_right and s > 1):
        return _sdpa_gqa(F, q, k, v, gqa)
    if s == t:
        return _sdpa_gqa(F, q, k, v, gqa, is_causal=True)
    try:
        from torch.nn.attention.bias import causal_lower_right

        return _sdpa_gqa(F, q, k, v, gqa, attn_mask=causal_lower_right(s, t))
    except (ImportError, RuntimeError, TypeError):  # older torch, or no kernel takes the bias: materialise it
        mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(diagonal=t - s)
        return _sdpa_gqa(F, q, k, v, gqa, attn_mask=mask)


def _sdpa_gqa(F, q, k, v, gqa: bool, **kw):
    if not gqa:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    try:  # torch >= 2.5: GQA without materialising the repeated K/V
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    except TypeError:
        r = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), **kw)


def _attn_call(torch, use_fa, dtype, device, b, s, t, nh, nkv, hd, causal, n_copies=1):
    """A call of one attention kernel: b sequences, s queries each, over t keys (the last s are the new ones).
    K and V are distinct tensors (one tensor for both would be read once from HBM and again from L2), and
    successive calls cycle through ``n_copies`` K/V pairs (timing.copies)."""
    if use_fa:
        from flash_attn import flash_attn_func  # (B, S, H, d); causal is bottom-right aligned (FA >= 2.1)

        q = torch.randn(b, s, nh, hd, dtype=dtype, device=device)
        kv = [(torch.randn(b, t, nkv, hd, dtype=dtype, device=device),
               torch.randn(b, t, nkv, hd, dtype=dtype, device=device)) for _ in range(n_copies)]
        return rotate(kv, lambda p: flash_attn_func(q, p[0], p[1], causal=causal))
    q = torch.randn(b, nh, s, hd, dtype=dtype, device=device)
    kv = [(torch.randn(b, nkv, t, hd, dtype=dtype, device=device),
           torch.randn(b, nkv, t, hd, dtype=dtype, device=device)) for _ in range(n_copies)]
    return rotate(kv, lambda p: _sdpa(torch, q, p[0], p[1], causal))


def _bench_attention(torch, device, dtype, a_bytes, model, tp, timer, cfg, **_) -> list[dict[str, Any]]:
    nh, nkv, hd = model.num_attention_heads // tp, max(1, math.ceil(model.num_key_value_heads / tp)), model.head_dim
    heads = dict(nh=nh, nkv=nkv, hd=hd, kv_bytes=a_bytes, a_bytes=a_bytes)
    use_fa = _attention_backend(torch, device) == "flash_attn"
    rows = []
    if cfg.smoke:
        dec_grid = [(n, c) for n in (1, 4) for c in (16, 64, 256)]
        pf_grid = [(c, p) for c in (16, 64) for p in (0, 128)]
    else:
        ns, cs = [1, 2, 4, 8, 16, 32, 64, 128, 256], [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
        dec_grid = [(n, c) for n in ns for c in cs if n * c <= (1 << 20)]
        pf_grid = [(c, p) for c in (16, 64, 256, 512, 1024, 2048, 4096, 8192)
                   for p in (0, 512, 2048, 8192, 16384) if c + p <= 32768]
    kv_token = 2 * nkv * hd * a_bytes  # K and V bytes of one token in one layer
    for n, c in dec_grid:
        cp = copies(n * c * kv_token, cfg.smoke, device, torch)
        fn = _attn_call(torch, use_fa, dtype, device, n, 1, c, nh, nkv, hd, causal=False, n_copies=cp)
        rows.append(dict(op="attn_decode", name="decode", time_s=timer(fn, reps=max(4, cp)), n_decode=n,
                         kv_decode=c, chunk=0, kv_prefill=0, **heads))
    for c, p in pf_grid:
        cp = copies((p + c) * kv_token, cfg.smoke, device, torch)
        fn = _attn_call(torch, use_fa, dtype, device, 1, c, p + c, nh, nkv, hd, causal=True, n_copies=cp)
        rows.append(dict(op="attn_prefill", name="prefill", time_s=timer(fn, reps=max(2, cp)), chunk=c,
                         kv_prefill=p, n_decode=0, kv_decode=0, **heads))
    return rows


def _rms(torch, x, w, eps=1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def _bench_elementwise(torch, device, dtype, a_bytes, model, tp, timer, cfg, **_) -> list[dict[str, Any]]:
    H, hd = model.hidden_size, model.head_dim
    nh, nkv = model.num_attention_heads // tp, max(1, math.ceil(model.num_key_value_heads / tp))
    inter = model.intermediate_size // tp
    geo = dict(hidden=H, inter=inter, nh=nh, nkv=nkv, hd=hd, vocab=model.vocab_size, a_bytes=a_bytes,
               kv_bytes=a_bytes)
    w = torch.ones(H, dtype=dtype, device=device)
    emb = torch.randn(model.vocab_size // tp, H, dtype=dtype, device=device)
    rows = []
    for m in _token_grid(cfg.max_tokens, cfg.smoke):
        x = torch.randn(m, H, dtype=dtype, device=device)
        r = torch.randn(m, H, dtype=dtype, device=device)
        qk = torch.randn(m, (nh + nkv), hd, dtype=dtype, device=device)
        cos = torch.randn(m, 1, hd // 2, dtype=dtype, device=device)
        gu = torch.randn(m, 2 * inter, dtype=dtype, device=device)
        ids = torch.randint(0, emb.shape[0], (m,), device=device)

        def layer(x=x, r=r, qk=qk, cos=cos, gu=gu):
            for _ in range(2):  # input and post-attention add + RMSNorm
                _rms(torch, x + r, w)
            a, b = qk[..., : hd // 2], qk[..., hd // 2:]
            torch.cat((a * cos - b * cos, b * cos + a * cos), dim=-1)  # RoPE (rotate-half form)
            g, u = gu[:, :inter], gu[:, inter:]
            torch.nn.functional.silu(g) * u

        def step(ids=ids, x=x):
            emb.index_select(0, ids)
            _rms(torch, x, w)

        rows.append(dict(op="elementwise_layer", name="2*rmsnorm+rope+silu_mul", time_s=timer(layer, reps=4),
                         m=m, **geo))
        rows.append(dict(op="elementwise_step", name="embedding+final_norm", time_s=timer(step, reps=4), m=m,
                         **geo))
    return rows


def _bench_sampler(torch, device, dtype, a_bytes, model, timer, cfg, **_) -> list[dict[str, Any]]:
    V = model.vocab_size
    rows = []
    for s in ([1, 4, 16] if cfg.smoke else [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 384, 512]):
        logits = torch.randn(s, V, dtype=torch.float32, device=device)

        def sample(logits=logits):
            probs = torch.softmax(logits / 0.8, dim=-1)
            q = torch.empty_like(probs).exponential_()
            return (probs / q).argmax(dim=-1)  # exponential race = multinomial sampling (what vLLM does)

        rows.append(dict(op="sampler", name="softmax+exponential_race", time_s=timer(sample, reps=2), m=s,
                         vocab=V, a_bytes=4))
    return rows


def _allreduce_worker(rank: int, world: int, backend: str, sizes: list[int], iters: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)
    dev = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    res = []
    for nb in sizes:
        dt = torch.float16 if backend == "nccl" else torch.float32
        x = torch.ones(max(1, nb // (2 if backend == "nccl" else 4)), dtype=dt, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        ts = []
        for _ in range(iters):
            if backend == "nccl":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if backend == "nccl":
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        res.append((x.numel() * x.element_size(), float(np.median(ts))))
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def run_allreduce(world: int, backend: str, sizes: list[int], iters: int = 10) -> list[tuple[int, float]]:
    """(bytes, seconds) of one all-reduce across ``world`` processes (host-timed, so a small upper bound)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_allreduce_worker, args=(world, backend, sizes, iters, port, q), nprocs=world,
                       join=True, start_method="spawn")
    return q.get()


def _bench_allreduce(torch, device, cfg, **_) -> list[dict[str, Any]]:
    world = torch.cuda.device_count() if device == "cuda" else 1
    if world < 2 or cfg.smoke:
        return []
    sizes = [1 << k for k in range(10, 28, 2)]  # 1 KiB ... 128 MiB
    rows = []
    for tp in sorted({2, 4, 8, world} & set(range(2, world + 1))):
        for nb, t in run_allreduce(tp, "nccl", sizes):
            rows.append(dict(op="allreduce", name=f"nccl_tp{tp}", time_s=t, nbytes=nb, tp=tp))
    return rows


def _bench_step(torch, device, cfg, timer, **_) -> list[dict[str, Any]]:
    """A minimal scheduling loop: per-sequence Python bookkeeping, inputs to the device, one kernel, ids back."""
    rows = []
    for n in ([1, 8, 32] if cfg.smoke else [1, 2, 4, 8, 16, 32, 64, 128, 256]):
        seqs = [{"id": i, "tokens": [1] * 16, "blocks": [i]} for i in range(n)]
        table = torch.zeros(n, dtype=torch.long, device=device)

        def step(seqs=seqs, table=table):
            ids, pos = [], []
            for s in seqs:  # what a scheduler touches per running sequence each step
                ids.append(s["tokens"][-1])
                pos.append(len(s["tokens"]))
                if len(s["tokens"]) % 16 == 0:
                    s["blocks"].append(len(s["blocks"]))
            t_ids = torch.tensor(ids, dtype=torch.long).to(device, non_blocking=True)
            t_pos = torch.tensor(pos, dtype=torch.long).to(device, non_blocking=True)
            out = (t_ids + t_pos + table).cpu().tolist()  # the sync point: sampled ids back to the host
            for s, tok in zip(seqs, out, strict=True):
                s["tokens"].append(tok % 7)
                if len(s["tokens"]) > 64:
                    del s["tokens"][:32]

        rows.append(dict(op="step_overhead", name="minimal_loop", time_s=timer(step, host=True), m=n))
    return rows


def measured_spec(bench: Microbench, name: str) -> Any:
    """A GpuSpec from the measured peaks (best copy bandwidth, best GEMM FLOP/s) for a device that is not in
    the catalogue (or a CPU): efficiencies are then relative to what this device itself reached."""
    from sim.cost.hardware import GpuSpec

    s = bench.samples
    c = s[s.op == "copy"]
    bw = float((c.nbytes / c.time_s).max()) if len(c) else 1e11
    g = s[s.op == "gemm"]
    fl = float((2 * g.m * g.k * g.n / g.time_s).max()) if len(g) else 1e12
    return GpuSpec(name, 1 << 34, bw, fl, fl, None, None, "pcie", 0.0, bw / 10, arch="measured", confidence="low")
