"""Prefix caching from every content source (token_ids, Mooncake hash_ids, shared-prefix groups,
multi-turn output keys), priorities in the vLLM preset, and HF static-batching rules (engines.md
KV-4/KV-5/KV-8, V1-3/V1-5, HF-1 .. HF-4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.base import make_policy
from sim.app.config import config_from_dict
from sim.app.results import summarize
from sim.app.simulate import simulate
from tests.helpers import ids, limits, req, sched, step
from workloads.tracefmt import load_trace

SHARED = Path(__file__).resolve().parents[2] / "shared"


def vllm(**kw):
    return make_policy("vllm", limits(**kw))



# ---- prefix caching ---------------------------------------------------------------------------------
def test_hash_ids_map_onto_the_engine_block_size():
    """Mooncake ids stand for 512-token blocks; with 16-token engine blocks two shared ids = 64 hits."""
    p = vllm(num_gpu_blocks=2000)
    a = req("a", 1536, 2, hash_ids=(1, 2, 3), hash_block_size=512)
    b = req("b", 1536, 2, hash_ids=(1, 2, 9), hash_block_size=512)
    c = req("c", 1536, 2, hash_ids=(7, 2, 3), hash_block_size=512)  # a different first block: no hit
    p.add_request(a, 0)
    step(p)
    for r in (b, c):
        p.add_request(r, 0)
    step(p)
    assert b.num_cached_tokens == 1024 and c.num_cached_tokens == 0
    d = req("d", 1536, 2, hash_ids=(1, 2, 3), hash_block_size=512)
    p.add_request(d, 0)
    step(p)
    assert d.num_cached_tokens == 1520  # all of it but the last block: one token is recomputed (KV-5)


def test_hash_ids_with_a_partial_last_block():
    p = vllm(num_gpu_blocks=2000)
    a = req("a", 600, 2, hash_ids=(1, 2), hash_block_size=512)  # second id covers 88 tokens
    b = req("b", 700, 2, hash_ids=(1, 2), hash_block_size=512)  # its second block is longer
    p.add_request(a, 0)
    step(p)
    p.add_request(b, 0)
    step(p)
    # shared: 512 + 88 tokens of the same content = 37 full 16-token blocks
    assert b.num_cached_tokens == 592


def test_shared_prefix_groups_hit_only_their_group():
    p = vllm(num_gpu_blocks=2000)

    def grp(rid, g):
        return req(rid, 300, 2, segments=((("sys", g), 256), (("u", rid), 44)))

    p.add_request(grp("a", 0), 0)
    step(p)
    same, other = grp("b", 0), grp("c", 1)
    p.add_request(same, 0)
    p.add_request(other, 0)
    step(p)
    assert same.num_cached_tokens == 256 and other.num_cached_tokens == 0


def test_hits_on_blocks_prefilled_in_the_same_step():
    """vllm-oracle README: blocks are registered at allocation, so a request admitted later in the
    same step hits the blocks another one is prefilling."""
    p = vllm(num_gpu_blocks=2000)
    toks = tuple(range(64))
    a = req("a", 70, 2, token_ids=toks + (1, 2, 3, 4, 5, 6))
    b = req("b", 70, 2, token_ids=toks + (9, 8, 7, 6, 5, 4))
    p.add_request(a, 0)
    p.add_request(b, 0)
    plan = step(p)
    assert sched(plan) == [("a", 70), ("b", 6)] and b.num_cached_tokens == 64


def test_multi_turn_hits_previous_prompt_and_output():
    p = vllm(num_gpu_blocks=2000)
    t1 = req("t1", 100, 28, segments=((("s", 1), 100),), output_key=("o", "t1"))
    p.add_request(t1, 0)
    for _ in range(28):
        step(p)
    assert t1.finish_time is not None
    t2 = req("t2", 160, 5, segments=((("s", 1), 100), (("o", "t1"), 28), (("m", 2), 32)))
    p.add_request(t2, 0)
    step(p)
    # 127 of t1's 128 tokens were computed (the last sampled token never is): 7 full blocks = 112
    assert t2.num_cached_tokens == 112


def test_mooncake_style_trace_end_to_end(tmp_path):
    rows = []
    for i in range(40):
        shared = [0, 1, 2] if i % 2 == 0 else [100, 101]
        rows.append({"timestamp": 200 * i, "input_length": 512 * len(shared) + 300, "output_length": 20,
                     "hash_ids": shared + [1000 + i]})  # fmt: skip
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    specs = load_trace(path).specs
    assert specs[0].hash_ids == (0, 1, 2, 1000)
    base = {"engine": {"max_model_len": 4096, "cost_model": "constant"}, "workload": {"trace": str(path)}}
    on = summarize(simulate(config_from_dict(base)))
    off = summarize(
        simulate(config_from_dict({**base, "engine": {**base["engine"], "enable_prefix_caching": False}}))
    )
    assert on["prefix_cache_hit_rate"] > 0.5 and off["prefix_cache_hit_rate"] in (0.0, None)
    assert on["num_finished"] == off["num_finished"] == 40


@pytest.mark.skipif(
    not (SHARED / "data/traces/mooncake_synthetic_trace.jsonl").exists(), reason="no shared data"
)
def test_real_mooncake_trace_has_prefix_hits():
    """The published synthetic Mooncake trace shares hash_ids between requests: the first requests
    alone already hit each other's blocks once mapped onto 16-token blocks."""
    from collections import Counter

    specs = load_trace(SHARED / "data/traces/mooncake_synthetic_trace.jsonl").specs[:300]
    first = Counter(s.hash_ids[0] for s in specs if s.hash_ids)
    specs = [s for s in specs if s.hash_ids and first[s.hash_ids[0]] > 1][:12]
    assert len(specs) >= 4
    p = vllm(num_gpu_blocks=60000, max_model_len=131072, max_num_batched_tokens=1 << 20)
    for s in specs:
        p.add_request(
            req(s.request_id, s.prompt_len, 1, hash_ids=s.hash_ids, hash_block_size=s.hash_block_size), 0
        )
    while p.has_unfinished():
        step(p)
    stats = p.kv.prefix_cache_stats()
    assert 0 < stats["hits"] < stats["queries"]


