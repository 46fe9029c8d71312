"""GPU catalogue: facts vs gpus.csv, aliases, TP validation, ring all-reduce."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from sim.core.errors import ConfigError, UnknownNameError
from sim.cost.hardware import GiB, GpuSpec, allreduce_time, get_gpu, list_gpus, validate_tp
from sim.cost.models import get_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
META = SHARED / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19" / "meta.json"

CSV_NAME = {"Ascend 910B": "Ascend 910B (910B2)", "B200": "B200 (HGX)"}


def test_required_gpus_present() -> None:
    names = set(list_gpus())
    for n in (
        "T4",
        "RTX 3090",
        "RTX 4090",
        "A10",
        "L4",
        "L40S",
        "A100 40GB PCIe",
        "A100 40GB SXM",
        "A100 80GB PCIe",
        "A100 80GB SXM",
        "H100 PCIe",
        "H100 SXM",
        "H200 SXM",
        "B200",
        "MI300X",
        "Ascend 910B",
        "RTX PRO 6000 Blackwell",
        "24GB",
    ):
        assert n in names


@pytest.mark.parametrize(
    "alias,name",
    [
        ("h100", "H100 SXM"),
        ("H100-SXM", "H100 SXM"),
        ("h100 pcie", "H100 PCIe"),
        ("a100-80gb", "A100 80GB SXM"),
        ("A100_40GB", "A100 40GB SXM"),
        ("a100-80gb-pcie", "A100 80GB PCIe"),
        ("4090", "RTX 4090"),
        ("rtx4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("a10", "A10"),
        ("l40s", "L40S"),
        ("mi300x", "MI300X"),
        ("910b", "Ascend 910B"),
        ("rtx-pro-6000", "RTX PRO 6000 Blackwell"),
        ("24gb", "24GB"),
        ("h200", "H200 SXM"),
    ],
)
def test_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name


def test_unknown_gpu() -> None:
    with pytest.raises(UnknownNameError, match="did you mean.*H100"):
        get_gpu("h1000")


def test_rtx4090_memory_is_the_driver_value() -> None:
    assert get_gpu("4090").memory_bytes == 25_250_627_584
    if META.exists():
        meta = json.loads(META.read_text())
        assert (
            get_gpu(meta["hardware"]["device_name"]).memory_bytes
            == meta["hardware"]["device_total_memory_bytes"]
        )


def test_seeds_card() -> None:
    g = get_gpu("24GB")
    assert g.memory_bytes == int(22.5 * GiB)
    assert g.mem_bandwidth == get_gpu("4090").mem_bandwidth


def test_geforce_uses_fp32_accumulate_peak() -> None:
    assert get_gpu("4090").bf16_flops == pytest.approx(165.2e12)  # not 330.3 (costmodel.md §3)
    assert get_gpu("3090").fp16_flops == pytest.approx(71e12)
    assert not get_gpu("t4").supports_bf16
    assert get_gpu("A100 80GB SXM").fp8_flops is None


def test_against_shared_csv() -> None:
    path = SHARED / "data" / "reference" / "gpus.csv"
    if not path.exists():
        pytest.skip("shared data absent")
    rows = {r["gpu"]: r for r in csv.DictReader(path.open())}
    checked = 0
    for name in list_gpus():
        row = rows.get(CSV_NAME.get(name, name))
        if row is None:
            continue
        g = get_gpu(name)
        assert g.mem_bandwidth == pytest.approx(float(row["mem_bw_GBps"]) * 1e9), name
        assert g.fp16_flops == pytest.approx(float(row["fp16_dense_TFLOPS"]) * 1e12), name
        if row["bf16_dense_TFLOPS"]:
            assert g.bf16_flops == pytest.approx(float(row["bf16_dense_TFLOPS"]) * 1e12), name
        if row["int8_dense_TOPS"]:
            assert g.int8_ops == pytest.approx(float(row["int8_dense_TOPS"]) * 1e12), name
        fp8 = row["fp8_dense_TFLOPS"].split(" ")[0]
        assert (g.fp8_flops is None) == (fp8 == ""), name
        if fp8:
            assert g.fp8_flops == pytest.approx(float(fp8) * 1e12), name
        if name != "RTX 4090":
            assert g.memory_bytes == pytest.approx(float(row["mem_GiB_usable_approx"]) * GiB, abs=1), name
        checked += 1
    assert checked == 16


def test_validate_tp() -> None:
    h100 = get_gpu("h100")
    validate_tp(h100, 1)
    validate_tp(h100, 8, get_model("Llama-3.1-70B"))
    # 32 heads, 4 KV heads at TP=8: KV heads are replicated (vLLM allows tp > nkv when nkv divides tp).
    validate_tp(h100, 8, dataclasses.replace(get_model("Qwen2.5-7B"), num_attention_heads=32))
    with pytest.raises(ConfigError, match="num_key_value_heads 3"):
        validate_tp(h100, 2, dataclasses.replace(get_model("Qwen2.5-7B"), num_key_value_heads=3))
    for bad in (0, -1, 16, 2.0, True):
        with pytest.raises(ConfigError, match="tensor_parallel_size"):
            validate_tp(h100, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_attention_heads 28"):
        validate_tp(h100, 8, get_model("Qwen2.5-7B"))  # 28 heads


def test_allreduce_zero_at_tp1_and_monotonic() -> None:
    h100 = get_gpu("h100")
    assert allreduce_time(1e9, 1, h100) == 0.0
    sizes = [0, 1e3, 1e5, 1e6, 1e7, 1e8]
    times = [allreduce_time(b, 2, h100) for b in sizes]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    assert times[0] > 0  # the latency floor
    # Ring traffic 2(tp-1)/tp × bytes over the per-direction link: 8 GPUs move 1.75× the bytes.
    big = 1e9
    t2 = allreduce_time(big, 2, h100, latency_s=0.0)
    t8 = allreduce_time(big, 8, h100, latency_s=0.0)
    assert t2 == pytest.approx(big / h100.interconnect_bandwidth)
    assert t8 / t2 == pytest.approx(1.75)


def test_allreduce_link_choice() -> None:
    pcie_card = get_gpu("4090")
    nvl = get_gpu("A100 80GB SXM")
    bridge = get_gpu("A100 80GB PCIe")
    b = 64e6
    assert allreduce_time(b, 2, pcie_card) > allreduce_time(b, 2, nvl)
    # An NVLink bridge joins 2 GPUs; at TP=4 traffic falls back to PCIe.
    assert bridge.link_bandwidth(2) == bridge.interconnect_bandwidth
    assert bridge.link_bandwidth(4) == bridge.host_bandwidth
    assert allreduce_time(b, 4, bridge) > allreduce_time(b, 4, nvl)
    with pytest.raises(ConfigError):
        allreduce_time(b, 0, nvl)


def test_gpuspec_original_constructor_still_valid() -> None:
    g = GpuSpec("x", 10, 1e9, 1e12, 1e12, None, None, "pcie", 1e9, 1e9)
    assert g.link_bandwidth(2) == 1e9 and g.max_link_gpus == 1
