"""Sarathi-Serve (engines.md §5.2 SAR-1 .. SAR-3) and Orca (§5.1 ORCA-1 .. ORCA-3) on the policy alone."""

from __future__ import annotations

import numpy as np

from policies.base import make_policy
from sim.core.request import Status
from tests.helpers import add, ids, limits, req, sched, step


def sarathi(watermark=0.0, **kw):
    base = dict(block_size=4, num_gpu_blocks=201, max_num_batched_tokens=16, max_model_len=512, max_num_seqs=128,
                enable_prefix_caching=False, enable_chunked_prefill=True)  # fmt: skip
    base.update(kw)
    return make_policy("sarathi", limits(**base), {"watermark": watermark})


def orca(**kw):
    base = dict(block_size=4, num_gpu_blocks=11, max_num_batched_tokens=16, max_model_len=512, max_num_seqs=8,
                enable_prefix_caching=False, enable_chunked_prefill=False)  # fmt: skip
    base.update(kw)
    return make_policy("orca", limits(**base), {})


# ---- Sarathi ----------------------------------------------------------------------------------------
def test_sarathi_budget_and_stall_free_order():
    """SAR-1 / SAR-2: decodes first, then unfinished prompts, then new prompts, within chunk_size."""
    p = sarathi()
    add(p, req("d", 4, 30))
    step(p)  # d's prompt
    add(p, req("p", 40, 5))
    plan = step(p)
    assert sched(plan) == [("d", 1), ("p", 15)]
    add(p, req("n", 20, 5))
    plan = step(p)
    assert sched(plan) == [("d", 1), ("p", 15)]  # p's chunk uses what the decode left; n gets nothing
    plan = step(p)
    assert sched(plan) == [("d", 1), ("p", 10), ("n", 5)]


def test_sarathi_never_exceeds_the_chunk():
    p = sarathi(max_num_batched_tokens=32)
    rng = np.random.default_rng(1)
    for i in range(30):
        add(p, req(f"r{i}", int(rng.integers(5, 120)), int(rng.integers(1, 30))))
    for t in range(400):
        if not p.has_unfinished():
            break
        plan = step(p, float(t))
        assert sum(n for _, n in plan.scheduled) <= 32
    assert not p.has_unfinished()


def test_sarathi_allocates_the_whole_prompt_at_admission():
    """SAR-3: blocks for the whole prompt at admission, so a prompt is never cut by memory."""
    p = sarathi()
    r = req("a", 30, 5)
    add(p, r)
    step(p)
    assert r.num_computed_tokens == 16 and p.kv.num_blocks_held(r) == 8  # ceil(30 / 4)


def test_sarathi_admission_respects_the_watermark():
    p = sarathi(watermark=0.1, num_gpu_blocks=21, max_num_batched_tokens=100)  # watermark int(0.1 x 21) = 2
    add(p, req("a", 64, 2), req("b", 4, 2))  # a: 16 blocks -> 4 left; b: 4 - 1 = 3 >= 2
    assert ids(step(p).admitted) == ["a", "b"]
    p2 = sarathi(watermark=0.1, num_gpu_blocks=21, max_num_batched_tokens=100)
    add(p2, req("a", 64, 2), req("b", 12, 2))  # b: 4 - 3 = 1 < 2
    assert ids(step(p2).admitted) == ["a"]


def test_sarathi_preempts_when_no_block_is_free():
    """SAR-2.1: can_append_slot is "a free block exists", so with none free the last running request is
    preempted (recompute, front of waiting) even if the current one needs no new block."""
    p = sarathi(num_gpu_blocks=5, max_num_batched_tokens=64)  # 4 usable blocks
    a, b = req("A", 5, 3), req("B", 8, 3)  # 2 blocks each; A's next token fits its second block
    add(p, a, b)
    step(p)
    assert p.kv.num_free_blocks == 0
    plan = step(p)
    assert ids(plan.preempted) == ["B"] and sched(plan) == [("A", 1)]
    assert b.status is Status.PREEMPTED and ids(p.waiting) == ["B"]


# ---- Orca -------------------------------------------------------------------------------------------
def test_orca_reserves_max_tokens_and_blocks_the_queue():
    """ORCA-2: admission reserves prompt + max output; the first request that does not fit stops it."""
    p = orca()  # 10 usable blocks of 4 tokens
    add(p, req("A", 8, 12), req("B", 8, 12), req("C", 4, 1))  # 5 + 5 blocks; C would need 2
    plan = step(p)
    assert ids(plan.admitted) == ["A", "B"] and p.kv.num_free_blocks == 0


def test_orca_never_preempts_and_admits_every_iteration():
    """ORCA-1: requests join as soon as a finish frees their reservation, one iteration later at most."""
    p = orca(num_gpu_blocks=11)
    specs = [req(f"r{i}", 8, 4 + 3 * i) for i in range(6)]
    add(p, *specs)
    preempted = 0
    admitted_at = {}
    finished_at = {}
    for t in range(200):
        if not p.has_unfinished():
            break
        plan = p.schedule(float(t))
        preempted += len(plan.preempted)
        for r in plan.admitted:
            admitted_at[r.request_id] = t
        for r in p.update(plan, float(t)):
            finished_at[r.request_id] = t
    assert preempted == 0 and len(finished_at) == 6
    # r2 waits for r0's reservation and joins in the iteration right after r0 finishes
    assert admitted_at["r2"] == finished_at["r0"] + 1


def test_orca_whole_prompt_with_decodes_in_one_iteration():
    """ORCA-3: selective batching, no chunking and no token budget."""
    p = orca(num_gpu_blocks=400, max_model_len=1100)
    add(p, req("A", 8, 10))
    step(p)
    add(p, req("B", 1000, 4))
    plan = step(p)
    assert sched(plan) == [("A", 1), ("B", 1000)]


def test_orca_max_batch_size():
    p = orca(num_gpu_blocks=400, max_num_seqs=2)
    add(p, req("A", 8, 10), req("B", 8, 10), req("C", 8, 10))
    assert ids(step(p).admitted) == ["A", "B"]
