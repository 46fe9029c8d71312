"""Routers: each rule on hand-made replica views, then the ones whose point is a cluster-level effect
(prefix-aware routing raises the hit rate; stale metrics make a least-KV router herd; affinity keeps a
session on one replica) in small cluster runs."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from routers import ReplicaView, RouterContext, make_router, router_names
from sim.app.cluster import Cluster
from sim.app.cluster_config import cluster_from_dict
from sim.app.cluster_metrics import summarize_cluster
from sim.core.errors import ConfigError, UnknownNameError
from sim.core.request import RequestSpec


def views(n: int, pools=None, **fields) -> list[ReplicaView]:
    out = []
    for i in range(n):
        v = ReplicaView(index=i, name=f"r{i}", pool=(pools[i] if pools else "default"), num_gpu_blocks=1000)
        for k, vals in fields.items():
            setattr(v, k, vals[i])
        out.append(v)
    return out


def spec(i: int = 0, prompt: int = 100, output: int = 10, **kw) -> RequestSpec:
    return RequestSpec(request_id=f"q{i}", arrival_time=0.0, prompt_len=prompt, output_len=output, **kw)


def router(name: str, vs, **options):
    return make_router(name, options, RouterContext(vs, np.random.default_rng(0)))


def test_registry_lists_every_router():
    assert set(router_names()) >= {
        "round-robin",
        "random",
        "least-outstanding",
        "least-kv",
        "prefix-aware",
        "length-pools",
        "priority-pools",
        "session-affinity",
    }
    with pytest.raises(UnknownNameError, match="round-robin"):
        router("fastest", views(2))
    with pytest.raises(ConfigError, match="unknown option"):
        router("least-outstanding", views(2), weight=2)
    with pytest.raises(ConfigError, match="load_guard"):
        router("prefix-aware", views(2), load_guard=-1)


def test_round_robin_cycles_and_skips_full_replicas():
    vs = views(3)
    rr = router("round-robin", vs)
    assert [rr.route(spec(i), vs, 0).index for i in range(6)] == [0, 1, 2, 0, 1, 2]
    vs[1].room = False
    assert [rr.route(spec(i), vs, 0).index for i in range(4)] == [0, 2, 0, 2]
    for v in vs:
        v.room = False
    assert rr.route(spec(), vs, 0) is None  # held at the gateway


def test_least_outstanding_and_rotating_ties():
    vs = views(3, outstanding=[4, 1, 2])
    lo = router("least-outstanding", vs)
    assert lo.route(spec(), vs, 0).index == 1
    vs = views(3, outstanding=[0, 0, 0])
    lo = router("least-outstanding", vs)
    assert [lo.route(spec(i), vs, 0).index for i in range(3)] == [0, 1, 2]  # equal: take turns


def test_least_kv_prefers_lowest_usage_then_outstanding():
    vs = views(3, kv_usage=[0.5, 0.2, 0.2], outstanding=[0, 5, 3])
    assert router("least-kv", vs).route(spec(), vs, 0).index == 2


def test_random_is_seeded_and_uniform():
    vs = views(4)
    picks = [router("random", vs).route(spec(i), vs, 0).index for i in range(1)]
    r = router("random", vs)
    counts = np.bincount([r.route(spec(i), vs, 0).index for i in range(4000)], minlength=4)
    assert counts.min() > 900 and picks == [router("random", vs).route(spec(0), vs, 0).index]


def _shared(i: int, group: int, prefix: int = 256, prompt: int = 400) -> RequestSpec:
    segs = ((("sys", group), prefix), (("u", f"q{i}"), prompt - prefix))
    return spec(i, prompt=prompt, segments=segs)


def test_prefix_aware_follows_the_prefix_under_the_load_guard():
    vs = views(3)
    pa = router("prefix-aware", vs, load_guard=2)
    first = pa.route(_shared(0, group=7), vs, 0)
    pa.on_routed(_shared(0, group=7), first, 0)
    first.outstanding += 1
    again = pa.route(_shared(1, group=7), vs, 0)
    assert again.index == first.index  # the replica that holds the prefix, though it is busier
    other = pa.route(_shared(2, group=8), vs, 0)
    assert other.index != first.index  # an unseen prefix goes by load
    first.outstanding = 5  # now 5 > 0 + guard 2: load wins
    assert pa.route(_shared(3, group=7), vs, 0).index != first.index
    assert pa.num_guarded == 1
    assert pa.route(spec(9), vs, 0).index != first.index  # unique content: by load


def test_prefix_index_is_bounded_lru():
    vs = views(2)
    pa = router("prefix-aware", vs, capacity_blocks=20, load_guard=100)
    a = _shared(0, group=1, prefix=256, prompt=320)  # 20 full blocks of 16
    pa.on_routed(a, vs[0], 0)
    assert pa.index[0].match(pa._prompt_hashes(a, 16)) == 20
    b = _shared(1, group=2, prefix=256, prompt=320)
    pa.on_routed(b, vs[0], 0)  # evicts a's blocks
    assert pa.index[0].match(pa._prompt_hashes(_shared(2, group=1, prefix=256, prompt=320), 16)) == 0


def test_length_and_priority_pools():
    vs = views(3, pools=["short", "short", "long"])
    lp = router("length-pools", vs, threshold=1000)
    assert lp.route(spec(0, prompt=900, output=200), vs, 0).pool == "long"
    assert lp.route(spec(1, prompt=700, output=200), vs, 0).pool == "short"
    # a long request no long replica can hold goes wherever it fits
    assert lp.route(spec(2, prompt=5000, output=10), vs[:2], 0).pool == "short"
    with pytest.raises(ConfigError, match="no replica is in pool 'huge'"):
        router("length-pools", vs, long_pool="huge")
    vs = views(2, pools=["latency", "throughput"])
    pp = router("priority-pools", vs, pools={"0": "latency", "1": "throughput"})
    assert pp.route(spec(0, priority=0), vs, 0).pool == "latency"
    assert pp.route(spec(1, priority=1), vs, 0).pool == "throughput"
    assert pp.route(spec(2, priority=5), vs, 0).pool == "throughput"  # default: the last mapped pool


def test_session_affinity_sticks_unless_the_guard_moves_it():
    vs = views(3)
    sa = router("session-affinity", vs, load_guard=3)
    a = sa.route(spec(0, session_id="s"), vs, 0)
    sa.on_routed(spec(0, session_id="s"), a, 0)
    a.outstanding = 3
    assert sa.route(spec(1, session_id="s"), vs, 0).index == a.index
    a.outstanding = 4
    moved = sa.route(spec(2, session_id="s"), vs, 0)
    assert moved.index != a.index and sa.num_moved == 1


# ---- cluster-level effects ---------------------------------------------------------------------------------
BASE = {
    "model": {"name": "Llama-3.1-8B", "dtype": "bf16"},
    "hardware": {"gpu": "L40S"},
    "engine": {"policy": "vllm", "max_model_len": 8192, "num_gpu_blocks_override": 1200},
    "workload": {
        "arrival": "poisson",
        "rate": 6.0,
        "num_requests": 400,
        "prompt": {"dist": "lognormal", "mean": 200, "std": 100, "min": 16, "max": 1000},
        "output": {"dist": "lognormal", "mean": 60, "std": 30, "min": 2, "max": 300},
        "shared_prefix": {"num_groups": 12, "prefix_len": 1536},
    },
    "simulation": {"seed": 5},
}


def _run(router_cfg, shared: bool = True, **cluster) -> Cluster:
    r = copy.deepcopy(BASE)
    if not shared:
        del r["workload"]["shared_prefix"]
        r["workload"]["prompt"] = {"dist": "lognormal", "mean": 1500, "std": 800, "min": 16, "max": 6000}
    r["cluster"] = {"replicas": 4, "router": router_cfg, **cluster}
    c = Cluster(cluster_from_dict(r))
    c.result = c.run()
    return c


def _modal_share(c: Cluster, key) -> float:
    """Fraction of requests on the replica that serves most of their group (1 = groups never split)."""
    df = c.result.requests
    groups = df["request_id"].map(lambda rid: key(c.spec_of[rid]))
    top = df.groupby(groups)["replica"].agg(lambda s: s.value_counts().iloc[0]).sum()
    return float(top / len(df))


def test_prefix_aware_raises_the_hit_rate_over_round_robin():
    """12 system prompts of 1536 tokens, 4 replicas that each hold ~19k tokens of KV: round-robin makes
    every replica cache every prompt (and evict), prefix-aware keeps each prompt on one replica."""
    rr_c = _run("round-robin")
    pa_c = _run({"name": "prefix-aware", "load_guard": 8})
    rr, pa = summarize_cluster(rr_c.result), summarize_cluster(pa_c.result)
    assert pa["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.05, (
        pa["prefix_cache_hit_rate"],
        rr["prefix_cache_hit_rate"],
    )
    assert pa["median_ttft_ms"] < rr["median_ttft_ms"]
    group = lambda spec: spec.segments[0][0]  # noqa: E731  ("sys", g)
    assert _modal_share(pa_c, group) > 0.8 > 0.5 > _modal_share(rr_c, group)
    assert min(r["requests_served"] for r in pa["replicas"]) > 0  # new prefixes still spread the load


def test_stale_metrics_make_least_kv_herd():
    """With KV usage polled every 2 s, requests between polls see the same numbers and pile onto one
    replica; read live, least-KV spreads them (no shared prefixes here: herding onto one replica would
    also concentrate prefix hits)."""
    live = summarize_cluster(_run("least-kv", shared=False).result)
    stale = summarize_cluster(_run("least-kv", shared=False, gateway={"poll_interval_s": 2.0}).result)
    assert stale["load_imbalance"] > 1.5 * live["load_imbalance"]
    assert stale["p99_ttft_ms"] > 2 * live["p99_ttft_ms"]


def test_session_affinity_keeps_each_client_on_one_replica():
    r = copy.deepcopy(BASE)
    r["workload"] = {
        "kind": "closed",
        "num_clients": 8,
        "num_requests": 160,
        "think_time": 0.5,
        "prompt": {"dist": "fixed", "value": 300},
        "output": {"dist": "fixed", "value": 30},
    }
    r["cluster"] = {"replicas": 3, "router": "session-affinity"}
    c = Cluster(cluster_from_dict(r))
    df = c.run().requests
    assert (df["status"] == "finished").all() and len(df) == 160
    assert _modal_share_of(df, c) == 1.0
    assert df["replica"].nunique() == 3  # first turns were spread by load
    r["cluster"]["router"] = "round-robin"
    c2 = Cluster(cluster_from_dict(r))
    assert _modal_share_of(c2.run().requests, c2) < 0.8


def _modal_share_of(df, c: Cluster) -> float:
    sess = df["request_id"].map(lambda rid: c.spec_of[rid].session_id)
    return float(df.groupby(sess)["replica"].agg(lambda s: s.value_counts().iloc[0]).sum() / len(df))


def _pick_reference(rotor_next: int, cands: list, key) -> object:
    """Rotor.pick as first written: the least key, then the first index at or after ``next``."""
    best = min(key(c) for c in cands)
    tied = [c for c in cands if key(c) == best]
    return min(tied, key=lambda c: (c.index - rotor_next) % (1 << 30))


def test_rotor_pick_matches_the_two_pass_rule() -> None:
    """The one-pass pick chooses what the min-then-rotate rule chooses, ties and wrap-around included."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from routers.base import Rotor

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(0, 15), st.randoms())
    def check(keys: list[int], nxt: int, rnd) -> None:
        views = [ReplicaView(index=i, name=f"r{i}") for i in range(len(keys))]
        for v, k in zip(views, keys, strict=True):
            v.outstanding = k
        rnd.shuffle(views)  # candidates need not come in index order
        rotor = Rotor()
        rotor.next = nxt
        want = _pick_reference(nxt, views, lambda c: c.outstanding)
        got = rotor.pick(views, lambda c: c.outstanding)
        assert got is want
        assert rotor.next == want.index + 1

    check()


