"""llama.cpp server slots (engines.md §3.1 LC-1 .. LC-7, §6 item 8) and Ollama (§3.2 OL-1 .. OL-7, §6 item 9)."""

from __future__ import annotations

import pytest

from policies.base import make_policy
from policies.llamacpp import LC_OPTIONS, TOO_LONG
from policies.ollama import BUSY, OL_OPTIONS
from policies.slots import common_prefix
from sim.app.config import config_from_dict
from sim.app.simulate import resolve
from sim.core.request import Status
from tests.helpers import ids, limits, req, sched, step


def lcpp(n_parallel=4, n_batch=2048, **opts):
    return make_policy("llamacpp", limits(max_num_seqs=n_parallel, max_num_batched_tokens=n_batch,
                                          max_model_len=100_000), {**LC_OPTIONS, **opts})  # fmt: skip


def ollama(num_parallel=2, num_batch=512, **opts):
    return make_policy("ollama", limits(max_num_seqs=num_parallel, max_num_batched_tokens=num_batch,
                                        max_model_len=100_000), {**OL_OPTIONS, **opts})  # fmt: skip


def sys_req(rid, sys_len, own, out, group=0):
    segs = ((("sys", group), sys_len), (("u", rid), own))
    return req(rid, sys_len + own, out, segments=segs)


def run(p, t0=0.0, limit=10_000):
    plans = []
    for i in range(limit):
        if not p.has_unfinished():
            break
        plans.append(step(p, t0 + i))
    return plans



# ---- common prefix from content descriptions ---------------------------------------------------------
def test_common_prefix_over_segments_tokens_and_outputs():
    a, b = sys_req("a", 100, 20, 5), sys_req("b", 100, 30, 5)
    assert common_prefix(a, 120, b, 130) == 100
    assert common_prefix(a, 50, b, 130) == 50
    t1 = req("t1", 6, 2, token_ids=(1, 2, 3, 4, 5, 6))
    t2 = req("t2", 5, 2, token_ids=(1, 2, 3, 9, 9))
    assert common_prefix(t1, 6, t2, 5) == 3
    # a follow-up turn that repeats the previous prompt and its output (output_key) matches both
    turn1 = req("u1", 10, 4, segments=((("s", 1), 10),), output_key=("o", "u1"))
    turn2 = req("u2", 20, 4, segments=((("s", 1), 10), (("o", "u1"), 4), (("m", 2), 6)))
    assert common_prefix(turn1, 13, turn2, 20) == 13
    assert common_prefix(req("x", 10, 1), 10, req("y", 10, 1), 10) == 0


# ---- llama.cpp --------------------------------------------------------------------------------------
def test_slots_split_n_ctx():
    """LC-1 / §6 item 8: -c 8192 -np 4 gives four slots of 2048 tokens."""
    p = lcpp(n_parallel=4, n_ctx=8192)
    assert len(p.slots) == 4 and p.n_ctx_slot == 2048 and p.kv.usable_blocks == 8192


def test_fifth_request_is_deferred_fifo():
    """LC-2: with every slot busy a request waits (unbounded FIFO, no error) and starts when one frees."""
    p = lcpp(n_parallel=4, n_ctx=8192)
    rs = [req(f"r{i}", 10, 3 if i == 0 else 50) for i in range(6)]
    for r in rs:
        assert p.add_request(r, 0.0) is None
    step(p)
    assert p.num_running == 4 and ids(p.waiting) == ["r4", "r5"]
    for _ in range(3):
        step(p)
    assert rs[0].status is Status.FINISHED and rs[4].status is Status.RUNNING and ids(p.waiting) == ["r5"]


def test_prompt_too_long_is_400_without_context_shift():
    """LC-5: n_prompt >= n_ctx_slot is an error 400 with ctx_shift off."""
    p = lcpp(n_parallel=4, n_ctx=8192, ctx_shift=False)
    p.add_request(req("long", 2048, 5), 0.0)
    p.add_request(req("ok", 2047, 1), 0.0)
    plan = p.schedule(0.0)
    assert [(r.request_id, why) for r, why in plan.rejected] == [("long", TOO_LONG)]
    assert ids(plan.admitted) == ["ok"]


