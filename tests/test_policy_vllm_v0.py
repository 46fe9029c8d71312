"""vLLM V0 (0.6.3) rules, engines.md §1.5 V0-1 .. V0-9 and §6 item 6, on the policy alone."""

from __future__ import annotations

import pytest

from policies.base import StepPlan, make_policy
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.errors import ConfigError
from sim.core.request import Status
from tests.helpers import ids, limits, req, sched, step

GIB = 1024**3


def v0(options=None, **kw):
    base = dict(block_size=4, num_gpu_blocks=6, max_num_batched_tokens=256, max_model_len=256,
                enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    base.update(kw)
    opts = {"watermark": 0.0, "num_cpu_blocks": 100}
    opts.update(options or {})
    return make_policy("vllm-v0", limits(**base), opts)


def add(p, r, t=0.0):
    reason = p.add_request(r, t)
    assert reason is None, reason



# ---- defaults and memory (V0-1) ----------------------------------------------------------------------
def test_v0_defaults_and_cpu_blocks_from_swap_space():
    cfg = config_from_dict({"engine": {"preset": "vllm-v0", "max_model_len": 4096}})
    s = resolve(cfg)
    lim = s.limits
    assert (lim.block_size, lim.max_num_seqs, lim.enable_chunked_prefill, lim.enable_prefix_caching) == (
        16, 256, False, False)  # fmt: skip
    assert lim.max_num_batched_tokens == 4096  # max(max_model_len, 2048) without chunked prefill
    # V0-1: num_cpu_blocks = floor(swap_space_bytes / cache_block_size); 7B fp16: 16 x 128 KiB = 2 MiB
    assert s.memory.block_bytes == 16 * 131072
    assert s.options["num_cpu_blocks"] == 4 * GIB // s.memory.block_bytes == 2048
    assert s.options["watermark"] == 0.01 and s.options["preemption_mode"] is None
    half = resolve(
        config_from_dict({"engine": {"preset": "vllm-v0", "swap_space": 0.5, "max_model_len": 4096}})
    )
    assert half.options["num_cpu_blocks"] == 256


def test_v0_pool_has_no_null_block():
    p = v0(num_gpu_blocks=6)
    assert p.kv.usable_blocks == 6 and p.kv.usage == 0.0


def test_v0_chunked_prefill_turns_on_above_32k_context():
    base = {"model": {"name": "Llama-3.1-8B"}, "hardware": {"gpu": "H100 SXM"}}
    long = resolve(config_from_dict({**base, "engine": {"preset": "vllm-v0", "max_model_len": 40000}}))
    assert long.limits.enable_chunked_prefill and long.limits.max_num_batched_tokens == 512
    short = resolve(config_from_dict({**base, "engine": {"preset": "vllm-v0", "max_model_len": 32768}}))
    assert not short.limits.enable_chunked_prefill and short.limits.max_num_batched_tokens == 32768
    forced = resolve(config_from_dict({**base, "engine": {"preset": "vllm-v0", "max_model_len": 40000,
                                                          "enable_chunked_prefill": False}}))  # fmt: skip
    assert not forced.limits.enable_chunked_prefill


def test_bad_v0_knobs_are_config_errors():
    with pytest.raises(ConfigError, match="preemption_mode"):
        v0({"preemption_mode": "swapp"})
    with pytest.raises(ConfigError, match="watermark"):
        v0({"watermark": 1.5})
    with pytest.raises(ConfigError, match="unknown options"):
        v0({"n_ctx": 5})


# ---- V0-2 watermark ----------------------------------------------------------------------------------
def test_watermark_blocks_admission_but_not_decode_growth():
    # 20 blocks, watermark 0.1 -> 2 blocks kept free at admission.
    p = v0({"watermark": 0.1}, num_gpu_blocks=20)
    assert p.watermark_blocks == 2
    assert add(p, req("a", 64, 8), 0) is None  # 16 blocks
    step(p)
    assert add(p, req("b", 8, 5), 0) is None  # 2 blocks: 20 - 16 - 2 = 2 >= 2 -> OK
    assert add(p, req("c", 4, 5), 0) is None  # 1 block: 2 - 1 = 1 < 2 -> LATER
    plan = step(p)
    assert ids(plan.admitted) == ["b"] and ids(p.waiting) == ["c"]
    assert p.kv.num_free_blocks == 2
    # a (64 tokens) and b (8 tokens) both need a new block for their next token: decodes may take the
    # last free blocks, there is no watermark on growth.
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 1)] and not plan.preempted
    assert p.kv.num_free_blocks == 0


