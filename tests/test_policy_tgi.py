"""Text-Generation-Inference router + v3 queue, engines.md §4.2 TGI-1 .. TGI-3 (§6 item 11)."""

from __future__ import annotations

from policies.base import make_policy
from policies.tgi import OVERLOADED
from tests.helpers import add, ids, limits, req, sched, step


def tgi(chunked=True, **opts):
    lim = dict(block_size=4, num_gpu_blocks=401, max_num_batched_tokens=64, max_model_len=512, max_num_seqs=128,
               enable_prefix_caching=False, enable_chunked_prefill=chunked)  # fmt: skip
    for k in list(opts):
        if k in lim:
            lim[k] = opts.pop(k)
    return make_policy("tgi", limits(**lim), opts)




def test_max_concurrent_requests_gives_429():
    """TGI-1: requests in the system (queued or running) are capped; beyond, "Model is overloaded"."""
    p = tgi(max_concurrent_requests=2)
    assert p.add_request(req("a", 8, 4), 0.0) is None
    assert p.add_request(req("b", 8, 4), 0.0) is None
    assert p.add_request(req("c", 8, 4), 0.0) == OVERLOADED
    step(p)
    assert p.add_request(req("d", 8, 4), 0.0) == OVERLOADED  # running ones still hold their permit


def test_reservation_of_input_plus_max_new_tokens():
    """TGI-2: admission needs blocks for input + max_new_tokens - 1 up front; no preemption ever."""
    p = tgi(num_gpu_blocks=11)  # 10 usable blocks of 4 tokens
    a, b = req("a", 8, 25), req("b", 4, 5)  # a: 8 + 25 - 1 = 32 tokens = 8 blocks; b: 8 tokens = 2 blocks
    add(p, a, b)
    plan = step(p)
    assert ids(plan.admitted) == ["a", "b"] and p.kv.num_free_blocks == 0
    assert p.kv.num_blocks_held(a) == 8
    p2 = tgi(num_gpu_blocks=11)
    add(p2, req("a", 8, 26), req("b", 4, 5))  # a now needs 9 blocks: b (2) no longer fits -> head-of-line
    assert ids(step(p2).admitted) == ["a"]


def test_prefill_budget_chunks_the_last_entry():
    """TGI-2 with chunking: the entry that overflows max_batch_prefill_tokens gets the rest as a chunk."""
    p = tgi()
    add(p, req("a", 40, 4), req("b", 40, 4), req("c", 10, 4))
    plan = step(p)
    assert sched(plan) == [("a", 40), ("b", 24)]


def test_prefill_budget_without_chunking_puts_the_entry_back():
    p = tgi(chunked=False)
    add(p, req("a", 40, 4), req("b", 40, 4), req("c", 10, 4))
    plan = step(p)
    assert sched(plan) == [("a", 40)] and ids(p.waiting) == ["b", "c"]


def test_non_chunked_min_size_and_max_waiting_tokens():
    """TGI-3 / §6 item 11: without chunking, a new batch needs floor(0.3 x running) entries, unless
    max_waiting_tokens decode steps passed without an admission; it is prefilled alone."""
    p = tgi(chunked=False, max_num_batched_tokens=1000, num_gpu_blocks=1001)
    add(p, *[req(f"r{i}", 8, 200) for i in range(10)])
    step(p)  # first batch: all ten
    add(p, req("x", 8, 20), req("y", 8, 20))  # 2 < floor(0.3 x 10) = 3
    decodes = 0
    for t in range(1, 40):
        plan = step(p, float(t))
        if plan.admitted:
            break
        assert len(plan.scheduled) == 10  # a decode step over the running batch
        decodes += 1
    # waiting_tokens starts at 1 after the first prefill and grows by one per decode: 19 decodes reach 20
    assert decodes == 19
    assert sched(plan) == [("x", 8), ("y", 8)]  # prefilled alone: the running batch waits
    plan = step(p, 50.0)
    assert len(plan.scheduled) == 12 and not plan.admitted  # the decode step follows the prefill


def test_non_chunked_enough_waiting_joins_at_once():
    p = tgi(chunked=False, max_num_batched_tokens=1000, num_gpu_blocks=1001)
    add(p, *[req(f"r{i}", 8, 200) for i in range(10)])
    step(p)
    add(p, req("x", 8, 20), req("y", 8, 20), req("z", 8, 20))  # 3 >= floor(0.3 x 10)
    plan = step(p, 1.0)
    assert ids(plan.admitted) == ["x", "y", "z"]


def test_chunked_new_batch_joins_the_running_batch():
    """TGI-3 with chunking: min_size is ignored; the new batch is prefilled together with the running
    rows (mixed forward) within max_batch_prefill_tokens minus the running tokens; a decode follows."""
    p = tgi(max_num_batched_tokens=20)
    add(p, *[req(f"r{i}", 4, 50) for i in range(4)])
    step(p)
    add(p, req("x", 30, 5))
    plan = step(p, 1.0)
    assert sched(plan) == [("r0", 1), ("r1", 1), ("r2", 1), ("r3", 1), ("x", 16)]
    plan = step(p, 2.0)
    assert not plan.admitted and dict(sched(plan))["r0"] == 1
