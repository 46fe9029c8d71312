"""A cluster: N replicas (each a full Engine with its own policy, KV pool, cost model, GPU and TP) on one
SimPy clock, behind a gateway with a router, its own queue, a queue cap and a queue timeout.

This module wires the parts: the replicas (sim/app/replica.py), the shared cards they may sit on
(sim/app/devices.py), the gateway (sim/app/gateway.py), the P/D hand-off (sim/app/disagg.py) and the
result (sim/app/cluster_results.py). Timing rules (why fast-forward stays exact with replicas) are in
sim/app/timing.py: the gateway acts after every replica's step boundary at an instant, and the router
reads a replica mid-run through its ``run_view`` (``Replica.kv_usage``), as it would step by step; with a
router that reads no engine metrics the runs go on past finishes, which the gateway counts from the
same view (sim/app/gateway.py).

``simulate_cluster(cfg)`` is the entry point (a ClusterConfig, a raw dict or a TOML path).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from routers.base import RouterContext, make_router
from sim.app.cluster_config import ClusterConfig, load_cluster
from sim.app.cluster_results import collect_cluster
from sim.app.devices import Devices
from sim.app.frontend import with_frontend
from sim.app.gateway import Gateway
from sim.app.heap import paused
from sim.app.replica import Replica, SetupCache, build_replica
from sim.app.results import SimResult
from sim.app.streams import check_listable, cluster_source
from sim.core.errors import ConfigError
from sim.core.request import RequestSpec


class Cluster:
    """Builds the replicas, the gateway and (for P/D) the KV hand-off; ``run()`` gives a SimResult."""

    def __init__(self, cfg: ClusterConfig, *, fast_forward: bool = True) -> None:
        self.cfg = cfg
        self.env = env = simpy.Environment(initial_time=0.0)
        sim = cfg.base.simulation
        self.horizon = sim.horizon
        self.devices = Devices(cfg.device_overlap)
        resolve_run = SetupCache()
        with paused():  # each replica's KV pool: tens of thousands of blocks that live for the run
            self.replicas: list[Replica] = [
                build_replica(
                    env,
                    i,
                    rs,
                    self.devices.cost_for,
                    self._done_callback(i),
                    record_step_trace=sim.record_step_trace,
                    horizon=sim.horizon,
                    fast_forward=fast_forward,
                    resolve_run=resolve_run,
                )
                for i, rs in enumerate(cfg.replicas)
            ]
        self.max_model_len = max(r.setup.limits.max_model_len for r in self.replicas)
        self.workload, source = cluster_source(cfg, self.max_model_len)
        # [frontend]: the gateway, like a single engine, sees a request after the client -> server input path
        self.source, self.send_time = with_frontend(source, cfg.base.frontend)
        self.listed = check_listable(self.workload, sim.horizon)
        self.num_unlisted = 0  # set when the rows are collected (sim/app/cluster_results.py)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(sim.seed, spawn_key=(500,))))
        front = [r.view for r in self.replicas if r.spec.role in ("mixed", "prefill")]
        router = make_router(cfg.router.name, cfg.router.options, RouterContext(front, rng))
        self.gateway = Gateway(
            env, cfg.gateway, sim.horizon, self.source, self.replicas, router, self.devices
        )
        self.disagg = None
        if cfg.disagg is not None:
            from sim.app.disagg import PDCoordinator

            self.disagg = PDCoordinator(env, sim.horizon, self.replicas, self.gateway, cfg.disagg, rng)
            self.gateway.disagg = self.disagg
        self.gateway.start()

    @property
    def spec_of(self) -> dict[str, RequestSpec]:
        """Every request that arrived at the gateway, by id, as the client sent it."""
        return self.gateway.spec_of

    def _done_callback(self, index: int):
        return lambda spec, now: self.gateway.on_replica_done(index, spec, now)

    def run(self, progress: bool = False) -> SimResult:
        """Simulate; ``progress``: a bar of requests arrived at the gateway (sim/app/progress.py)."""
        from sim.app.progress import run_bar, run_env

        t0 = time.perf_counter()
        run_env(self.env, run_bar(self.workload, "cluster", progress), lambda: len(self.gateway.spec_of))
        return collect_cluster(self, time.perf_counter() - t0)

    def release(self) -> None:
        """Drop each replica's engine and policy (its KV pool: ~29k block objects on an 80 GB card). The
        gateway, the inboxes and the replicas point at each other, a cycle only a full collection frees,
        which runs in one process (a notebook, a comparison) rarely reach: what is heavy goes now. The
        cluster cannot run or be inspected afterwards."""
        for r in self.replicas:
            r.engine.close()
            r.engine = r.policy = None  # type: ignore[assignment]


def run_once(cfg: ClusterConfig, *, fast_forward: bool = True, progress: bool = False) -> SimResult:
    """The results of a cluster run nobody keeps: released once they are collected."""
    c = Cluster(cfg, fast_forward=fast_forward)
    try:
        return c.run(progress)
    finally:
        c.release()


def as_cluster_config(
    cfg: ClusterConfig | dict[str, Any] | str | Path,
    variant: str | None = None,
    overrides: list[str] | None = None,
) -> ClusterConfig:
    """A ClusterConfig from a config object, a raw dict or a TOML path (one variant of it)."""
    _check_api_args(variant=variant, overrides=overrides)
    if isinstance(cfg, ClusterConfig):
        if overrides:
            raise ConfigError("overrides apply to a raw config or a path, not to a built ClusterConfig")
        return cfg
    if isinstance(cfg, str | Path):
        all_ = load_cluster(cfg, overrides)
    elif not isinstance(cfg, dict):
        hint = " (a single engine's config: run it with sim.app.simulate.simulate)" if type(cfg).__name__ == "RunConfig" else ""
        raise ConfigError(f"a cluster config must be a ClusterConfig, a dict of tables or a TOML path; got "
                          f"{type(cfg).__name__}{hint}")
    else:
        from sim.app.cluster_config import cluster_variants

        all_ = cluster_variants(cfg, overrides)
    if variant is None:
        if len(all_) != 1:
            raise ConfigError(f"the config has variants {list(all_)}: name one (variant=...)")
        return next(iter(all_.values()))
    if variant not in all_:
        raise ConfigError(f"no variant {variant!r}; the config has {list(all_)}")
    return all_[variant]


def simulate_cluster(
    cfg: ClusterConfig | dict[str, Any] | str | Path,
    *,
    variant: str | None = None,
    overrides: list[str] | None = None,
    fast_forward: bool = True,
) -> SimResult:
    """Run one cluster deployment; the SimResult's requests and steps carry a ``replica`` column."""
    if not isinstance(fast_forward, bool):
        raise ConfigError(f"fast_forward: expected True or False, got {fast_forward!r}")
    return run_once(as_cluster_config(cfg, variant, overrides), fast_forward=fast_forward)


