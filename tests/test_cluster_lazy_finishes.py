"""Cluster replicas' decode runs going on past finishes (sim/app/gateway.py, ``lazy``): the gateway counts
each finish from the run's view at its time, and the run is cut when a request waits in its queue. Same
timestamps and steps as stepping one by one; only routers that read no engine metrics allow it."""

from __future__ import annotations

import pytest

from sim.app.cluster import Cluster, simulate_cluster
from sim.app.cluster_config import cluster_from_dict
from tests.test_cluster import _same_run, raw


def _cluster(cluster: dict, **engine) -> dict:
    return raw(cluster=cluster, engine={"policy": "vllm", "max_model_len": 8192, **engine},
               workload={"rate": 30.0, "num_requests": 200})  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(
    "cluster",
    [
        {"replicas": 3, "router": "least-outstanding"},
        # a tight cap holds requests at the gateway: the runs in flight are cut, later ones end at finishes
        {"replicas": 3, "router": "least-outstanding", "gateway": {"max_outstanding": 5}},
    ],
)
def test_runs_past_finishes_are_exact(cluster: dict, async_scheduling: bool) -> None:
    r = _cluster(cluster, async_scheduling=async_scheduling)
    c = Cluster(cluster_from_dict(r))
    on = c.run()
    assert c.gateway.lazy and not c.gateway.polls
    # the case this is about: finishes inside runs (fewer with the cap: a held request cuts the runs)
    assert c.gateway.num_mid_run_finishes > (0 if "gateway" in cluster else 20)
    if "gateway" in cluster:
        assert c.gateway.max_queue_len > 0
    _same_run(on, simulate_cluster(r, fast_forward=False))


@pytest.mark.parametrize("router", ["least-kv", "tests.test_cluster_lazy_finishes:QuietFirst"])
def test_a_router_that_reads_or_may_read_metrics_keeps_runs_to_finishes(router: str) -> None:
    c = Cluster(cluster_from_dict(_cluster({"replicas": 2, "router": router})))
    c.run()
    assert c.gateway.polls and not c.gateway.lazy and c.gateway.num_mid_run_finishes == 0


class QuietFirst:
    """A plug-in router that does not say what it reads: the lowest polled num_running."""

    name = "quiet-first"

    def __init__(self, options: dict, ctx: object) -> None:
        pass

    def route(self, spec, candidates, now):
        return min(candidates, key=lambda c: (c.num_running, c.index))

    def on_routed(self, spec, replica, now) -> None:
        pass

    def on_done(self, spec, replica, now) -> None:
        pass
