"""vLLM V1 rules (engines.md §1.2 and the conformance list in §6), checked on the policy alone."""

from __future__ import annotations

import pytest

from policies.base import make_policy
from sim.core.errors import UnknownNameError
from tests.helpers import limits, req, sched, step


def vllm(**kw):
    return make_policy("vllm", limits(**kw))


def test_running_first_then_waiting_and_budget():
    p = vllm(max_num_batched_tokens=100)
    a, b = req("a", 60, 5), req("b", 60, 5)
    p.add_request(a, 0)
    p.add_request(b, 0)
    plan = step(p)
    # a takes 60 of the budget, b gets the 40 left as a chunk (chunked prefill).
    assert sched(plan) == [("a", 60), ("b", 40)]
    plan = step(p)
    # running first in list order: a decodes (1), b finishes its prompt (20).
    assert sched(plan) == [("a", 1), ("b", 20)]
    assert [r.request_id for r in plan.sampled] == ["a", "b"]


def test_chunking_rule_5():
    """Budget 2048, 10 decodes running, new 5000-token prompt: chunks 2038, 2038, 924."""
    p = vllm(max_num_batched_tokens=2048, num_gpu_blocks=4000)
    for i in range(10):
        p.add_request(req(f"d{i}", 16, 100), 0)
    step(p)  # the ten prompts
    p.add_request(req("long", 5000, 10), 0)
    chunks = []
    for _ in range(3):
        plan = step(p)
        chunks.append(dict(sched(plan))["long"])
    assert chunks == [2038, 2038, 924]


def test_preemption_order_rule_1():
    """A, B, C admitted FCFS; when A cannot grow, C is preempted first, then B; waiting = [B, C]."""
    # 1 null block + 6 usable blocks of 4 tokens; each request's 8-token prompt needs 2 blocks.
    p = vllm(block_size=4, num_gpu_blocks=7, max_num_batched_tokens=64, enable_prefix_caching=False)
    a, b, c = req("A", 8, 12), req("B", 8, 12), req("C", 8, 12)
    for r in (a, b, c):
        p.add_request(r, 0)
    plan = step(p)
    assert sched(plan) == [("A", 8), ("B", 8), ("C", 8)]
    assert p.kv.num_free_blocks == 0
    # A's next decode needs a new block (9th token): C goes first.
    p.add_request(req("D", 4, 2), 0)  # a newcomer that must not be admitted in a preempting step
    plan = step(p)
    assert [r.request_id for r in plan.preempted] == ["C"]
    assert sched(plan) == [("A", 1), ("B", 1)]
    assert [r.request_id for r in p.waiting] == ["C", "D"]
    assert c.num_computed_tokens == 0 and c.num_preemptions == 1
    # B's block runs out next step? A holds 3 blocks, B 3 after growing: keep stepping until B goes.
    for _ in range(10):
        plan = step(p)
        if plan.preempted:
            break
    assert [r.request_id for r in plan.preempted] == ["B"]
    assert [r.request_id for r in p.waiting][:2] == ["B", "C"]
    assert not plan.admitted


def test_head_of_line_blocking_rule_2():
    p = vllm(block_size=16, num_gpu_blocks=11, enable_prefix_caching=False)  # 10 usable blocks
    p.add_request(req("big0", 100, 50), 0)  # 7 blocks
    step(p)
    p.add_request(req("big1", 100, 5), 0)  # needs 7 blocks, only 3 free
    p.add_request(req("small", 8, 5), 0)  # would fit, but sits behind the head
    plan = step(p)
    assert sched(plan) == [("big0", 1)]
    assert [r.request_id for r in p.waiting] == ["big1", "small"]


def test_full_sequence_gate_vs_chunk_only():
    """scheduler_reserve_full_isl: admission needs the whole prompt's blocks, not just the chunk's."""
    kw = dict(block_size=16, num_gpu_blocks=16, enable_prefix_caching=False, max_num_batched_tokens=32)
    gated = vllm(**kw)
    loose = vllm(scheduler_reserve_full_isl=False, **kw)
    admitted_b = {}
    for name, p in (("gated", gated), ("loose", loose)):
        p.add_request(req("a", 64, 50), 0)
        for _ in range(2):
            step(p)  # a prefilled: 4 blocks
        p.add_request(req("b", 170, 5), 0)  # 11 blocks; 10 free once a grows to 5
        plan = step(p)
        admitted_b[name] = any(r.request_id == "b" for r in plan.admitted)
    assert not admitted_b["gated"]
    assert admitted_b["loose"]


def test_no_chunking_stops_admission_at_a_prompt_over_the_budget():
    """vLLM 0.33 (the vllm-oracle) stops admitting at a prompt that exceeds the budget left; 0.11 skipped
    it and went on (engines.md V1-5). bench/vllm_diff.py found the difference."""
    p = vllm(enable_chunked_prefill=False, max_num_batched_tokens=100)
    p.add_request(req("x", 80, 5), 0)
    p.add_request(req("y", 50, 5), 0)  # does not fit the budget left (20): not chunked, admission stops
    p.add_request(req("z", 10, 5), 0)  # would fit, but waits behind y
    plan = step(p)
    assert sched(plan) == [("x", 80)]
    assert [r.request_id for r in p.waiting] == ["y", "z"]
    plan = step(p)
    assert sched(plan) == [("x", 1), ("y", 50), ("z", 10)]


