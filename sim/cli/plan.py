"""`servesim plan`: how many KV blocks and concurrent requests a model gets on a GPU (vLLM's arithmetic).

With no --model and no --gpu (or with --seeds-example) it prints the seeds' worked example; options given
on top of --seeds-example change that example (e.g. `--kv-cache-dtype fp8` -> 22 requests of 4K).
With --preset NAME the plan follows that engine's own start-up rule and defaults (TensorRT-LLM, TGI,
llama.cpp, ...: docs/memory_reservations.md), as `servesim run` resolves it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sim.app.config import BLOCK_SIZES
from sim.app.memory import SEEDS_EXAMPLE, GiB, format_seeds_variants, plan_memory
from sim.core.errors import ConfigError
from sim.core.fields import check_range

# argparse dest -> plan_memory keyword, for options that map one-to-one.
_PASSTHROUGH = (
    "dtype",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "tensor_parallel_size",
    "num_gpu_blocks_override",
)


def add_parser(subparsers: Any) -> None:
    """Register the "plan" subcommand on an argparse subparsers object."""
    p = subparsers.add_parser(
        "plan",
        help="plan GPU memory: weights, activation, KV blocks, concurrency (vLLM semantics)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help="catalogue name (e.g. llama-3.1-8b) or path to a HF config.json")
    p.add_argument("--gpu", help="catalogue GPU (e.g. 4090, h100, a100-80gb)")
    p.add_argument("--dtype", help="weight dtype: auto (bf16), float16, bfloat16, fp8, int8, awq, gptq, int4")
    p.add_argument("--kv-cache-dtype", help="auto (= model dtype), fp8, fp8_e4m3, fp8_e5m2")
    p.add_argument("--gpu-memory-utilization", type=float, help="fraction of total GPU memory (default 0.9)")
    p.add_argument("--block-size", type=int, help="tokens per KV block (default 16)")
    p.add_argument("--max-model-len",
                   help="default: the model's max_position_embeddings; as vLLM reads it: 4096, 32k, 1K, or -1 / "
                        "auto: the longest that fits")
    p.add_argument(
        "--max-num-batched-tokens", type=int,
        help="token budget of the profile run (default: vLLM's for the card, 2048; 8192 from 70 GiB, A100 aside)"
    )
    p.add_argument("--max-num-seqs", type=int,
                   help="sequence budget of the profile run (default: vLLM's for the card, 256; 1024 from 70 GiB)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, help="GPUs per replica (default 1)")
    p.add_argument("--num-gpu-blocks-override", type=int, help="use this many KV blocks instead")
    p.add_argument(
        "--overhead-gib", type=float, help="activation peak + non-torch memory in GiB, replacing the estimate"
    )
    p.add_argument("--usable-gib", type=float, help="GPU memory in GiB, replacing the catalogue capacity")
    p.add_argument(
        "--context-length",
        type=int,
        action="append",
        dest="context_lengths",
        help="context length for the concurrency table (repeatable)",
    )
    p.add_argument("--preset", help="plan as this engine preset sizes its KV cache (default: vLLM's rule)")
    p.add_argument("--seeds-example", action="store_true", help="the seeds' worked example (24 GB card, 7B)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {k: getattr(args, k) for k in _PASSTHROUGH if getattr(args, k, None) is not None}
    if isinstance(kw.get("max_model_len"), str):  # vLLM's spellings, as --vllm-args reads them
        from sim.core.fields import max_model_len

        kw["max_model_len"] = max_model_len(kw["max_model_len"], "--max-model-len")
    if kw.get("block_size") is not None and kw["block_size"] not in BLOCK_SIZES:
        raise ConfigError(f"--block-size: not a supported block size, got {kw['block_size']}; allowed "
                          f"{', '.join(map(str, BLOCK_SIZES))} (vLLM's choices)")
    for flag, key in (("--max-num-batched-tokens", "max_num_batched_tokens"), ("--max-num-seqs", "max_num_seqs")):
        check_range("", flag, kw.get(key), None, 2**31 - 1)  # `run`'s bound on [engine] (sim/app/config.py); >= 1: the plan's
    if kw.get("max_model_len") == -1:  # vLLM's auto: the longest one request can hold
        del kw["max_model_len"]
        kw["fit_max_model_len"] = True
    elif kw.get("max_model_len") is not None:  # as `run` bounds [engine] max_model_len: a prompt and an output token
        v = kw["max_model_len"]
        if not 2 <= v <= 2**31 - 1:
            raise ConfigError(f"--max-model-len: out of range, got {v}; allowed 2 <= value <= 2147483647, or -1 / "
                              "auto (the longest that fits, vLLM's auto)")
    if kw.get("num_gpu_blocks_override") is not None:  # as `run` takes engine.num_gpu_blocks_override
        check_range("", "--num-gpu-blocks-override", kw["num_gpu_blocks_override"], 1, None)
    if getattr(args, "overhead_gib", None) is not None:
        check_range("", "--overhead-gib", args.overhead_gib, 0, 1024, unit="GiB")
        kw["activation_bytes"] = int(round(args.overhead_gib * GiB))
        kw["non_torch_bytes"] = 0
    if getattr(args, "usable_gib", None) is not None:
        check_range("", "--usable-gib", args.usable_gib, 1 / 1024, 100_000, unit="GiB")  # at least 1 MiB
        kw["usable_memory_bytes"] = int(round(args.usable_gib * GiB))
    if getattr(args, "context_lengths", None):
        twice = sorted({c for c in args.context_lengths if args.context_lengths.count(c) > 1})
        if twice:  # the row would be printed twice
            raise ConfigError(f"--context-length {twice[0]}: given twice; allowed: distinct context lengths")
        kw["context_lengths"] = tuple(args.context_lengths)
    return kw


def _preset_plan(preset: str, args: argparse.Namespace, kw: dict[str, Any]) -> Any:
    """The plan `servesim run` would make for this preset (sim/app/simulate.py resolve)."""
    from sim.app.config import config_from_dict
    from sim.app.simulate import resolve

    for flag, key in (("--usable-gib", "usable_memory_bytes"), ("--context-length", "context_lengths")):
        if key in kw:
            raise ConfigError(f"plan: {flag} does not combine with --preset (it plans the catalogue card)")
    engine: dict[str, Any] = {"policy": preset}
    engine.update({k: kw[k] for k in _PASSTHROUGH if k in kw and k not in ("dtype", "tensor_parallel_size")})
    if kw.get("fit_max_model_len"):  # --max-model-len -1
        engine["max_model_len"] = -1
    if getattr(args, "overhead_gib", None) is not None:
        engine["overhead_gib"] = float(args.overhead_gib)
    raw = {"model": {"name": kw["model"], **({"dtype": kw["dtype"]} if "dtype" in kw else {})},
           "hardware": {"gpu": kw["gpu"], "tensor_parallel_size": kw.get("tensor_parallel_size", 1)},
           "engine": engine}
    try:
        return resolve(config_from_dict(raw)).memory
    except ConfigError as e:  # the preset is [engine] policy there: name the flag it came from
        msg = str(e)
        if msg.startswith("[engine] policy: "):
            raise ConfigError(f"--preset {preset!r}: {msg.removeprefix('[engine] policy: ')}") from None
        raise


def _batch_defaults(kw: dict[str, Any]) -> None:
    """Fill in vLLM's max_num_seqs / max_num_batched_tokens for the card where the flags leave them out."""
    from policies.vllm_options import VllmOptions
    from sim.cost.hardware import get_gpu
    from sim.cost.models import get_model

    keys = ("max_num_seqs", "max_num_batched_tokens")
    explicit = {k: kw.get(k) for k in keys}
    max_len = kw.get("max_model_len") or get_model(kw["model"]).max_position_embeddings
    picked = VllmOptions.batch_limits(get_gpu(kw["gpu"]), explicit, True, max_len)
    for k, v in zip(keys, picked, strict=True):
        if kw.get(k) is None:  # a given value stays, to be checked by the plan (0 is refused there)
            kw[k] = v
    if kw["max_num_seqs"] >= 1 and kw["max_num_batched_tokens"] >= 1 and kw["max_num_batched_tokens"] < kw["max_num_seqs"]:
        raise ConfigError(f"plan: --max-num-batched-tokens {kw['max_num_batched_tokens']} must be >= --max-num-seqs "
                          f"{kw['max_num_seqs']}, as vLLM requires (a step must fit a token per running sequence)")


