"""HF generate static batching (engines.md §4.1; conformance item 10)."""

from __future__ import annotations

from policies.base import make_policy
from tests.helpers import limits, req, sched, step


def static(**kw):
    base = dict(max_num_seqs=4, enable_prefix_caching=False, enable_chunked_prefill=False)
    base.update(kw)
    return make_policy("static", limits(**base))


def test_rule_10_batch_runs_to_longest_and_returns_together():
    p = static()
    a, b = req("a", 10, 5), req("b", 50, 100)
    p.add_request(a, 0)
    p.add_request(b, 0)
    plan = p.schedule(0.0)
    # Prefill is priced on the padded prompt for every row (HF-1).
    assert list(plan.batch.prefill_chunk) == [50, 50]
    p.update(plan, 1.0)
    steps = 1
    while p.has_unfinished():
        plan = step(p, now=float(steps + 1))
        steps += 1
        # Finished rows still occupy the batch width (HF-3).
        assert plan.batch.num_decode == 2
    assert steps == 100  # 1 prefill + 99 decodes: max(gen_len) forward passes
    assert a.finish_time == b.finish_time == 100.0
    assert a.num_output_tokens == 5 and b.num_output_tokens == 100


def test_no_new_batch_until_idle():
    p = static(max_num_seqs=2)
    for i in range(3):
        p.add_request(req(f"r{i}", 8, 3), 0)
    plan = step(p)
    assert sched(plan) == [("r0", 8), ("r1", 8)]
    plan = step(p)
    assert "r2" not in dict(sched(plan))
    step(p)
    plan = step(p)
    assert sched(plan) == [("r2", 8)]


def test_reserves_padded_prompt_plus_max_new_tokens():
    p = static(max_num_seqs=8, num_gpu_blocks=1 + 8, block_size=16, max_new_tokens=32)
    # each row reserves ceil((64 + 32) / 16) = 6 blocks: only one row fits in 8 blocks
    p.add_request(req("a", 64, 10), 0)
    p.add_request(req("b", 16, 10), 0)
    plan = p.schedule(0.0)
    assert [r.request_id for r in plan.admitted] == ["a"]
    assert p.kv.num_free_blocks == 8 - 6
