"""The checks of a cluster config across its replicas and settings, made when it loads (sim/app/cluster_config.py
calls them): replicas sharing a device, the P/D KV hand-off, and settings that would change nothing (gateway
queue limits no request ever meets, a metrics poll no router reads, a device overlap with no shared device, a
P/D table without P/D replicas; in a comparison a shared setting stands while some variant uses it)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError, ServesimError

if TYPE_CHECKING:  # the config types live in cluster_config, which imports this module
    from sim.app.cluster_config import ClusterConfig, ReplicaSpec


def unused_settings(cfg: ClusterConfig, cl: dict[str, Any], router: Any) -> dict[str, Any]:
    """``{setting: (path in the raw config, why it changes nothing or None where it is used)}`` for each
    cluster setting the config gives that may do nothing; ``router``: the front router as
    ``check_router`` built it (None: a plug-in, which may hold requests and read anything itself)."""
    out: dict[str, Any] = {}
    gw = cfg.gateway
    gw_raw = cl.get("gateway") or {}
    for key in ("max_queue", "queue_timeout_s"):
        if key in gw_raw:
            why = None
            if gw.max_outstanding is None and router is not None:
                why = (f"[cluster.gateway] {key} = {gw_raw[key]!r}: the gateway holds a request only while every "
                       f"replica is at max_outstanding (router {cfg.router.name!r} sends each one on at once), and "
                       f"max_outstanding is not set, so {key} would do nothing; allowed: set [cluster.gateway] "
                       f"max_outstanding too, or leave {key} out")
            out[f"gateway.{key}"] = (("cluster", "gateway", key), why)
    if gw.poll_interval_s > 0:
        why = None
        if cfg.disagg is None and router is not None and not getattr(router, "reads_engine_metrics", True):
            why = (f"[cluster.gateway] poll_interval_s = {gw_raw.get('poll_interval_s')!r}: router "
                   f"{cfg.router.name!r} reads no engine metrics (it routes by the gateway's own counts), so "
                   "no poll would be read; allowed: a router that reads them (e.g. least-kv), or leave "
                   "poll_interval_s out")
        out["gateway.poll_interval_s"] = (("cluster", "gateway", "poll_interval_s"), why)
    if cfg.device_overlap > 0:
        devices = [r.device for r in cfg.replicas if r.device is not None]
        why = None
        if len(set(devices)) == len(devices):
            why = (f"[cluster] device_overlap = {cl.get('device_overlap')!r}: it applies only when replicas share "
                   "a device (two or more replicas with the same [[replica]] device), and no replicas here share "
                   "one; allowed: leave device_overlap out, or put replicas on one device")
        out["device_overlap"] = (("cluster", "device_overlap"), why)
    d_raw = cl.get("disagg")
    if isinstance(d_raw, dict) and d_raw:
        why = None
        if cfg.disagg is None:
            given = ", ".join(f"{k} = {v!r}" for k, v in d_raw.items())
            why = (f"[cluster.disagg] {given}: [cluster.disagg] applies only to P/D disaggregation (replicas with "
                   "role = \"prefill\" and role = \"decode\"), and every replica here is mixed; allowed: leave "
                   "[cluster.disagg] out, or give [[replica]] tables role = \"prefill\" / \"decode\"")
        out["disagg"] = (("cluster", "disagg"), why)
    return out


def refuse_unused(found: dict[str, dict[str, Any]], own: dict[str, dict[str, Any]] | None = None) -> None:
    """Refuse a setting that changes nothing (``unused_settings``), by variant (``{variant: found}``, "" for
    a config without variants). A variant's own setting (``own[variant]``: its [variants.NAME] table) is
    judged in that variant alone; one of the shared part (or a --set) is kept while some variant uses it."""
    keys: list[str] = []
    for f in found.values():
        keys.extend(k for k in f if k not in keys)
    for key in keys:
        having = [(name, f[key]) for name, f in found.items() if key in f]
        for name, (path, why) in having:
            if why is not None and _sets(own.get(name) if own else None, path):
                raise ConfigError(f"[variants.{name}]: {why}" if name else why)
        if all(why is not None for _, (_, why) in having):
            name, (_, why) = having[0]
            raise ConfigError(f"in every variant ({', '.join(n for n, _ in having)}): {why}" if name else why)


def _sets(table: dict[str, Any] | None, path: tuple[str, ...]) -> bool:
    """Whether ``table`` (a variant's own table) gives the setting at ``path``."""
    t: Any = table
    for k in path:
        if not isinstance(t, dict) or k not in t:
            return False
        t = t[k]
    return True


# ---- across replicas -----------------------------------------------------------------------------------
def check_devices(replicas: list[ReplicaSpec]) -> None:
    """Replicas sharing a device: the same card and TP, and their gpu_memory_utilization within the card."""
    groups: dict[str, list[ReplicaSpec]] = {}
    for r in replicas:
        if r.device is not None:
            groups.setdefault(r.device, []).append(r)
    for dev, reps in groups.items():
        kinds = {(r.run.hardware.gpu, r.run.hardware.tensor_parallel_size) for r in reps}
        if len(kinds) > 1:
            raise ConfigError(
                f"device {dev!r}: replicas sharing it must have the same gpu and TP, got {sorted(kinds)}"
            )
        total = sum(r.run.engine.gpu_memory_utilization for r in reps)
        if total > 1.0 + 1e-9:
            raise ConfigError(
                f"device {dev!r}: gpu_memory_utilization of its replicas adds up to {total:.2f} > 1 "
                f"({', '.join(r.name for r in reps)}: replicas with this device share the card, a [[replica]]'s "
                f"count copies too); allowed: utilizations summing to at most 1 (e.g. "
                f"{math.floor(100 / len(reps)) / 100:.2f} each), or a device each"
            )


def check_kv_handoff(replicas: list[ReplicaSpec]) -> None:
    """A prefill replica's KV goes to a decode replica as it is: the same model, KV block size and KV dtype
    on both sides (the decode replica reads the blocks as the prefill replica wrote them). Compared as the
    engines resolve them: a block size left out is the preset's, ``kv_cache_dtype = "auto"`` the model's dtype."""
    from sim.cost.models import get_model

    def model(r: ReplicaSpec) -> str:
        try:
            return get_model(r.run.model.name).name  # an alias is the same model
        except ServesimError:
            return str(r.run.model.name)  # refused by name where the replica is built

    first = replicas[0]
    mine = _kv_layout(first)
    for r in replicas[1:]:
        diff = [] if model(r) == model(first) else [f"model {first.run.model.name!r} vs {r.run.model.name!r}"]
        theirs = _kv_layout(r)
        for key in ("block_size", "kv_cache_dtype"):
            a, b = mine.get(key), theirs.get(key)
            if a is not None and b is not None and a[0] != b[0]:  # None: refused where the replica is built
                diff.append(f"{key} {a[1]} vs {b[1]}")
        if diff:
            raise ConfigError(f"replicas {first.name!r} and {r.name!r}: the KV handed from prefill to decode needs "
                              f"the same model, block_size and kv_cache_dtype on every P/D replica; got "
                              f"{', '.join(diff)}")


def _kv_layout(r: ReplicaSpec) -> dict[str, tuple[Any, str]]:
    """``{key: (resolved value, how to show it)}`` for the replica's KV block size and KV dtype; a key is left
    out where its value does not resolve (the replica's own build reports why)."""
    from sim.app.setup import resolve
    from sim.cost.modelspec import dtype_format, normalize_dtype

    e = r.run.engine
    out: dict[str, tuple[Any, str]] = {}
    try:
        bs = resolve(r.run).limits.block_size
        out["block_size"] = (bs, repr(bs) if e.block_size is not None else f"{bs} (the {e.policy} preset's default)")
    except ServesimError:
        pass
    kv = dtype_format(e.kv_cache_dtype)  # vLLM's spellings of one layout: "fp8" is fp8_e4m3, half is fp16
    if kv == "auto":
        try:  # the model's dtype; quantized weights keep 16-bit activations ("auto" = bf16)
            d = normalize_dtype(r.run.model.dtype)
        except ServesimError:
            return out
        kv = d if d in ("bf16", "fp16", "fp32") else "bf16"
        out["kv_cache_dtype"] = (kv, f"{e.kv_cache_dtype!r} (= {kv!r})")
    else:
        out["kv_cache_dtype"] = (kv, repr(e.kv_cache_dtype))
    return out