def run(args: argparse.Namespace) -> int:
    """Print the plan (text or JSON); ServesimError propagates for the main CLI to report."""
    from sim.cli.flags import check_not_empty

    check_not_empty(args, {"model": "a catalogue model name or a config.json path", "gpu": "a catalogue GPU name",
                           "dtype": "a weight dtype (e.g. auto, fp16, fp8)", "kv_cache_dtype": "auto or fp8",
                           "preset": "an engine preset (e.g. vllm, tgi)"})  # fmt: skip
    model, gpu = getattr(args, "model", None), getattr(args, "gpu", None)
    seeds = bool(getattr(args, "seeds_example", False)) or (model is None and gpu is None)
    overrides = _kwargs(args)
    if seeds:
        kw = {**SEEDS_EXAMPLE, **overrides}
        if overrides.get("fit_max_model_len"):  # --max-model-len -1 replaces the example's length
            kw.pop("max_model_len", None)
        if model is not None:
            kw["model"] = model
        if gpu is not None:  # that card's memory, not the example's 22.5 GiB (unless --usable-gib says)
            kw["gpu"] = gpu
            if "usable_memory_bytes" not in overrides:
                kw.pop("usable_memory_bytes", None)
        untouched = kw == SEEDS_EXAMPLE
    else:
        if model is None or gpu is None:
            missing = "--gpu" if gpu is None else "--model"
            raise ConfigError(
                f"plan: {missing} is required when the other of --model/--gpu is given "
                "(or use --seeds-example)"
            )
        kw = {"model": model, "gpu": gpu, **overrides}
        untouched = False
    preset = getattr(args, "preset", None)
    if preset is not None and seeds:
        raise ConfigError("plan: --preset needs --model and --gpu (the seeds' example is vLLM's arithmetic)")
    if preset is not None:
        plan = _preset_plan(preset, args, kw)
    else:
        if not seeds:  # the batch limits `run` gives the vllm preset on this card (VllmOptions.batch_limits)
            _batch_defaults(kw)
        plan = plan_memory(kw.pop("model"), kw.pop("gpu"), **kw)
    if getattr(args, "json", False):
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    if seeds:
        print("The seeds' worked example (a 24 GB card with 22.5 GiB usable, a 7B model, 1.5 GiB overhead):"
              if untouched else "The seeds' worked example, changed by the options given:")
    print(plan.format())
    if seeds and untouched:
        print()
        print(format_seeds_variants())
    return 0
