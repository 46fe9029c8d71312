"""The weight dtype a checkpoint's ``quantization_config`` (HF config.json) says, in servesim's names.

vLLM reads the method from the checkpoint (``--quantization`` may only agree with it) and keeps
``--dtype`` for the activations; servesim's ``model.dtype`` names the weights, so a quantized checkpoint
decides them: ``weight_dtype`` puts the two together. Methods and fields as the HF / vLLM configs spell
them (AutoAWQ ``bits`` / ``w_bit``, GPTQ ``bits``, bitsandbytes ``load_in_4bit``, compressed-tensors
``config_groups.*.weights.num_bits`` and ``type``, FP8 checkpoints ``quant_method = "fp8"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.core.errors import ConfigError
from sim.cost.modelspec import normalize_dtype

_INT_METHODS = ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin", "gptq_marlin_24", "exl2", "hqq", "aqlm")
_FP8_METHODS = ("fp8", "fbgemm_fp8", "ptpc_fp8", "fp_quant")
_4BIT_METHODS = ("mxfp4", "nvfp4", "bitnet")  # about half a byte per weight: priced as int4
KNOWN = (*_INT_METHODS, *_FP8_METHODS, *_4BIT_METHODS, "bitsandbytes", "compressed-tensors", "modelopt")
# vLLM's ``--quantization`` choices (QuantizationMethods in vllm/model_executor/layers/quantization/
# __init__.py), the union over 0.8-0.11 and main as of late 2025: names dropped since stay accepted, as a
# user may copy an older command line. A name outside these (and servesim's own dtypes) vLLM refuses too.
VLLM_METHODS = (
    "aqlm", "awq", "awq_marlin", "auto-round", "bitblas", "bitsandbytes", "compressed-tensors", "cpu_awq",
    "deepgemm_fp8", "deepspeedfp", "experts_int8", "fbgemm_fp8", "fp8", "fp_quant", "gguf", "gptq",
    "gptq_bitblas", "gptq_marlin", "gptq_marlin_24", "hqq", "inc", "ipex", "marlin", "modelopt",
    "modelopt_fp4", "modelopt_mixed", "moe_wna16", "mxfp4", "neuron_quant", "petit_nvfp4", "ptpc_fp8", "qqq",
    "quark", "rtn", "squeezellm", "torchao", "tpu_int8",
)
QUANT_METHODS = tuple(sorted({*VLLM_METHODS, *KNOWN}))  # what ``--quantization`` may name
FLOAT_DTYPES = ("bf16", "fp16", "fp32")


def _bits(value: Any, key: str, where: str) -> str:
    if isinstance(value, bool) or value not in (4, 8):
        raise ConfigError(f"{where}: quantization_config.{key}: expected 4 or 8 (bits per weight), got {value!r}")
    return "int4" if value == 4 else "int8"


def _compressed_tensors(qc: dict[str, Any], where: str) -> str:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}: quantization_config.config_groups: expected a table of groups, got {groups!r}")
    kinds = set()
    for name, g in groups.items():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise ConfigError(f"{where}: quantization_config.config_groups.{name}.weights: expected a table")
        if w.get("type", "int") == "float":
            if w.get("num_bits") != 8:
                raise ConfigError(f"{where}: quantization_config.config_groups.{name}.weights.num_bits: "
                                  f"float weights of {w.get('num_bits')!r} bits are not modelled (8 is)")
            kinds.add("fp8")
        else:
            kinds.add(_bits(w.get("num_bits"), f"config_groups.{name}.weights.num_bits", where))
    if len(kinds) > 1:
        raise ConfigError(f"{where}: quantization_config.config_groups mix {sorted(kinds)}: not modelled")
    return kinds.pop()


def checkpoint_dtype(qc: Any, path: Path | str) -> str | None:
    """The weight dtype of ``quantization_config`` (None when absent); a method servesim does not model,
    or bits it cannot price, is an error naming the field."""
    where = str(path)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError(f"{where}: quantization_config: expected a JSON object, got {qc!r}")
    method = str(qc.get("quant_method", "")).lower().replace("-", "_")
    if method in _INT_METHODS:
        return _bits(qc.get("bits", qc.get("w_bit", 4)), "bits", where)
    if method in _FP8_METHODS:
        return "fp8"
    if method in _4BIT_METHODS:
        return "int4"
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return "int4"
        if qc.get("load_in_8bit"):
            return "int8"
        raise ConfigError(f"{where}: quantization_config: bitsandbytes without load_in_4bit or load_in_8bit")
    if method == "compressed_tensors":
        return _compressed_tensors(qc, where)
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if algo.startswith("FP8"):
            return "fp8"
        if algo.startswith(("NVFP4", "W4A")):
            return "int4"
        raise ConfigError(f"{where}: quantization_config.quant_algo: {algo!r} is not modelled (FP8, NVFP4 are)")
    raise ConfigError(f"{where}: quantization_config.quant_method: {qc.get('quant_method')!r} is not modelled; "
                      f"known: {', '.join(KNOWN)}")


def weight_dtype(dtype: str, quantization: str | None) -> str:
    """The weights' dtype: the checkpoint's quantization when it has one (a float ``model.dtype`` is then
    the activations', as vLLM's ``--dtype``), else ``model.dtype``. A quantized ``model.dtype`` that
    disagrees with the checkpoint is an error, as vLLM's ``--quantization`` is."""
    if quantization is None:
        return dtype
    canon = normalize_dtype(dtype)
    if canon in FLOAT_DTYPES or canon == quantization:
        return quantization
    raise ConfigError(f"model.dtype: {dtype!r} disagrees with the checkpoint's quantization_config "
                      f"({quantization}); allowed: auto, bf16, fp16 or {quantization}")