def test_prompt_truncated_with_context_shift():
    """LC-5: with ctx_shift the prompt keeps n_keep tokens and drops blocks of n_left / 2 after them."""
    p = lcpp(n_parallel=4, n_ctx=8192, ctx_shift=True, n_keep=0, n_batch=8192)
    r = req("long", 3000, 2)
    p.add_request(r, 0.0)
    plan = step(p)
    # n_keep 0, n_left 2048, n_block 1024, erased (3000 - 0 - 1024) // 1024 = 1 -> 1976 tokens evaluated
    assert sched(plan) == [("long", 1976)]


def test_context_full_while_generating():
    """LC-6: without ctx_shift the slot stops at n_past + 1 >= n_ctx; with it, it shifts and goes on."""
    off = lcpp(n_parallel=1, n_ctx=64, ctx_shift=False)
    r = req("g", 40, 100)
    off.add_request(r, 0.0)
    run(off)
    assert r.finish_reason == "context limit" and r.num_output_tokens == 64 - 40
    on = lcpp(n_parallel=1, n_ctx=64, ctx_shift=True)
    r2 = req("g", 40, 100)
    on.add_request(r2, 0.0)
    run(on)
    assert r2.finish_reason == "length" and r2.num_output_tokens == 100
    assert on.slots[0].n_past <= 64


def test_decodes_first_then_prompts_up_to_n_batch():
    """LC-4: one token per generating slot (slot order), then prompt tokens until n_batch."""
    p = lcpp(n_parallel=3, n_ctx=3 * 1000, n_batch=100)
    p.add_request(req("a", 10, 50), 0.0)
    step(p)
    p.add_request(req("b", 150, 5), 0.0)
    p.add_request(req("c", 150, 5), 0.0)
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 99)]
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 51), ("c", 48)]


def test_no_cont_batching_prompts_only_without_decodes():
    p = lcpp(n_parallel=2, n_ctx=2000, n_batch=100, cont_batching=False)
    p.add_request(req("a", 10, 5), 0.0)
    step(p)
    p.add_request(req("b", 20, 5), 0.0)
    for _ in range(4):
        plan = step(p)
        assert sched(plan) == [("a", 1)]  # b's prompt waits while a decodes
    plan = step(p)  # a finished: an iteration without decodes
    assert sched(plan) == [("b", 20)]


def test_prompt_cache_and_similarity_slot_choice():
    """LC-2 / LC-3: a slot whose cache covers more than half of it is reused, only the suffix is
    evaluated; a full match still evaluates one token."""
    p = lcpp(n_parallel=2, n_ctx=4000)
    p.add_request(sys_req("a", 300, 20, 2, group=1), 0.0)
    p.add_request(sys_req("b", 300, 20, 2, group=2), 0.0)
    run(p)
    slot_of_b = next(s.id for s in p.slots if s.cache_req.request_id == "b")
    c = sys_req("c", 300, 40, 2, group=2)
    p.add_request(c, 10.0)
    plan = step(p, 10.0)
    assert sched(plan) == [("c", 40)] and c.num_cached_tokens == 300
    assert p.slots[slot_of_b].req is c
    # the slot now caches c; the same prompt again reuses all but one token
    run(p, 11.0)
    again = req("c2", c.prompt_len, 2, segments=c.spec.segments)
    p.add_request(again, 20.0)
    assert sched(step(p, 20.0)) == [("c2", 1)]


def test_least_recently_used_slot_without_a_similar_cache():
    p = lcpp(n_parallel=2, n_ctx=4000)
    p.add_request(req("a", 10, 2), 0.0)
    run(p)  # slot 0 used at t=1
    p.add_request(req("b", 10, 2), 5.0)
    p.add_request(req("c", 10, 9), 5.0)
    step(p, 5.0)
    # no cache is similar: b takes the least recently used slot (1, never used), c the other one
    assert p.slots[1].req.request_id == "b" and p.slots[0].req.request_id == "c"


def test_llamacpp_kv_sizing_from_n_ctx():
    s = resolve(config_from_dict({"engine": {"preset": "llamacpp", "n_ctx": 8192, "n_parallel": 4,
                                             "max_model_len": 4096}}))  # fmt: skip
    assert s.limits.max_num_seqs == 4 and s.options["n_ctx"] == 8192


