"""Workload builder: open/closed/trace, common random numbers, shared prefixes, priorities, config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.core.errors import ConfigError
from sim.core.request import Request
from workloads.synthetic import STREAMS, ClosedWorkload, OpenWorkload, build_workload, spawn_streams
from workloads.tracefmt.jsonl import save_jsonl

Z = 4.0


def open_cfg(**over):
    cfg = {
        "arrival": "poisson",
        "rate": 4.0,
        "num_requests": 300,
        "prompt": {"dist": "lognormal", "mean": 600, "std": 200, "max": 4000},
        "output": {"dist": "uniform", "low": 8, "high": 256},
    }
    cfg.update(over)
    return cfg


def closed_cfg(**over):
    cfg = {
        "kind": "closed",
        "num_clients": 8,
        "num_requests": 300,
        "think_time": 2.0,
        "think_dist": "exponential",
        "prompt": {"dist": "lognormal", "mean": 600, "std": 200, "max": 4000},
        "output": {"dist": "uniform", "low": 8, "high": 256},
    }
    cfg.update(over)
    return cfg


def lens(w: OpenWorkload):
    return [(s.prompt_len, s.output_len, s.priority) for s in w.specs]


def test_open_loop_basics_and_reproducibility():
    w = build_workload(open_cfg(), seed=1)
    assert isinstance(w, OpenWorkload) and len(w) == 300
    t = [s.arrival_time for s in w.specs]
    assert t == sorted(t) and t[-1] == pytest.approx(300 / 4.0)  # vLLM bench: last arrival at N/rate
    assert [s.request_id for s in w.specs] == [f"r{i}" for i in range(300)]
    assert all(1 <= s.prompt_len <= 4000 and 8 <= s.output_len <= 256 for s in w.specs)
    assert not any(s.shares_content for s in w.specs)
    assert build_workload(open_cfg(), seed=1).specs == w.specs
    assert lens(build_workload(open_cfg(), seed=2)) != lens(w)


def test_changing_the_rate_keeps_the_requests_common_random_numbers():
    base = build_workload(open_cfg(), seed=3)
    faster = build_workload(open_cfg(rate=16.0), seed=3)
    assert lens(faster) == lens(base)
    np.testing.assert_allclose(
        [s.arrival_time for s in faster.specs], [s.arrival_time / 4 for s in base.specs]
    )
    for other in (
        open_cfg(arrival="gamma", burstiness=0.3),
        open_cfg(arrival="constant"),
        open_cfg(rescale=False),
        open_cfg(priority={"levels": [0, 1]}),  # a new stream does not disturb the others
    ):
        assert [x[:2] for x in lens(build_workload(other, seed=3))] == [x[:2] for x in lens(base)]


def test_open_and_closed_loop_draw_the_same_lengths():
    o = build_workload(open_cfg(), seed=4)
    c = build_workload(closed_cfg(), seed=4)
    assert c.prompt_lens.tolist() == [s.prompt_len for s in o.specs]
    assert c.output_lens.tolist() == [s.output_len for s in o.specs]


def test_spawn_streams_is_stateless_and_matches_seedsequence_spawn():
    ss = np.random.SeedSequence(42)
    a = spawn_streams(ss)
    assert ss.n_children_spawned == 0  # calling twice cannot silently give different streams
    b = spawn_streams(42)
    children = np.random.SeedSequence(42).spawn(len(STREAMS))
    for k, name in enumerate(STREAMS):
        x = a[name].random(4)
        assert np.array_equal(x, b[name].random(4))  # int seed and SeedSequence(seed) agree
        assert np.array_equal(x, np.random.Generator(np.random.PCG64(children[k])).random(4))
    firsts = {name: spawn_streams(42)[name].random() for name in STREAMS}
    assert len(set(firsts.values())) == len(STREAMS)  # independent streams, not one reused
    w1 = build_workload(open_cfg(), seed=np.random.SeedSequence(42))
    assert w1.specs == build_workload(open_cfg(), seed=42).specs


def test_shared_prefix_segments_and_block_identity():
    w = build_workload(open_cfg(shared_prefix={"num_groups": 4, "prefix_len": 64}), seed=5)
    base = build_workload(open_cfg(), seed=5)
    groups = []
    for s, b in zip(w.specs, base.specs, strict=True):
        assert s.shares_content
        (k0, n0), (k1, n1) = s.segments
        assert k0[0] == "sys" and n0 == 64 and k1 == ("u", s.request_id)
        assert s.prompt_len == 64 + b.prompt_len  # vLLM random dataset: prefix + sampled input length
        groups.append(k0[1])
    assert set(groups) == {0, 1, 2, 3}  # 300 draws over 4 groups: each repeats many times
    for g in range(4):
        assert abs(groups.count(g) / 300 - 0.25) < Z * math.sqrt(0.25 * 0.75 / 300)
    # Same group → same first 64/16 = 4 block hashes; different group → different ones.
    same = [s for s, g in zip(w.specs, groups, strict=True) if g == groups[0]]
    other = next(s for s, g in zip(w.specs, groups, strict=True) if g != groups[0])
    h = [Request(s).block_hashes(16, 64) for s in (same[0], same[1], other)]
    assert h[0] == h[1] and h[0][0] != h[2][0]
    assert Request(same[0]).block_hashes(16, 80)[4] != Request(same[1]).block_hashes(16, 80)[4]


def test_priority_mix_frequencies():
    n = 2000
    w = build_workload(open_cfg(num_requests=n, priority={"levels": [0, 5], "weights": [3, 1]}), seed=6)
    pr = np.array([s.priority for s in w.specs])
    assert set(pr.tolist()) == {0, 5}
    assert abs((pr == 5).mean() - 0.25) < Z * math.sqrt(0.25 * 0.75 / n)


def test_closed_loop_specs_are_deterministic_by_index():
    c = build_workload(closed_cfg(shared_prefix={"num_groups": 2, "prefix_len": 32}), seed=7)
    assert isinstance(c, ClosedWorkload) and (c.num_clients, c.num_requests) == (8, 300)
    a = c.spec(10, client=3, arrival_time=5.0)
    b = c.spec(10, client=6, arrival_time=99.0)  # another policy may issue it from another client, later
    assert (a.request_id, a.session_id, a.arrival_time) == ("r10", "c3", 5.0)
    assert (a.prompt_len, a.output_len, a.priority, a.segments) == (
        b.prompt_len,
        b.output_len,
        b.priority,
        b.segments,
    )
    again = build_workload(closed_cfg(shared_prefix={"num_groups": 2, "prefix_len": 32}), seed=7)
    order = list(range(300))[::-1]  # asking in another order changes nothing
    assert [again.spec(i, 0, 0.0).prompt_len for i in order] == [c.spec(i, 0, 0.0).prompt_len for i in order]
    assert [again.think_time(i) for i in range(300)] == [c.think_time(i) for i in range(300)]
    with pytest.raises(IndexError):
        c.spec(300, 0, 0.0)
    with pytest.raises(IndexError):
        c.spec(0, 8, 0.0)
    with pytest.raises(IndexError):
        c.think_time(-1)


def test_closed_loop_think_times():
    n = 5000
    c = build_workload(closed_cfg(num_requests=n), seed=8)
    th = np.array([c.think_time(i) for i in range(n)])
    assert abs(th.mean() - 2.0) < Z * 2.0 / math.sqrt(n)  # exponential: sd = mean
    assert abs(th.std() / th.mean() - 1) < Z / math.sqrt(n)
    fixed = build_workload(closed_cfg(think_dist="fixed", think_time=0.5), seed=8)
    assert all(fixed.think_time(i) == 0.5 for i in range(300))
    none = build_workload(closed_cfg(think_dist="fixed", think_time=0.0, num_requests=3), seed=8)
    assert none.think_time(2) == 0.0


def test_max_model_len_clips_and_counts():
    cfg = open_cfg(
        prompt={"dist": "uniform", "low": 1, "high": 3000}, output={"dist": "fixed", "value": 1000}
    )
    w = build_workload(cfg, seed=9, max_model_len=2048)
    assert all(s.prompt_len + s.output_len <= 2048 for s in w.specs)
    expected = sum(s.prompt_len + s.output_len > 2048 for s in build_workload(cfg, seed=9).specs)
    assert w.num_clipped == expected > 0
    pre = build_workload(
        {**cfg, "shared_prefix": {"num_groups": 1, "prefix_len": 1500}}, seed=9, max_model_len=2048
    )
    assert all(s.segments[0][1] == 1500 and s.segments[1][1] >= 1 for s in pre.specs)
    assert all(s.prompt_len + s.output_len <= 2048 for s in pre.specs)
    with pytest.raises(ConfigError, match="prefix_len"):
        build_workload(
            {**cfg, "shared_prefix": {"num_groups": 1, "prefix_len": 2047}}, seed=9, max_model_len=2048
        )


def test_trace_form(tmp_path):
    w = build_workload(open_cfg(num_requests=20, shared_prefix={"num_groups": 2, "prefix_len": 16}), seed=10)
    save_jsonl(w.specs, tmp_path / "w.jsonl")
    same = build_workload({"trace": "w.jsonl"}, seed=0, base_dir=tmp_path)
    assert same.specs == w.specs
    fast = build_workload({"trace": str(tmp_path / "w.jsonl"), "rate_scale": 2.0, "num_requests": 5}, seed=0)
    assert [s.arrival_time for s in fast.specs] == [s.arrival_time / 2 for s in w.specs[:5]]
    slow = build_workload({"kind": "trace", "trace": str(tmp_path / "w.jsonl"), "time_scale": 3.0}, seed=0)
    assert [s.arrival_time for s in slow.specs] == [s.arrival_time * 3 for s in w.specs]
    with pytest.raises(ConfigError, match="not both"):
        build_workload({"trace": str(tmp_path / "w.jsonl"), "time_scale": 2, "rate_scale": 2}, seed=0)
    with pytest.raises(ConfigError, match=r"trace option 'rate' does not apply"):
        build_workload({"trace": str(tmp_path / "w.jsonl"), "rate": 2}, seed=0)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (open_cfg(rat=3), r"workload \(open loop\): unknown key 'rat'; allowed keys: arrival, burstiness"),
        (closed_cfg(rate=3), r"workload \(closed loop\): unknown key 'rate'"),
        (open_cfg(prompt={"dist": "normal", "mean": 5, "sd": 1}), r"workload\.prompt: unknown key 'sd'"),
        ({k: v for k, v in open_cfg().items() if k != "rate"}, r"workload\.rate: required"),
        ({k: v for k, v in open_cfg().items() if k != "output"}, r"workload\.output: required"),
        (open_cfg(rate=0), r"workload\.rate: must be > 0"),
        (open_cfg(rate=math.nan), r"workload\.rate.*finite"),
        (open_cfg(num_requests=0), r"workload\.num_requests: must be >= 1"),
        (open_cfg(burstiness=2.0), r"burstiness.*only applies to kind 'gamma'"),
        (open_cfg(arrival="gamma", burstiness=0), r"workload\.burstiness: must be > 0"),
        (open_cfg(arrival="hawkes"), r"workload\.arrival.*hawkes"),
        (open_cfg(rescale="yes"), r"workload\.rescale"),
        (open_cfg(kind="batch"), r"workload\.kind.*batch"),
        (open_cfg(shared_prefix={"num_groups": 0, "prefix_len": 4}), r"workload\.shared_prefix\.num_groups"),
        (
            open_cfg(shared_prefix={"groups": 2, "prefix_len": 4}),
            r"workload\.shared_prefix: unknown key 'groups'",
        ),
        (open_cfg(priority={"levels": [0, 1], "weights": [1]}), r"workload\.priority\.weights"),
        (open_cfg(priority={"levels": []}), r"workload\.priority\.levels"),
        (closed_cfg(think_dist="pareto"), r"workload\.think_dist"),
        (closed_cfg(think_time=-1), r"workload\.think_time"),
        ({k: v for k, v in closed_cfg().items() if k != "num_clients"}, r"workload\.num_clients: required"),
        ({"kind": "trace"}, r"workload\.trace: required"),
    ],
)
def test_config_errors_name_the_key(cfg, match):
    with pytest.raises(ConfigError, match=match):
        build_workload(cfg, seed=0)


def test_infinite_rate_is_all_at_zero():
    w = build_workload(open_cfg(rate=math.inf, num_requests=5), seed=0)
    assert [s.arrival_time for s in w.specs] == [0.0] * 5
