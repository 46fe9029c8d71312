"""vLLM engine flags -> servesim config overrides: ``--vllm-args "--max-num-seqs 64 ..."`` or a whole
``vllm serve MODEL ...`` line.

``FLAGS`` is the table: each vLLM flag servesim models (names as in vLLM's ``EngineArgs``, the CLI spelling
being the field name in kebab case; ``--no-X`` for its BooleanOptionalAction switches) and the config key it
sets. Every other flag is named back as not modelled. A value that does not parse is a ConfigError naming the
flag; values that parse are checked by the config as any ``--set`` would be.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.core.errors import ConfigError
from sim.core.fields import (  # vLLM's spellings (plan and the run importers read them too)
    human_int,
    max_model_len,
)


def _is_number(text: str) -> bool:
    """A token argparse would read as a value, not a flag: a negative number (``-1``, ``-0.5``)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _int(flag: str, text: str) -> int:
    return human_int(text, f"--vllm-args {flag}")


def _max_len(flag: str, text: str) -> int:
    return max_model_len(text, f"--vllm-args {flag}")


def _float(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--vllm-args {flag} {text!r}: expected a number") from None


def _word(flag: str, text: str) -> str:
    if not text or text.startswith("-"):
        raise ConfigError(f"--vllm-args {flag}: expected a value, got {text!r}")
    return text


def _quantization(flag: str, text: str) -> str | None:
    """servesim's weight dtype for a ``--quantization`` method; None where the bits are in the checkpoint."""
    from sim.cost.modelspec import normalize_dtype
    from sim.cost.quantconfig import _4BIT_METHODS, _FP8_METHODS, QUANT_METHODS

    method = _word(flag, text).lower()
    if method not in QUANT_METHODS:  # servesim's dtype shorthands (int4, bf16) are the config's, not vLLM's flag
        raise ConfigError(f"--vllm-args {flag} {text!r}: not a vLLM quantization method (one of "
                          f"{', '.join(sorted(QUANT_METHODS))})")
    if method in _FP8_METHODS:
        return "fp8"
    if method in _4BIT_METHODS:
        return "int4"
    try:
        normalize_dtype(method)
    except ConfigError:
        return None
    return method  # awq, gptq, ...: model.dtype takes vLLM's method names


# vLLM's choices for --dtype (config/model.py ModelDType; "auto" is servesim's default already) and
# --kv-cache-dtype (config/cache.py CacheDType, vLLM 0.33)
MODEL_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
                "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
                "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head",
                "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")


def _choice(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    """A flag's value, one of vLLM's ``allowed`` choices (argparse's ``choices``: exact, case and all)."""

    def parse(flag: str, text: str) -> str:
        if text not in allowed:
            raise ConfigError(f"--vllm-args {flag} {text!r}: not one of vLLM's choices ({', '.join(allowed)})")
        return text

    return parse


def _kv_dtype(flag: str, text: str) -> str:
    """--kv-cache-dtype: one of vLLM's, and one servesim models (its bytes per element)."""
    value = _choice(CACHE_DTYPES)(flag, text)
    if not _modelled_kv(value):
        modelled = [d for d in CACHE_DTYPES if _modelled_kv(d)]
        raise ConfigError(f"--vllm-args {flag} {text!r}: a vLLM KV cache dtype servesim does not model; allowed: "
                          f"{', '.join(modelled)}")
    return value


def _modelled_kv(name: str) -> bool:
    from sim.cost.modelspec import kv_dtype_bytes

    try:
        kv_dtype_bytes(name)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class Flag:
    key: str  # the config key it sets ("section.key")
    parse: Callable[[str, str], Any] | None  # None: a switch (no value; --no-X gives False)
    note: str = ""


# vLLM EngineArgs flag -> servesim config key. Names checked against vllm/engine/arg_utils.py (EngineArgs
# fields; the CLI is each field in kebab case) and, for swap_space / preemption_mode, the V0 engine's flags.
FLAGS: dict[str, Flag] = {
    "--model": Flag("model.name", _word),
    "--dtype": Flag("model.dtype", _choice(MODEL_DTYPES)),
    "--quantization": Flag("model.dtype", _quantization),  # wins over --dtype: servesim's dtype is the weights'

    "--max-model-len": Flag("engine.max_model_len", _max_len),
    "--max-num-seqs": Flag("engine.max_num_seqs", _int),
    "--max-num-batched-tokens": Flag("engine.max_num_batched_tokens", _int),
    "--gpu-memory-utilization": Flag("engine.gpu_memory_utilization", _float),
    "--block-size": Flag("engine.block_size", _int),
    "--kv-cache-dtype": Flag("engine.kv_cache_dtype", _kv_dtype),
    "--num-gpu-blocks-override": Flag("engine.num_gpu_blocks_override", _int),
    "--enable-prefix-caching": Flag("engine.enable_prefix_caching", None),
    "--enable-chunked-prefill": Flag("engine.enable_chunked_prefill", None),
    "--async-scheduling": Flag("engine.async_scheduling", None),
    "--scheduling-policy": Flag("engine.scheduling_policy", _word),
    "--tensor-parallel-size": Flag("hardware.tensor_parallel_size", _int),
    "--long-prefill-token-threshold": Flag("engine.long_prefill_token_threshold", _int),
    "--watermark": Flag("engine.watermark", _float),  # V1's admission watermark (SchedulerConfig.watermark)
    "--preemption-mode": Flag("engine.preemption_mode", _word),
    "--swap-space": Flag("engine.swap_space", _float),
}
SHORT = {"-tp": "--tensor-parallel-size", "-q": "--quantization"}
# Keys only some presets model (their options classes): elsewhere the flag is named as not modelled.
PRESET_KEYS = {"engine.long_prefill_token_threshold", "engine.preemption_mode", "engine.swap_space", "engine.watermark"}
# vLLM's "let the engine decide" values: servesim's default already is that.
AUTO = {"--dtype": ("auto",), "--kv-cache-dtype": ("auto",)}


@dataclass
class Translation:
    """What a vLLM command line means to servesim: ``--set`` overrides, and the flags it leaves aside."""

    overrides: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # one line each: "--foo (not modelled)"
    model: str | None = None


_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}  # after a switch: a value it does not take


