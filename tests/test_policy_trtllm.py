"""TensorRT-LLM capacity + micro-batch scheduling, engines.md §2 TRT-1 .. TRT-9 (§6 item 7)."""

from __future__ import annotations

from policies.base import make_policy
from sim.core.request import Status
from tests.helpers import add, ids, limits, req, sched, step


def trt(policy="GUARANTEED_NO_EVICT", chunking="FIRST_COME_FIRST_SERVED", **kw):
    base = dict(block_size=4, num_gpu_blocks=11, max_num_batched_tokens=1000, max_model_len=512,
                enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    base.update(kw)
    opts = {"capacity_scheduler_policy": policy, "context_chunking_policy": chunking}
    return make_policy("trtllm", limits(**base), opts)




def run_until_done(p, limit=500):
    plans = []
    for i in range(limit):
        if not p.has_unfinished():
            break
        plans.append(step(p, float(i)))
    return plans


def test_guaranteed_no_evict_reserves_to_completion():
    """TRT-1: A and B reserve 5 blocks each (prompt 8 + 12 new = 20 tokens); C (2 blocks) must wait
    although only 4 blocks are allocated after the prompts, and nobody is ever paused."""
    p = trt()
    a, b, c = req("A", 8, 12), req("B", 8, 12), req("C", 4, 4)
    add(p, a, b, c)
    plan = step(p)
    assert ids(plan.admitted) == ["A", "B"] and p.kv.num_free_blocks == 6
    assert c.status is Status.WAITING
    plans = run_until_done(p)
    assert not any(pl.preempted for pl in plans)
    assert c.scheduled_time >= a.finish_time  # admitted once A's reservation came back


def test_no_evict_is_head_of_line():
    p = trt()
    add(p, req("A", 8, 12), req("big", 8, 20), req("small", 4, 1))  # big needs 7 > 5 left
    plan = step(p)
    assert ids(plan.admitted) == ["A"]


def test_max_utilization_pauses_the_last_started_request():
    """TRT-2: next-step blocks only; when A cannot grow, the last started request (C) is paused, its
    blocks freed and its generated token folded into the prompt it recomputes."""
    p = trt("MAX_UTILIZATION", num_gpu_blocks=7)  # 6 usable
    a, b, c = req("A", 8, 12), req("B", 8, 12), req("C", 8, 12)
    add(p, a, b, c)
    assert ids(step(p).admitted) == ["A", "B", "C"]  # 2 blocks each for the next step: all fit
    plan = step(p)
    assert ids(plan.preempted) == ["C"] and sched(plan) == [("A", 1), ("B", 1)]
    assert c.num_computed_tokens == 0 and c.num_tokens == 9 and c.status is Status.PREEMPTED
    assert p.running[2] is c  # keeps its place in arrival order
    plans = run_until_done(p)
    assert all(r.status is Status.FINISHED for r in (a, b, c))
    recompute = [n for pl in plans for r, n in pl.scheduled if r is c and n > 1]
    assert recompute and recompute[0] >= 9  # the whole folded prompt is recomputed


def test_static_batch_admits_only_when_idle():
    """TRT-3: no request joins while any is in progress, even with free memory."""
    p = trt("STATIC_BATCH", num_gpu_blocks=200)
    a, b = req("A", 8, 3), req("B", 8, 6)
    add(p, a, b)
    step(p)
    c = req("C", 4, 2)
    add(p, c)
    plans = run_until_done(p)
    first_c = next(i for i, pl in enumerate(plans) if "C" in ids(pl.admitted))
    assert c.scheduled_time is not None and c.scheduled_time >= b.finish_time
    assert all("C" not in ids(pl.admitted) for pl in plans[:first_c])


def test_prefill_first_runs_contexts_alone():
    """TRT-4: when a context request fits, the step holds only contexts."""
    p = trt("PREFILL_FIRST", num_gpu_blocks=200)
    add(p, req("A", 8, 10))
    step(p)
    add(p, req("B", 8, 10))
    plan = step(p)
    assert sched(plan) == [("B", 8)]
    plan = step(p)
    assert sched(plan) == [("A", 1), ("B", 1)] or sched(plan) == [("B", 1), ("A", 1)]


def test_reuse_aware_deferral():
    """TRT-5: the second of two requests sharing a prefix waits one step to reuse the blocks the first
    computes, instead of computing them twice; without block reuse both start at once."""
    toks = tuple(range(64))

    def pair(reuse):
        p = trt(num_gpu_blocks=200, enable_prefix_caching=reuse)
        a = req("A", 72, 4, token_ids=toks + tuple(range(1000, 1008)))
        b = req("B", 72, 4, token_ids=toks + tuple(range(2000, 2008)))
        add(p, a, b)
        first = step(p, 0.0)
        second = step(p, 1.0)
        return first, second, b

    first, second, b = pair(True)
    assert ids(first.admitted) == ["A"] and ids(second.admitted) == ["B"]
    assert b.num_cached_tokens == 64  # TRT-9: reused 16 blocks of 4 tokens
    first, _, b = pair(False)
    assert ids(first.admitted) == ["A", "B"] and b.num_cached_tokens == 0


def test_micro_batch_breaks_on_the_token_budget():
    """TRT-6: contexts need their whole prompt without chunking; the first that does not fit stops."""
    p = trt(num_gpu_blocks=200, max_num_batched_tokens=100)
    add(p, req("A", 60, 4), req("B", 60, 4), req("C", 10, 4))
    assert sched(step(p)) == [("A", 60)]


def test_micro_batch_respects_max_batch_size():
    p = trt(num_gpu_blocks=200, max_num_seqs=2)
    add(p, req("A", 8, 4), req("B", 8, 4), req("C", 8, 4))
    assert ids(step(p).admitted) == ["A", "B"]


def test_chunked_context_fcfs_rounds_to_tokens_per_block():
    """TRT-7 FCFS: generation tokens first, then contexts in order, each chunk a multiple of
    tokens_per_block unless the whole remainder fits."""
    p = trt(num_gpu_blocks=400, block_size=32, max_num_batched_tokens=100, enable_chunked_prefill=True)
    add(p, req("g1", 4, 50), req("g2", 4, 50), req("g3", 4, 50))
    step(p)
    add(p, req("short", 50, 5), req("long", 500, 5))
    plan = step(p)
    # 97 tokens left after 3 generation tokens: short takes its 50, long gets floor(47 / 32) * 32 = 32
    assert dict(sched(plan))["short"] == 50 and dict(sched(plan))["long"] == 32


def test_chunked_context_equal_progress():
    p = trt(num_gpu_blocks=400, block_size=32, max_num_batched_tokens=100, enable_chunked_prefill=True,
            chunking="EQUAL_PROGRESS")  # fmt: skip
    add(p, req("x", 500, 5), req("y", 500, 5))
    plan = step(p)
    # rounds of +32 each: x 32, y 32, x 64; y would need 32 more but only 4 are left
    assert dict(sched(plan)) == {"x": 64, "y": 32}


def test_contexts_precede_generations():
    """TRT-8: in the batch, context requests come before generation requests."""
    p = trt(num_gpu_blocks=200)
    add(p, req("A", 8, 10))
    step(p)
    add(p, req("B", 8, 10))
    plan = step(p)
    assert sched(plan) == [("B", 8), ("A", 1)]


def test_too_long_prompt_without_chunking_is_rejected():
    p = trt(max_num_batched_tokens=64, num_gpu_blocks=200)
    reason = p.add_request(req("A", 100, 4), 0.0)
    assert reason is not None and "max_num_tokens" in reason