def test_request_that_can_never_fit_is_ignored():
    p = v0({"watermark": 0.2}, num_gpu_blocks=10)  # watermark 2 blocks
    add(p, req("big", 36, 2), 0)  # 9 blocks: total - 9 = 1 < 2 -> NEVER (FINISHED_IGNORED)
    add(p, req("ok", 8, 2), 0)
    plan = p.schedule(0.0)
    assert [(r.request_id, "ignored" in why) for r, why in plan.rejected] == [("big", True)]
    assert ids(plan.admitted) == ["ok"]


# ---- V0-3 default (non-chunked) step -----------------------------------------------------------------
def test_prefill_only_iteration():
    p = v0(num_gpu_blocks=40)
    add(p, req("a", 8, 10), 0)
    step(p)
    step(p)
    add(p, req("b", 8, 10), 0)
    plan = step(p)
    assert sched(plan) == [("b", 8)]  # a's decode waits for the prompt step
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 1)]


def test_budget_counts_running_sequences():
    p = v0(num_gpu_blocks=40, max_num_seqs=2)
    for r in ("a", "b", "c"):
        add(p, req(r, 8, 10), 0)
    plan = step(p)
    assert ids(plan.admitted) == ["a", "b"]
    plan = step(p)
    assert ids(plan.admitted) == [] and sched(plan) == [("a", 1), ("b", 1)]


# ---- V0-4 / V0-5 preemption ---------------------------------------------------------------------------
def test_recompute_victim_is_tail_and_goes_to_the_front():
    """§6 item 1 in V0 terms: C is preempted first, then B; waiting = [B, C, D]."""
    p = v0(num_gpu_blocks=6)
    a, b, c = req("A", 8, 12), req("B", 8, 12), req("C", 8, 12)
    for r in (a, b, c):
        add(p, r, 0)
    assert sched(step(p)) == [("A", 8), ("B", 8), ("C", 8)]
    add(p, req("D", 4, 2), 0)  # cannot fit (0 free): LATER
    plan = step(p)
    assert ids(plan.preempted) == ["C"] and sched(plan) == [("A", 1), ("B", 1)]
    assert ids(p.waiting) == ["C", "D"]
    assert c.status is Status.PREEMPTED and c.num_computed_tokens == 0 and c.num_preemptions == 1
    for _ in range(6):
        plan = step(p)
        if plan.preempted:
            break
    assert ids(plan.preempted) == ["B"] and ids(p.waiting)[:3] == ["B", "C", "D"]


def test_current_request_preempts_itself_when_it_is_last():
    p = v0(num_gpu_blocks=4)
    add(p, req("A", 3, 2), 0)  # 1 block, room for its next token
    add(p, req("B", 12, 2), 0)  # 3 blocks; its next token needs a 4th
    step(p)
    plan = step(p)
    assert ids(plan.preempted) == ["B"] and sched(plan) == [("A", 1)]


# ---- §6 item 6: swap -----------------------------------------------------------------------------------
def test_swap_victim_goes_to_swapped_and_blocks_prefills():
    p = v0({"preemption_mode": "swap"}, num_gpu_blocks=6)
    for r in ("A", "B", "C"):
        add(p, req(r, 8, 12), 0)
    step(p)
    plan = step(p)
    assert ids(plan.preempted) == ["C"] and ids(p.swapped) == ["C"]
    c = plan.preempted[0]
    assert c.status is Status.SWAPPED and c.num_computed_tokens == 8  # kept: no recompute
    assert plan.batch.swap_out_blocks == 2
    # V0-3.4: while something is swapped out, no prompt is admitted, even one that fits.
    add(p, req("tiny", 1, 1), 0)
    for _ in range(3):
        plan = step(p)
        assert "tiny" not in ids(plan.admitted)