def simulate_variants(
    path_or_raw: dict[str, Any] | str | Path,
    overrides: list[str] | None = None,
    names: list[str] | None = None,
) -> dict[str, SimResult]:
    """Every variant of a comparison config (or those in ``names``), run one after another."""
    _check_api_args(overrides=overrides, names=names)
    if isinstance(path_or_raw, str | Path):
        cfgs = load_cluster(path_or_raw, overrides)
    else:
        from sim.app.cluster_config import cluster_variants

        cfgs = cluster_variants(path_or_raw, overrides)
    if names:
        missing = [n for n in names if n not in cfgs]
        if missing:
            raise ConfigError(f"no variant(s) {missing}; the config has {list(cfgs)}")
        cfgs = {n: cfgs[n] for n in names}
    from sim.app.streams import check_variant_workloads

    check_variant_workloads(cfgs)  # before the first variant runs
    return {name: run_once(c) for name, c in cfgs.items()}


def _check_api_args(variant: Any = None, overrides: Any = None, names: Any = None) -> None:
    """The Python API's arguments as the CLI's flags would give them: a variant name, a list of
    ``section.key=value`` strings, a list of variant names (one line naming the argument, not a TypeError
    deep inside; a bare string is not taken as its characters)."""
    if variant is not None and not isinstance(variant, str):
        raise ConfigError(f"variant: expected a variant name (a string), got {variant!r}")
    for arg, value, what in (("overrides", overrides, "'section.key=value' strings"), ("names", names, "variant names")):
        if value is None:
            continue
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple) or \
                not all(isinstance(v, str) for v in value):  # fmt: skip
            raise ConfigError(f"{arg}: expected a list of {what}, got {value!r}")
