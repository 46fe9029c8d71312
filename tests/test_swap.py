"""Swap preemption mechanics: the CPU pool, KVCacheManager.swap_out / swap_in, pricing, and whole runs
(engines.md §1.5 V0-1, V0-5, V0-6; §6 item 6)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.batch import BatchSummary
from sim.core.request import RequestSpec, Status
from sim.cost.costmodel import ConstantCostModel, make_cost_model
from sim.cost.hardware import get_gpu
from sim.cost.models import get_model
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder
from sim.engine.sources import OpenSource
from sim.kv import KVCacheManager
from sim.kv.swap import CpuBlockPool, SwapSpaceError
from tests.helpers import limits, req


def _kv(gpu=11, cpu=8, bs=4, caching=False):
    return KVCacheManager(num_gpu_blocks=gpu, block_size=bs, enable_caching=caching, max_model_len=1000,
                          num_cpu_blocks=cpu)  # fmt: skip


def test_cpu_pool_counts():
    pool = CpuBlockPool(5)
    pool.put("a", 3)
    assert pool.num_free_blocks == 2 and pool.holds("a")
    with pytest.raises(ValueError):
        pool.put("b", 3)
    assert pool.take("a") == 3 and pool.num_free_blocks == 5
    assert pool.stats()["blocks_swapped_out"] == 3 and pool.stats()["num_swap_ins"] == 1


def test_swap_out_frees_gpu_and_swap_in_restores():
    kv = _kv()
    r = req("a", 10, 5)
    kv.allocate_slots(r, 10)
    r.num_computed_tokens = 10
    held = kv.num_blocks_held(r)
    assert held == 3
    assert kv.swap_out(r) == 3
    assert kv.num_free_blocks == kv.usable_blocks and kv.is_swapped(r) and not kv.holds(r)
    assert kv.cpu.num_used_blocks == 3
    # computed tokens stay: the swap-in needs blocks for them plus the next token's slot
    r.num_output_tokens, r.num_tokens = 1, 11
    assert kv.num_swap_in_blocks(r) == 3
    assert kv.swap_in(r) == 3
    assert kv.num_blocks_held(r) == 3 and kv.cpu.num_used_blocks == 0
    kv.check_invariants()


def test_swap_in_refuses_without_room_and_changes_nothing():
    kv = _kv(gpu=5)  # 4 usable blocks
    a, b = req("a", 12, 5), req("b", 4, 5)
    kv.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    kv.swap_out(a)
    kv.allocate_slots(b, 4 * 2)  # b takes 2 of the 4 blocks; a needs ceil(13/4) = 4
    assert kv.swap_in(a) is None
    assert kv.is_swapped(a) and kv.num_free_blocks == 2


def test_swap_out_without_cpu_room_raises():
    kv = _kv(cpu=2)
    r = req("a", 12, 5)
    kv.allocate_slots(r, 12)
    with pytest.raises(SwapSpaceError, match="lack of CPU swap space"):
        kv.swap_out(r)
    assert kv.holds(r) and kv.num_blocks_held(r) == 3  # nothing changed


def test_swap_blocks_are_priced_over_the_host_link():
    cm = make_cost_model("roofline", model=get_model("Mistral-7B"), gpu=get_gpu("RTX 4090"), block_size=16)
    base = BatchSummary(decode_ctx=np.full(4, 100), num_logits=4)
    swapped = BatchSummary(decode_ctx=np.full(4, 100), num_logits=4, swap_out_blocks=50)
    extra = cm.step_time(swapped) - cm.step_time(base)
    # 50 blocks x 16 tokens x 128 KiB/token over ~PCIe 4 x16: milliseconds, not zero, not seconds
    assert 1e-3 < extra < 0.5


def test_resolve_prices_swap_with_the_engine_block_size():
    def swap_cost(bs):
        cfg = config_from_dict({"engine": {"preset": "vllm-v0", "block_size": bs, "max_model_len": 2048}})
        cm = resolve(cfg).cost_model
        return cm.breakdown(BatchSummary(swap_in_blocks=10))["swap"]

    assert swap_cost(32) == pytest.approx(2 * swap_cost(16), rel=1e-6)


def _run(specs, options, **lim):
    env = simpy.Environment()
    pol = make_policy("vllm-v0", limits(**lim), options)
    rec = Recorder(trace=True)
    eng = Engine(env, pol, ConstantCostModel(step_s=1.0), OpenSource(specs), rec)
    env.run()
    return eng, rec


def _pressure_specs(n=12):
    rng = np.random.default_rng(3)
    return [RequestSpec(request_id=f"r{i}", arrival_time=float(i) * 0.5, prompt_len=int(rng.integers(8, 40)),
                        output_len=int(rng.integers(20, 60))) for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_swap_and_recompute_runs_finish_everything(mode):
    lim = dict(block_size=4, num_gpu_blocks=41, max_num_batched_tokens=256, max_model_len=256,
               enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    eng, rec = _run(
        _pressure_specs(), {"preemption_mode": mode, "num_cpu_blocks": 200, "watermark": 0.0}, **lim
    )
    assert all(r.status is Status.FINISHED and r.num_output_tokens == r.output_len for r in eng.requests)
    steps = rec.steps_frame()
    assert steps["num_preempted"].sum() > 0  # the pool is small enough to force preemption
    kv = eng.policy.kv
    assert kv.num_free_blocks == kv.usable_blocks and kv.cpu.num_used_blocks == 0
    stats = kv.swap_stats()
    if mode == "swap":
        assert stats["num_swap_outs"] == stats["num_swap_ins"] > 0
        assert stats["blocks_swapped_out"] == stats["blocks_swapped_in"]
        assert sum(r.num_discarded_tokens for r in eng.requests) == 0  # swap never recomputes
        assert sum(r.num_swaps for r in eng.requests) == stats["num_swap_outs"]
    else:
        assert stats["num_swap_outs"] == 0
        assert sum(r.num_discarded_tokens for r in eng.requests) > 0


def test_swap_run_aborts_when_cpu_pool_is_too_small():
    """engines.md §6 item 6: too few CPU blocks -> the engine stops with an error."""
    lim = dict(block_size=4, num_gpu_blocks=41, max_num_batched_tokens=256, max_model_len=256,
               enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    with pytest.raises(SwapSpaceError):
        _run(_pressure_specs(), {"preemption_mode": "swap", "num_cpu_blocks": 1, "watermark": 0.0}, **lim)


def test_simulate_reports_swaps_in_meta():
    from sim.app.simulate import simulate

    cfg = config_from_dict({
        "engine": {"preset": "vllm-v0", "preemption_mode": "swap", "num_gpu_blocks_override": 120,
                   "max_model_len": 1024, "cost_model": "constant"},
        "workload": {"num_requests": 30, "rate": 50.0, "prompt": {"dist": "fixed", "value": 200},
                     "output": {"dist": "fixed", "value": 200}},
    })  # fmt: skip
    res = simulate(cfg)
    swap = res.meta["swap"]
    assert swap["num_swap_outs"] > 0 and swap["num_swap_outs"] == swap["num_swap_ins"]
    assert (res.requests["status"] == "finished").all()
    from sim.app.results import summarize
    from sim.app.simulate import format_summary

    s = summarize(res)
    assert s["num_swap_outs"] == swap["num_swap_outs"] and s["num_swap_ins"] == swap["num_swap_ins"]
    assert s["num_preemptions"] >= s["num_swap_outs"]
    assert f"swap-outs {s['num_swap_outs']}" in format_summary(s, res)


def test_step_rows_show_swapped_blocks():
    lim = dict(block_size=4, num_gpu_blocks=41, max_num_batched_tokens=256, max_model_len=256,
               enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    eng, rec = _run(
        _pressure_specs(), {"preemption_mode": "swap", "num_cpu_blocks": 200, "watermark": 0.0}, **lim
    )
    steps = rec.steps_frame()
    stats = eng.policy.kv.swap_stats()
    assert steps["num_swap_out_blocks"].sum() == stats["blocks_swapped_out"] > 0
    assert steps["num_swap_in_blocks"].sum() == stats["blocks_swapped_in"]
    resident = (steps["num_swap_out_blocks"] - steps["num_swap_in_blocks"]).cumsum()
    assert (steps["num_swapped_blocks"] == resident).all() and steps["num_swapped_blocks"].max() > 0
    assert steps["num_swapped_blocks"].iloc[-1] == 0


def test_cli_reports_exhausted_swap_space(tmp_path, capsys):
    from sim.cli.main import main

    cfg = tmp_path / "swap.toml"
    cfg.write_text(
        '[engine]\npreset = "vllm-v0"\npreemption_mode = "swap"\nswap_space = 0.001\n'
        'num_gpu_blocks_override = 120\nmax_model_len = 1024\ncost_model = "constant"\n'
        '[workload]\nnum_requests = 30\nrate = 50.0\nprompt = {dist = "fixed", value = 200}\n'
        'output = {dist = "fixed", value = 200}\n'
    )
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "lack of CPU swap space" in err and "swap_space" in err
