"""A checkpoint's quantization_config decides its weights' dtype (it used to be ignored)."""

from __future__ import annotations

import json

import pytest

from sim.app.memory import plan_memory
from sim.core.errors import ConfigError
from sim.cost.quantconfig import checkpoint_dtype, weight_dtype
from tests.test_bad_inputs import LLAMA


@pytest.mark.parametrize(("qc", "want"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "gptq", "bits": 8}, "int8"),
    ({"quant_method": "awq", "w_bit": 4}, "int4"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, "fp8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, "int4"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
    (None, None),
])  # fmt: skip
def test_methods(qc, want):
    assert checkpoint_dtype(qc, "config.json") == want


def test_dtype_rules():
    assert weight_dtype("auto", "int4") == "int4"  # a float dtype is the activations'
    assert weight_dtype("fp16", "int4") == "int4"
    assert weight_dtype("awq", "int4") == "int4"
    assert weight_dtype("bf16", None) == "bf16"
    with pytest.raises(ConfigError, match="disagrees"):
        weight_dtype("int8", "int4")


def test_an_awq_checkpoint_plans_quarter_size_weights(tmp_path):
    plain, awq = tmp_path / "plain", tmp_path / "awq"
    for d, extra in ((plain, {}), (awq, {"quantization_config": {"quant_method": "awq", "bits": 4}})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    p = plan_memory(str(plain / "config.json"), "H100 SXM")
    q = plan_memory(str(awq / "config.json"), "H100 SXM")
    assert q.dtype == "int4" and p.dtype == "bf16"
    assert 0.25 < q.weight_bytes / p.weight_bytes < 0.45  # 4-bit linears, 16-bit embeddings and head
    assert q.num_gpu_blocks > p.num_gpu_blocks