def test_least_outstanding_pass_is_the_generic_pick_among_views_with_room() -> None:
    """The router's one native pass over the gateway's list chooses what ``pick(with_room(...))`` with the
    outstanding count chooses (rooms, ties, wrap-around, numpy indices), and moves the rotor alike."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from routers.base import Rotor, with_room
    from routers.least_outstanding import LeastOutstanding

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), min_size=1, max_size=12),
           st.integers(0, 15), st.randoms())  # fmt: skip
    def check(rows: list[tuple[int, bool, bool]], nxt: int, rnd) -> None:
        views = [ReplicaView(index=np.int64(i) if as_np else i, name=f"r{i}", outstanding=k, room=room)
                 for i, (k, room, as_np) in enumerate(rows)]  # fmt: skip
        rnd.shuffle(views)
        router, generic = LeastOutstanding(), Rotor()
        router.rotor.next = generic.next = nxt
        roomy = with_room(views)
        want = generic.pick(roomy, lambda c: c.outstanding) if roomy else None
        assert router.route(spec(), views, 0.0) is want
        assert router.route(spec(), tuple(views), 0.0) is (generic.pick(roomy, lambda c: c.outstanding)
                                                           if roomy else None)  # the generic path, a tuple
        assert router.rotor.next == generic.next

    check()
    from types import SimpleNamespace

    like = [SimpleNamespace(index=i, name=f"r{i}", outstanding=k, room=True) for i, k in enumerate([2, 1, 1])]
    assert LeastOutstanding().route(spec(), like, 0.0).name == "r1"  # view-like objects: the generic pick


def test_the_gateway_calls_the_hooks_a_router_defines_and_skips_the_base_no_ops() -> None:
    """BaseRouter's on_routed / on_done do nothing and are not called; a router's own hooks (on its class
    or set on the instance) are called once a request each."""
    from routers.least_outstanding import LeastOutstanding

    class Counting(LeastOutstanding):
        def on_done(self, spec, replica, now):
            self.done = getattr(self, "done", 0) + 1

    raw = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
           "engine": {"policy": "vllm", "max_num_seqs": 32},
           "workload": {"num_requests": 40, "rate": 20.0, "prompt": {"dist": "fixed", "value": 64},
                        "output": {"dist": "fixed", "value": 8}},
           "cluster": {"replicas": 2, "router": "least-outstanding"}}  # fmt: skip
    c = Cluster(cluster_from_dict(raw))
    assert c.gateway._on_routed is None and c.gateway._on_done is None  # the base no-ops: skipped
    c = Cluster(cluster_from_dict(raw))
    router = Counting()
    routed: list[str] = []
    router.on_routed = lambda spec, replica, now: routed.append(spec.request_id)  # on the instance
    c.gateway.router = router  # handed over: its hooks are looked up then
    res = c.run()
    assert (res.requests["status"] == "finished").all()
    assert len(routed) == 40 and router.done == 40


def test_a_replica_view_copies_pickles_and_extends_compiled_or_not() -> None:
    """The view is a compiled class when the build is current: plug-ins still copy, pickle, replace and
    subclass it, and give it a numpy index, as they could the interpreted dataclass."""
    import dataclasses
    import pickle

    v = ReplicaView(index=np.int64(3), name="r3", outstanding=2, kv_usage=np.float64(0.25))
    again = pickle.loads(pickle.dumps(v))
    assert again == v and again is not v and copy.deepcopy(v) == v
    assert dataclasses.replace(v, outstanding=5).outstanding == 5 and v.outstanding == 2

    class Tagged(ReplicaView):
        def tag(self) -> str:
            return f"{self.name}/{self.pool}"

    t = Tagged(index=1, name="r1", pool="long")
    t.outstanding += 1
    assert t.tag() == "r1/long" and t.outstanding == 1 and isinstance(t, ReplicaView)
    v.num_running, v.num_waiting, v.kv_usage = np.int64(4), np.int64(0), np.float32(0.5)  # a policy's numbers

    # a view pickled by a process of the other kind (interpreted here, compiled there, or the reverse)
    import os
    import subprocess
    import sys

    from sim import native

    code = ("import pickle, sys; from routers.view import ReplicaView; "
            "sys.stdout.buffer.write(pickle.dumps(ReplicaView(index=2, name='r2', outstanding=3, room=False)))")
    env = {**os.environ, native.PURE_ENV: "0" if not native.active() else "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120, check=True)
    assert pickle.loads(out.stdout) == ReplicaView(index=2, name="r2", outstanding=3, room=False)
