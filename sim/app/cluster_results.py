"""A cluster run's SimResult: every request's row (served by a replica, merged across its P/D pair,
waiting at the gateway, rejected there, or not arrived), the replicas' steps, per-replica and cluster
meta. The assembly itself is the single-engine one (sim/app/collect.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pandas as pd

from sim.app.collect import assemble, engine_counters, engine_rows, recorded_end, spec_rows
from sim.app.frontend import apply_frontend
from sim.app.replica import Replica
from sim.app.results import SimResult
from sim.app.streams import unsent
from sim.core.request import Request, Status
from sim.engine.request_log import RequestLog

if TYPE_CHECKING:
    from sim.app.cluster import Cluster


def cluster_rows(c: Cluster) -> list[RequestLog]:
    """The request rows in parts, in turn: each mixed replica's (then its inbox's), the P/D pairs', the
    gateway's queue and rejections, the requests that never came."""
    rows: list[RequestLog] = []
    for r in c.replicas:
        if r.spec.role != "mixed":
            continue  # P/D rows are merged by the coordinator
        rows.append(engine_rows(r.engine, r.index))
        rows.append(spec_rows(r.inbox.remaining(), r.index, "in_flight"))
    if c.disagg is not None:
        rows.append(RequestLog.of(c.disagg.rows()))
    gw = c.gateway
    rows.append(spec_rows((s for s, _ in gw.queue), -1, "in_flight"))
    rejected = RequestLog()
    for spec, reason, t in gw.rejected:
        req = Request(spec)
        req.status, req.finish_reason, req.finish_time, req.queued_time = Status.REJECTED, reason, t, None
        rejected.add(req, -1, "rejected")
    rows.append(rejected)
    never, c.num_unlisted = unsent(c.source, c.listed, c.env.now)
    rows.append(spec_rows(never, -1, "not_arrived"))
    return rows


def replica_meta(r: Replica, counters: dict[str, Any]) -> dict[str, Any]:
    lim = r.setup.limits
    hw, eng = r.spec.run.hardware, r.spec.run.engine
    return {
        "replica": r.index,
        "name": r.spec.name,
        "pool": r.spec.pool,
        "role": r.spec.role,
        "device": r.spec.device,
        "model": r.setup.meta.get("model"),
        "gpu": r.setup.meta.get("gpu"),
        "tensor_parallel_size": hw.tensor_parallel_size,
        "policy": eng.policy,
        "gpu_memory_utilization": eng.gpu_memory_utilization,
        "num_gpu_blocks": lim.num_gpu_blocks,
        "max_model_len": lim.max_model_len,
        "max_num_seqs": lim.max_num_seqs,
        "max_num_batched_tokens": lim.max_num_batched_tokens,
        "prefix_cache": counters["prefix_cache"],
        "num_preemptions": counters["num_preemptions"],
        "num_prefilled": r.engine.num_finished(),
    }


def collect_cluster(c: Cluster, wall: float) -> SimResult:
    cfg = c.cfg
    sim = cfg.base.simulation
    per_replica = []
    pc_total: dict[str, int] = {}
    for r in c.replicas:
        counters = engine_counters(r.engine, r.recorder)
        if r.spec.role != "decode":  # a decode replica's "hits" are the KV it was sent
            for k, v in counters["prefix_cache"].items():
                pc_total[k] = pc_total.get(k, 0) + v
        per_replica.append(replica_meta(r, counters))
    first = c.replicas[0].setup.meta
    gw = c.gateway
    meta = {
        "cluster": True,
        "model": first.get("model"),
        "gpu": first.get("gpu"),
        "cost_model": first.get("cost_model"),
        "profile": first.get("profile"),
        "profile_source": first.get("profile_source"),
        "num_gpu_blocks": sum(r.setup.limits.num_gpu_blocks for r in c.replicas),
        "num_replicas": len(c.replicas),
        "num_gpus": cfg.num_gpus,
        "router": cfg.router.name,
        "router_options": dict(cfg.router.options),
        "gateway": dataclasses.asdict(cfg.gateway),
        "num_gateway_rejected": len(gw.rejected),
        "max_gateway_queue": gw.max_queue_len,
        "replicas": per_replica,
        "prefix_cache": pc_total,
        "num_preemptions": sum(m["num_preemptions"] for m in per_replica),
        "seed": sim.seed,
        "wall_time_s": wall,
        "end_time": recorded_end([r.recorder for r in c.replicas]),
        "disagg": None if c.disagg is None else c.disagg.meta(),
    }
    rows = cluster_rows(c)
    meta["num_unlisted"] = c.num_unlisted
    result = assemble(
        rows,
        [r.recorder for r in c.replicas],
        config=cfg.to_dict(),
        horizon=sim.horizon,
        meta=meta,
        merge_traces=True,
        annotate=lambda df: _annotate(c, df),
    )
    return apply_frontend(result, cfg.base.frontend, c.send_time)


def _annotate(c: Cluster, df: pd.DataFrame) -> pd.DataFrame:
    """The replicas' names and pools (``gateway`` for rows that never left it); the P/D columns."""
    names = {r.index: r.spec.name for r in c.replicas}
    pools = {r.index: r.spec.pool for r in c.replicas}
    df["replica_name"] = df["replica"].map(names).fillna("gateway")
    df["pool"] = df["replica"].map(pools).fillna("")
    if c.disagg is not None:
        df = c.disagg.annotate(df)
    return df