def test_swap_in_keeps_kv_and_appends_to_running():
    p = v0({"preemption_mode": "swap"}, num_gpu_blocks=6)
    a, b, c = req("A", 8, 3), req("B", 8, 12), req("C", 8, 12)
    for r in (a, b, c):
        add(p, r, 0)
    step(p)
    step(p)  # C swapped out
    computed = c.num_computed_tokens
    for _ in range(5):
        plan = step(p)
        if plan.batch.swap_in_blocks:
            break
    assert plan.batch.swap_in_blocks == 2 and ("C", 1) in sched(plan)  # decodes in the swap-in step
    assert c.num_computed_tokens == computed + 1 and p.running[-1] is c  # appended; KV copied, not recomputed
    assert not p.swapped


def test_swap_in_respects_the_watermark():
    p = v0({"preemption_mode": "swap", "watermark": 0.2}, num_gpu_blocks=10)  # watermark 2 blocks
    x = req("x", 8, 20)
    add(p, x, 0)
    step(p)  # x holds 3 blocks for 9 tokens? no: 8 tokens -> 2 blocks
    plan = StepPlan()
    p.running.remove(x)
    p._swap_out = 0
    p._preempt(x, plan)
    assert ids(p.swapped) == ["x"]
    need = p.kv.num_swap_in_blocks(x)  # ceil((8 + 1) / 4) = 3
    filler = req("f", 4, 1)
    # leave free = need + 1 < need + watermark: LATER
    p.kv.allocate_slots(filler, 4 * (p.kv.num_free_blocks - need - 1))
    assert not p.schedule(1.0).batch.swap_in_blocks
    p.kv.free(filler)
    p.kv.allocate_slots(filler, 4 * (p.kv.num_free_blocks - need - 2))  # free = need + 2: OK
    plan = p.schedule(2.0)
    assert plan.batch.swap_in_blocks == 2 and not p.swapped


def test_too_few_cpu_blocks_kills_the_engine():
    from sim.kv.swap import SwapSpaceError

    p = v0({"preemption_mode": "swap", "num_cpu_blocks": 1}, num_gpu_blocks=6)
    for r in ("A", "B", "C"):
        add(p, req(r, 8, 12), 0)
    step(p)
    with pytest.raises(SwapSpaceError, match="swap_space"):
        step(p)


# ---- V0-7 chunked step ------------------------------------------------------------------------------
def test_chunked_step_runs_decodes_first_and_admits_in_a_preempting_step():
    p = v0(num_gpu_blocks=40, enable_chunked_prefill=True, max_num_batched_tokens=10)
    add(p, req("a", 6, 20), 0)
    step(p)
    add(p, req("b", 25, 5), 0)
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 9)]
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 9)]  # decodes keep priority over the prompt's next chunk


def test_chunked_v0_admits_in_a_step_that_preempted():
    """Unlike V1 (V1-4), V0's chunked step schedules new prompts even after a preemption."""
    p = v0(num_gpu_blocks=4, enable_chunked_prefill=True, max_num_batched_tokens=16)
    add(p, req("a", 3, 2), 0)  # 1 block
    add(p, req("b", 12, 4), 0)  # 3 blocks
    step(p)
    add(p, req("c", 1, 1), 0)
    plan = step(p)  # b needs a 4th block at token 13: b (the tail) preempts itself
    assert ids(plan.preempted) == ["b"]
    assert "c" in ids(plan.admitted)


def test_chunked_v0_allocates_the_whole_prompt_at_admission():
    p = v0(num_gpu_blocks=40, enable_chunked_prefill=True, max_num_batched_tokens=8)
    r = req("a", 30, 5)
    add(p, r, 0)
    step(p)
    assert r.num_computed_tokens == 8 and p.kv.num_blocks_held(r) == 8  # ceil(30 / 4)


# ---- V0-9 delay factor -----------------------------------------------------------------------------
def test_delay_factor_holds_prompts():
    p = v0({"scheduler_delay_factor": 0.5}, num_gpu_blocks=40)
    a = req("a", 8, 10, t=0.0)
    add(p, a, 0.0)
    step(p, 0.0)  # prompt step at t=0 (nothing running: passes)
    add(p, req("b", 8, 10, t=0.9), 0.9)
    plan = step(p, 1.0)  # last prompt latency 1.0; b waited 0.1 < 0.5
    assert sched(plan) == [("a", 1)]
    plan = step(p, 1.5)  # b waited 0.6 > 0.5
    assert ids(plan.admitted) == ["b"]