def _tokens(text: str) -> list[str]:
    try:
        toks = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--vllm-args {text!r}: cannot split it as a shell line ({exc})") from None
    if toks[:2] == ["vllm", "serve"]:
        return toks[2:]
    for i, t in enumerate(toks):  # python -m vllm.entrypoints.openai.api_server ...
        if t.startswith("vllm.entrypoints"):
            return toks[i + 1:]
    return toks


def _canonical(flag: str) -> str:
    """vLLM accepts ``--max_num_seqs`` for ``--max-num-seqs`` (its parser rewrites underscores)."""
    return SHORT.get(flag, flag if not flag.startswith("--") else "--" + flag[2:].replace("_", "-"))


def translate(text: str, accepted_keys: Sequence[str] = ()) -> Translation:
    """The overrides for ``text`` (a vLLM flag list or a ``vllm serve MODEL ...`` line). ``accepted_keys``:
    the preset-specific ``[engine]`` keys the run's preset models (PRESET_KEYS outside them are ignored)."""
    toks, out, i = _tokens(text), Translation(), 0
    quant: str | None = None
    positional = False  # the model came as vllm serve's positional argument
    given: dict[str, Any] = {}  # each flag's value so far
    while i < len(toks):
        tok = toks[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            prev = _canonical(toks[i - 2].partition("=")[0]) if i >= 2 else ""
            prev_spec = FLAGS.get("--" + prev[5:] if prev.startswith("--no-") else prev)
            if prev_spec is not None and prev_spec.parse is None and tok.lower() in _BOOL_WORDS:
                base = "--" + prev[5:] if prev.startswith("--no-") else prev
                raise ConfigError(f"--vllm-args {prev} {tok}: {prev} is a switch and takes no value "
                                  f"(use {base} or --no-{base[2:]})")  # fmt: skip
            if out.model is not None:
                raise ConfigError(f"--vllm-args: unexpected argument {tok!r} (the model is {out.model!r})")
            out.model, positional = tok, True
            out.overrides.append(f"model.name={json.dumps(tok)}")
            continue
        if not tok.startswith("--") and "=" not in tok:  # argparse reads -tp2 as -tp 2 (a short flag's value attached)
            short = next((f for f in sorted(SHORT, key=len, reverse=True) if tok.startswith(f) and tok[len(f):].isdigit()),
                         None)
            if short is not None:
                tok = f"{short}={tok[len(short):]}"
        flag, eq, inline = tok.partition("=")
        flag = _canonical(flag)
        negated = flag.startswith("--no-") and _canonical("--" + flag[5:]) in FLAGS
        spec = FLAGS.get("--" + flag[5:] if negated else flag)
        if spec is None:  # not modelled: skip its value too (the next token, unless it is a flag; -1 is a value)
            if not eq and i < len(toks) and (not toks[i].startswith("-") or _is_number(toks[i])):
                i += 1
            out.ignored.append(f"{flag} (not modelled)")
            continue
        if spec.parse is None:
            if eq:
                base = "--" + flag[5:] if negated else flag
                raise ConfigError(f"--vllm-args {tok}: {flag} is a switch and takes no value "
                                  f"(use {base} or --no-{base[2:]})")  # fmt: skip
            value: Any = not negated
        else:
            if negated:
                raise ConfigError(f"--vllm-args {flag}: not a switch; give {flag[5:]} a value")
            if not eq:
                if i >= len(toks):
                    raise ConfigError(f"--vllm-args {flag}: expects a value")
                inline, i = toks[i], i + 1
            if inline in AUTO.get(flag, ()):
                continue
            value = spec.parse(flag, inline)
            if value is None:
                out.ignored.append(f"{flag} {inline} (its bits come from the checkpoint's quantization_config; "
                                   "or set model.dtype)")  # fmt: skip
                continue
        name = flag if not negated else "--" + flag[5:]
        if name in given and given[name] != value:  # vLLM's argparse keeps the last: said, not dropped unsaid
            out.ignored.append(f"{name} {given[name]!r} (given again later: vLLM keeps the last, {value!r})")
        given[name] = value
        if spec.key in PRESET_KEYS and spec.key.split(".")[1] not in accepted_keys:
            out.ignored.append(f"{name} (not modelled by this preset)")
            continue
        if spec.key == "model.name":
            if positional:  # vLLM's serve refuses --model beside its positional model
                raise ConfigError(f"--vllm-args {name} {value}: a second model (the positional one is {out.model!r}); "
                                  "allowed: one model, as vllm serve's positional argument or --model")
            out.model = str(value)
        if flag == "--quantization":
            quant = value
        elif not (spec.key == "model.dtype" and quant is not None):
            out.overrides.append(f"{spec.key}={json.dumps(value)}")
    if quant is not None:  # --dtype names the activations in vLLM; the weights are the quantized ones
        out.overrides = [o for o in out.overrides if not o.startswith("model.dtype=")]
        out.overrides.append(f"model.dtype={json.dumps(quant)}")
    return out