# ---- priorities (vllm preset, V1-3 / V1-5) ----------------------------------------------------------
def test_priority_waiting_order_is_priority_then_arrival():
    p = vllm(scheduling_policy="priority", max_num_seqs=1)
    for rid, prio, t in (("late_hi", 0, 2.0), ("lo", 5, 0.0), ("early_hi", 0, 1.0)):
        p.add_request(req(rid, 8, 2, t=t, priority=prio), 0)
    order = []
    for _ in range(6):
        plan = step(p)
        order += ids(plan.admitted)
    assert order == ["early_hi", "late_hi", "lo"]


def test_priority_victim_gives_back_its_budget():
    """V1-3: a victim already scheduled in this step is unscheduled and its tokens returned."""
    p = vllm(scheduling_policy="priority", block_size=4, num_gpu_blocks=9, enable_prefix_caching=False,
             max_num_batched_tokens=64)  # fmt: skip
    lo = req("lo", 3, 10, t=0.0, priority=9)
    hi = req("hi", 24, 4, t=1.0, priority=0)
    p.add_request(lo, 0)
    step(p)  # lo alone: 1 block
    p.add_request(hi, 1)
    step(p)  # lo decodes; hi takes 6 blocks: 1 free
    plan = step(p)
    # lo (first in running) takes the last block for its 5th token; hi then needs a 7th block: the victim
    # is the lowest priority, lo, which was already scheduled in this step
    assert ids(plan.preempted) == ["lo"] and sched(plan) == [("hi", 1)]
    assert lo.num_computed_tokens == 0 and len(p.waiting) == 1 and p.waiting[0] is lo


def test_priority_runs_from_config():
    cfg = config_from_dict({
        "engine": {"scheduling_policy": "priority", "num_gpu_blocks_override": 200, "max_model_len": 2048,
                   "cost_model": "constant"},
        "workload": {"num_requests": 60, "rate": 40.0, "prompt": {"dist": "fixed", "value": 200},
                     "output": {"dist": "fixed", "value": 100}, "priority": {"levels": [0, 1], "weights": [1, 1]}},
    })  # fmt: skip
    res = simulate(cfg)
    df = res.requests.assign(q=lambda d: d["scheduled_time"] - d["arrival_time"])
    assert (df["status"] == "finished").all()
    assert df.loc[df["priority"] == 0, "q"].mean() < df.loc[df["priority"] == 1, "q"].mean()


# ---- HF static (hf-static preset), HF-1 .. HF-4 ------------------------------------------------------
def hf(**kw):
    base = dict(max_num_seqs=4, enable_prefix_caching=False, enable_chunked_prefill=False, num_gpu_blocks=400)
    base.update(kw)
    return make_policy("hf-static", limits(**base))


def test_hf_left_padding_prices_every_row_at_the_longest_prompt():
    p = hf()
    for rid, n in (("a", 10), ("b", 50), ("c", 30)):
        p.add_request(req(rid, n, 5), 0)
    plan = p.schedule(0.0)
    assert plan.batch.num_prefill_tokens == 3 * 50  # HF-1: padding is computed, then masked


def test_hf_max_new_tokens_caps_generation():
    p = hf(max_new_tokens=20)
    a, b = req("a", 10, 100), req("b", 10, 5)
    p.add_request(a, 0)
    p.add_request(b, 0)
    steps = 0
    while p.has_unfinished():
        plan = step(p, float(steps))
        steps += 1
        assert steps == 1 or plan.batch.num_decode == 2  # HF-3: finished rows still take a batch row
    assert a.num_output_tokens == 20 and b.num_output_tokens == 5  # HF-2
    assert steps == 20 and a.finish_time == b.finish_time  # results come back together


def test_hf_static_cache_reserves_padded_length_for_every_row():
    """HF-4 (StaticCache): batch x (padded prompt + max_new_tokens), whatever EOS does."""
    p = hf(block_size=16, max_new_tokens=64)
    p.add_request(req("a", 100, 2), 0)
    p.add_request(req("b", 10, 2), 0)
    p.schedule(0.0)
    assert p.kv.usable_blocks - p.kv.num_free_blocks == 2 * -(-(100 + 64) // 16)
