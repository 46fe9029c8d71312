"""A finished run leaves nothing heavy behind for the cycle collector: its KV pools go with their last
reference, so many runs in one process (a notebook, a sizing search, a comparison) do not pile up ~29k
block objects a replica until a full collection, which such a process rarely reaches."""

from __future__ import annotations

import gc

from sim.app.cluster import simulate_cluster
from sim.app.config import config_from_dict
from sim.app.simulate import simulate

RAW = {"model": {"name": "Meta-Llama-3-8B"}, "hardware": {"gpu": "A100-80GB-SXM"},
       "engine": {"policy": "vllm", "max_num_seqs": 64},
       "workload": {"num_requests": 200, "rate": 10.0, "prompt": {"dist": "fixed", "value": 500},
                    "output": {"dist": "fixed", "value": 60}}}  # fmt: skip


def _blocks() -> int:
    return sum(type(o).__name__ == "KVBlock" for o in gc.get_objects())


def _leftover(run) -> int:
    """KV block objects still alive after ``run()`` returned and its result was dropped, with the collector
    off throughout (only reference counting frees anything)."""
    gc.collect()
    before = _blocks()
    was = gc.isenabled()
    gc.disable()
    try:
        res = run()
        assert len(res.requests) == 200
        del res
        return _blocks() - before
    finally:
        if was:
            gc.enable()


def test_an_engine_run_frees_its_kv_pool_by_reference_counting():
    # the engine and its fast-forward referred to each other: the pool waited for a full collection
    assert _leftover(lambda: simulate(config_from_dict(RAW))) == 0


def test_a_cluster_run_frees_its_replicas_kv_pools_by_reference_counting():
    # gateway, inboxes and replicas refer to each other, and each replica's loop waits for a push in a
    # frame that holds its policy: simulate_cluster closes the loops and drops the engines
    raw = {**RAW, "cluster": {"replicas": 2, "router": "least-outstanding"}}
    assert _leftover(lambda: simulate_cluster(raw)) == 0