def test_max_num_seqs_caps_running():
    p = vllm(max_num_seqs=2)
    for i in range(4):
        p.add_request(req(f"r{i}", 10, 5), 0)
    step(p)
    assert p.num_running == 2 and p.num_waiting == 2


def test_prefix_hit_on_repeat_prompt():
    p = vllm()
    toks = tuple(range(33))
    p.add_request(req("a", 33, 2, token_ids=toks), 0)
    step(p)
    p.add_request(req("b", 33, 2, token_ids=toks), 0)
    plan = step(p)
    # b reuses 32 tokens (2 full blocks) and computes 1.
    assert dict(sched(plan))["b"] == 1
    assert plan.admitted[0].num_cached_tokens == 32


def test_priority_victim_and_order():
    p = vllm(scheduling_policy="priority", block_size=4, num_gpu_blocks=7, enable_prefix_caching=False)
    lo = req("lo", 8, 12, t=0.0, priority=5)
    hi = req("hi", 8, 12, t=1.0, priority=0)
    mid = req("mid", 8, 12, t=2.0, priority=1)
    for r in (lo, hi, mid):
        p.add_request(r, 0)
    plan = step(p)
    assert [r.request_id for r in plan.admitted] == ["hi", "mid", "lo"]
    plan = step(p)
    # Pool full: the victim is the largest priority value, not the last admitted.
    assert [r.request_id for r in plan.preempted] == ["lo"]


def test_priority_self_preemption_goes_on_with_the_next_running_request():
    """vLLM 0.33: when the request that cannot grow is itself the lowest priority, it is preempted and the
    running loop continues; later (higher-priority) running requests are still scheduled this step."""
    p = vllm(scheduling_policy="priority", block_size=4, num_gpu_blocks=5, enable_prefix_caching=False)
    lo = req("lo", 7, 8, t=0.0, priority=5)
    hi = req("hi", 6, 8, t=1.0, priority=0)
    assert p.add_request(lo, 0) is None  # 15 tokens fit the 4 usable blocks alone
    step(p)  # lo: 2 of the 4 blocks
    assert p.add_request(hi, 1) is None
    plan = step(p)
    assert sched(plan) == [("lo", 1), ("hi", 6)] and p.kv.num_free_blocks == 0
    plan = step(p)  # lo needs a third block; it is the lowest priority, so it preempts itself
    assert [r.request_id for r in plan.preempted] == ["lo"]
    assert sched(plan) == [("hi", 1)]


def test_prefix_stats_count_admitted_lookups_only():
    """vLLM 0.33 records a prefix-cache lookup when the request is admitted, not each time it is looked up
    while blocked at the head of the queue (engines.md KV-8 describes 0.11)."""
    p = vllm(block_size=16, num_gpu_blocks=11)  # 10 usable blocks
    p.add_request(req("a", 100, 50), 0)  # 7 blocks
    step(p)
    p.add_request(req("b", 100, 5), 0)  # needs 7 blocks, 3 free: blocked
    for _ in range(3):
        assert not step(p).admitted
    stats = p.kv.prefix_cache_stats()
    assert stats["requests"] == 1 and stats["queries"] == 100


def test_finish_frees_blocks_and_counts_tokens():
    p = vllm()
    r = req("a", 20, 3)
    p.add_request(r, 0)
    for _ in range(3):
        step(p)
    assert r.num_output_tokens == 3 and r.finish_reason == "length"
    assert r.num_computed_tokens == 20 + 3 - 1  # the last sampled token is never computed
    assert p.kv.num_free_blocks == p.kv.usable_blocks
    assert not p.has_unfinished()


def test_rejects_prompt_over_max_model_len():
    p = vllm(max_model_len=100)
    reason = p.add_request(req("a", 150, 3), 0)
    assert reason is not None and "max_model_len" in reason


def test_unknown_policy_name():
    with pytest.raises(UnknownNameError, match="unknown policy 'nope'"):
        make_policy("nope", limits())


def test_watermark_knob_is_accepted_validated_and_passed():
    """``[engine] watermark`` (vLLM 0.33 kv_cache_manager; 0 = engines.md's V1 "no watermark") reaches
    the policy as held-back blocks (its effect: tests/test_vllm_async.py and the oracle fixtures)."""
    from sim.app.config import config_from_dict
    from sim.app.simulate import resolve
    from sim.core.errors import ConfigError

    lim = limits()
    assert make_policy("vllm", lim).watermark_blocks == 0
    assert make_policy("vllm", lim, {"watermark": 0.25}).watermark_blocks == int(0.25 * lim.num_gpu_blocks)
    setup = resolve(config_from_dict({"engine": {"preset": "vllm", "watermark": 0.05, "max_model_len": 2048}}))
    assert setup.options.watermark == 0.05
    assert setup.make_policy().watermark_blocks == int(0.05 * setup.limits.num_gpu_blocks)
    assert config_from_dict({"engine": {"watermark": 0}}).engine.options == {"watermark": 0.0}  # int -> float
    for bad in (1.0, -0.1, 2):
        with pytest.raises(ConfigError, match=r"\[engine\] watermark must be in \[0, 1\), got"):
            config_from_dict({"engine": {"preset": "vllm", "watermark": bad}})