# ---- Ollama -----------------------------------------------------------------------------------------
def test_ollama_kv_is_num_ctx_times_parallel():
    """OL-1 / §6 item 9: OLLAMA_NUM_PARALLEL=2, num_ctx=4096 -> 8192 tokens of KV, 4096 per request."""
    p = ollama(num_parallel=2, num_ctx=4096)
    assert p.kv.usable_blocks == 8192 and p.n_ctx_slot == 4096


def test_ollama_third_request_waits_when_loaded():
    """OL-3: at most num_parallel run; others wait FIFO with no cap (loaded model, v0.12)."""
    p = ollama(num_parallel=2)
    for i in range(600):
        assert p.add_request(req(f"r{i}", 10, 5), 0.0) is None
    step(p)
    assert p.num_running == 2 and p.num_waiting == 598


def test_ollama_queue_cap_while_loading():
    """OL-2: requests pending on a (re)load: OLLAMA_MAX_QUEUE=512, the next one gets 503."""
    p = ollama(num_parallel=2, model_loaded=False)
    reasons = [p.add_request(req(f"r{i}", 10, 5), 0.0) for i in range(513)]
    assert reasons[:512] == [None] * 512 and reasons[512] == BUSY


def test_ollama_round_robin_batches():
    """OL-5: sequences share num_batch round-robin (no decode-first); a sequence cut mid-prompt starts
    the next batch."""
    p = ollama(num_parallel=2, num_batch=100)
    p.add_request(req("a", 150, 5), 0.0)
    p.add_request(req("b", 30, 5), 0.0)
    plan = step(p)
    assert sched(plan) == [("a", 100)]  # a is cut mid-prompt
    plan = step(p)
    assert sched(plan) == [("a", 50), ("b", 30)]  # a resumes first
    plan = step(p)
    assert sched(plan) == [("a", 1), ("b", 1)] or sched(plan) == [("b", 1), ("a", 1)]


def test_ollama_longest_prefix_slot():
    """OL-4: the idle slot with the longest common prefix, even if it is not the LRU one."""
    p = ollama(num_parallel=2, num_ctx=4000)
    p.add_request(sys_req("a", 200, 10, 20, group=1), 0.0)  # slot 0, finishes last
    p.add_request(sys_req("b", 200, 10, 2, group=2), 0.0)  # slot 1, finishes first: the LRU slot
    run(p)
    assert p.slots[0].cache_req.request_id == "a" and p.slots[0].t_last_used > p.slots[1].t_last_used
    c = sys_req("c", 200, 10, 2, group=1)
    p.add_request(c, 50.0)
    step(p, 50.0)
    assert p.slots[0].req is c and c.num_cached_tokens == 200


def test_ollama_truncates_long_prompts_keeping_num_keep():
    """OL-6: prompt > num_ctx -> first num_keep tokens + the tail, num_ctx tokens in all."""
    p = ollama(num_parallel=1, num_ctx=256, num_batch=512)
    r = req("long", 1000, 3)
    assert p.add_request(r, 0.0) is None
    plan = step(p)
    assert sched(plan) == [("long", 256)]
    assert p.slots[0].keep == 4
    run(p, 1.0)
    assert r.status is Status.FINISHED and r.num_output_tokens == 3


def test_ollama_context_shift_while_generating():
    """OL-7: a full context discards (num_ctx - num_keep) / 2 tokens after num_keep and goes on."""
    p = ollama(num_parallel=1, num_ctx=64)
    r = req("g", 40, 100)
    p.add_request(r, 0.0)
    run(p)
    assert r.num_output_tokens == 100 and r.finish_reason == "length"


@pytest.mark.parametrize("preset", ["llamacpp", "ollama"])
def test_slot_presets_report_prefix_hits(preset):
    cfg = config_from_dict({
        "engine": {"preset": preset, "max_model_len": 4096, "cost_model": "constant"},
        "workload": {"num_requests": 20, "rate": 1.0, "prompt": {"dist": "fixed", "value": 50},
                     "output": {"dist": "fixed", "value": 10},
                     "shared_prefix": {"num_groups": 1, "prefix_len": 500}},
    })  # fmt: skip
    from sim.app.results import summarize
    from sim.app.simulate import simulate

    s = summarize(simulate(cfg))
    assert s["num_finished"] == 20
    assert s["prefix_cache_hit_rate"] > 0.8  # one slot, one shared system prompt
