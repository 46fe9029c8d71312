"""Where a run's requests come from: a workload made into the engine-side source, for one engine or for
a cluster's gateway (the [workload] table, or the [[stream]]s merged by time)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.app.cluster_config import ClusterConfig
from sim.core.errors import ConfigError, ServesimError
from sim.core.request import RequestSpec
from sim.engine.sources import ClosedSource, OpenSource
from workloads.synthetic import MAX_LISTED, ClosedWorkload, OpenWorkload, build_workload


def source_for(workload: Any) -> Any:
    """The source that replays ``workload``: its own (sessions: turns wait for their answers), closed
    loop clients, or a fixed list."""
    if hasattr(workload, "make_source"):
        return workload.make_source()
    if isinstance(workload, ClosedWorkload):
        return ClosedSource(workload)
    return OpenSource(workload.specs)  # a trace or merged streams: listed already


def unsent(source: Any, listed: bool = True, end: float = 0.0) -> tuple[list[RequestSpec], int]:
    """The requests the source never handed to an engine: (``not_arrived`` rows, how many more were not
    listed). Rows are its remaining() and, for closed-loop clients, the requests no client got round to
    scheduling (each client still waits for its answer at the horizon), stamped with the earliest they
    could come: the last due time seen or the run's ``end``, whichever is later; no client (session) is named, since none sent them. A workload of more than MAX_LISTED
    requests (``listed`` False) is not listed: the count alone says how many never came. With these,
    finished + rejected + timed out + in flight + not arrived = num_requests."""
    if not listed:
        return [], source.num_remaining()
    out = source.remaining()
    clients = getattr(source, "inner", source)  # a [frontend] wrapper's clients
    if isinstance(clients, ClosedSource):
        w = clients.w
        last = max([end, *(s.arrival_time for s in out)])
        for i in range(clients.issued + len(clients.remaining()), w.num_requests):  # never scheduled
            out.append(dataclasses.replace(w.spec(i, 0, last), session_id=None))
    return out, 0


def check_listable(workload: Any, horizon: float | None) -> bool:
    """Whether a run of ``workload`` can list every request (else: a horizon must bound it)."""
    if len(workload) <= MAX_LISTED:
        return True
    if horizon is None:
        raise ConfigError(f"workload.num_requests: {len(workload)} requests need simulation.horizon (more "
                          f"than {MAX_LISTED} are generated as the clock reaches them, and a run without a "
                          "horizon would hold every one of them)")
    return False


def _rename(spec: RequestSpec, stream: str) -> RequestSpec:
    """A stream's request under a cluster-unique id; its content keys are the stream's own too."""
    segs = None if spec.segments is None else tuple(((stream, k), n) for k, n in spec.segments)
    return dataclasses.replace(spec, request_id=f"{stream}-{spec.request_id}", segments=segs)


def _renamed(e: ServesimError, message: str) -> ServesimError:
    """``e``'s class with ``message`` (a ConfigError where a plug-in's error class takes other arguments)."""
    try:
        return type(e)(message)
    except TypeError:
        return ConfigError(message)


def cluster_source(cfg: ClusterConfig, max_model_len: int | None) -> tuple[Any, Any]:
    """(workload, source) for a cluster: the [workload] table, or the [[stream]]s merged by time."""
    seed = cfg.base.simulation.seed
    n_override = cfg.base.simulation.num_requests
    if cfg.streams:
        specs: list[RequestSpec] = []
        for k, (name, table) in enumerate(cfg.streams):
            if "client_timeout_s" in table:  # as [workload]'s below: nothing would abort the requests
                raise ConfigError(f"[[stream]] {name!r}: client_timeout_s: modelled for a single engine only, not a "
                                  "[cluster] run (the gateway does not abort requests yet); remove it")
            try:
                wl = build_workload(
                    table,
                    seed=np.random.SeedSequence(seed, spawn_key=(300 + k,)),
                    max_model_len=max_model_len,
                    base_dir=cfg.base_dir,
                )
            except ServesimError as e:  # the workload's own message, under the stream that holds it
                raise _renamed(e, f"[[stream]] {name!r}: {e}") from None
            if not isinstance(wl, OpenWorkload):
                raise ConfigError(f"[[stream]] {name!r}: only open-loop or trace workloads can be merged")
            specs.extend(_rename(s, name) for s in wl.specs)
        specs.sort(key=lambda s: s.arrival_time)
        if n_override is not None:
            specs = specs[:n_override]
        wl = OpenWorkload(specs)
        return wl, OpenSource(wl.specs)
    table = dict(cfg.base.workload)
    if "client_timeout_s" in table:
        raise ConfigError("workload.client_timeout_s: modelled for a single engine only, not a [cluster] run "
                          "(the gateway does not abort requests yet); remove it")
    if n_override is not None:
        table["num_requests"] = n_override
    wl = build_workload(table, seed=seed, max_model_len=max_model_len, base_dir=cfg.base_dir)
    return wl, source_for(wl)


def check_variant_workloads(cfgs: Mapping[str, ClusterConfig]) -> None:
    """Every variant's workload built before any variant runs (its keys and values; the engines'
    max_model_len applies when it runs), so a bad one is refused before the first variant's run and named
    by its variant, as a bad [slo] there is. A workload shared by several variants is built once."""
    seen: set[str] = set()
    for name, cfg in cfgs.items():
        sim = cfg.base.simulation
        key = json.dumps([cfg.base.workload, cfg.streams, sim.num_requests, sim.seed], sort_keys=True, default=str)
        if not name or key in seen:
            continue
        seen.add(key)
        try:
            cluster_source(cfg, None)
        except ServesimError as e:
            raise _renamed(e, f"[variants.{name}]: {e}") from None
