"""Cluster configuration: a run config (the replica template) plus ``[cluster]``, ``[[replica]]``,
``[[stream]]`` and ``[variants.NAME]`` tables, as frozen dataclasses.

::

    [model] / [hardware] / [engine]      the template every replica starts from
    [workload] / [simulation] / [slo]    shared by the whole cluster, as for one engine

    [cluster]
    replicas = 4                  # N copies of the template, or a [[replica]] list (not both)
    router = "least-kv"           # or a table: [cluster.router] name = "length-pools", threshold = 8192
    device_overlap = 0.0          # replicas sharing a card: how much two busy instances overlap (below)
    [cluster.gateway]
    max_queue = 10000             # requests waiting at the gateway; beyond it they are rejected
    queue_timeout_s = 60          # a request waiting longer at the gateway is rejected
    max_outstanding = 64          # per replica; a request waits at the gateway while all are full
    poll_interval_s = 0.5         # metrics staleness a router that reads them sees (0 = live; else >= 1e-4 s)
    [cluster.disagg]              # only with role = "prefill" / "decode" replicas (sim/app/disagg.py)
    link_bandwidth_gb_s = 50      link_latency_ms = 0.05    decode_router = "least-outstanding"

    [[replica]]                   # overrides on top of the template
    name = "long"  count = 1  pool = "long"  role = "mixed"  device = "gpu0"
    hardware = { gpu = "H100 SXM", tensor_parallel_size = 2 }
    engine = { max_num_seqs = 64 }

    [[stream]]                    # optional: several open-loop workloads merged by arrival time
    name = "chat"  rate = 4  num_requests = 500  prompt = ...  output = ...  priority = {levels = [0]}

    [variants.tp2]                # optional: named variants merged over everything above (tables merge,
    replica = [ ... ]             # lists replace), run one after another for a comparison

Replicas with the same ``device`` share one card (e.g. two instances at ``gpu_memory_utilization``
0.45; the ``count`` copies of one ``[[replica]]`` with a ``device`` are such replicas): each step of one
runs ``1 + (1 - device_overlap) x (other busy instances)`` times as long as alone, i.e. busy instances
share the card's compute and bandwidth (0 = time slicing, nothing overlaps).

A setting that would change nothing is refused, as a bad value is (sim/app/cluster_checks.py): the
gateway's queue limits without ``max_outstanding`` (a built-in router holds a request at the gateway only
while every replica is full), ``poll_interval_s`` with a router that reads no engine metrics,
``device_overlap`` with no shared device, and ``[cluster.disagg]`` without prefill/decode replicas. In a
comparison a setting of the shared part is kept when some variant uses it (``[cluster.disagg]`` for the P/D
variants beside a colocated one).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routers.base import ReplicaView, check_router, resolve_router_name
from sim.app.cluster_checks import (
    check_devices,
    check_kv_handoff,
    refuse_unused,
    unused_settings,
)
from sim.app.config import (
    CLUSTER_TABLES,
    RunConfig,
    apply_overrides,
    check_rate_scales,
    config_from_dict,
    override_key,
)
from sim.app.variant_names import check_variant_name, check_variant_names, variant_label
from sim.core.errors import ConfigError
from sim.core.fields import load_toml

RUN_SECTIONS = ("model", "hardware", "engine", "workload", "simulation", "slo", "frontend", "cost")
TOP_KEYS = (*RUN_SECTIONS, *CLUSTER_TABLES)
# Each replica is a whole engine with its own KV pool (tens of thousands of blocks, milliseconds to build):
# a few thousand is already hours of set-up, so a larger count is refused before anything is built.
MAX_REPLICAS = 4096
CLUSTER_KEYS = ("replicas", "router", "gateway", "disagg", "device_overlap")
REPLICA_KEYS = ("name", "count", "pool", "role", "device", "model", "hardware", "engine")
GATEWAY_KEYS = ("max_queue", "queue_timeout_s", "max_outstanding", "poll_interval_s")
DISAGG_KEYS = ("link_bandwidth_gb_s", "link_latency_ms", "decode_router")
ROLES = ("mixed", "prefill", "decode")
# The shortest metrics poll interval: below it the polls (one event per interval, each reading every
# replica) outnumber the engines' own steps by orders of magnitude, and at a tiny one ``now + interval``
# rounds to ``now``: the poll rescheduled itself at the same instant for ever (1e-20 s hung the run).
MIN_POLL_INTERVAL_S = 1e-4


@dataclass(frozen=True)
class RouterSpec:
    name: str = "round-robin"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewayConfig:
    max_queue: int | None = None
    queue_timeout_s: float | None = None
    max_outstanding: int | None = None
    poll_interval_s: float = 0.0


@dataclass(frozen=True)
class DisaggConfig:
    """The KV hand-off link. Defaults: one 400 Gb/s RDMA NIC per GPU (50 GB/s) and a few tens of µs,
    the class of link P/D deployments use (an assumption, not a measurement; set yours)."""

    link_bandwidth_gb_s: float = 50.0
    link_latency_ms: float = 0.05
    decode_router: RouterSpec = field(default_factory=lambda: RouterSpec("least-outstanding"))


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    pool: str
    role: str
    device: str | None
    run: RunConfig  # model / hardware / engine of this replica (workload etc. are the cluster's)


@dataclass(frozen=True)
class ClusterConfig:
    base: RunConfig
    replicas: tuple[ReplicaSpec, ...]
    router: RouterSpec = field(default_factory=RouterSpec)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    disagg: DisaggConfig | None = None
    device_overlap: float = 0.0
    streams: tuple[tuple[str, dict[str, Any]], ...] = ()
    base_dir: str | None = None  # the config file's folder: relative trace paths resolve against it
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.raw)

    @property
    def num_gpus(self) -> int:
        """Cards the deployment uses: a shared device counts once."""
        seen: dict[str, int] = {}
        n = 0
        for r in self.replicas:
            tp = r.run.hardware.tensor_parallel_size
            if r.device is None:
                n += tp
            elif r.device not in seen:
                seen[r.device] = tp
                n += tp
        return n


# ---- raw dicts ---------------------------------------------------------------------------------------
def read_toml(path: str | Path) -> dict[str, Any]:
    return load_toml(path)


def is_cluster_config(raw_or_path: dict[str, Any] | str | Path) -> bool:
    """True for configs ``servesim run`` should hand to sim.app.cluster (cluster, replicas, streams, variants)."""
    raw = read_toml(raw_or_path) if isinstance(raw_or_path, str | Path) else raw_or_path
    return any(k in raw for k in CLUSTER_TABLES)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; anything else (lists included) replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def variants(raw: dict[str, Any], overrides: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: raw config}`` for each ``[variants.NAME]`` (``{"": raw}`` without variants); ``--set``
    overrides apply last, to every variant."""
    for o in overrides or ():
        if override_key(o).split(".")[0] == "variants":
            raise ConfigError(f"--set {o!r}: --set applies to every variant, after the merge; allowed: a "
                              "SECTION.KEY of the run (e.g. cluster.router), or edit [variants.NAME] in the file")
    table = raw.get("variants")
    base = {k: v for k, v in raw.items() if k != "variants"}
    if table is None:
        return {"": apply_overrides(copy.deepcopy(base), list(overrides or []))}
    if not isinstance(table, dict) or not table or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError("[variants] must hold one or more tables: [variants.NAME]")
    out = {}
    for name, over in table.items():
        check_variant_name(name)
        if not isinstance(over.get("description", ""), str):
            raise ConfigError(f"{variant_label(name)} description: expected a string, got {over['description']!r}")
        if "variants" in over:  # the merge would carry it into a run: said as what it is
            raise ConfigError(f"[variants.{name}]: holds a [variants] table of its own; variants cannot be nested; "
                              "allowed: [variants.NAME] tables at the top level only")
        bad = sorted(set(over) - set(TOP_KEYS) - {"description"})
        if bad:
            raise ConfigError(f"[variants.{name}]: unknown key(s) {bad}; known: {', '.join(TOP_KEYS)}")
        merged = deep_merge(base, {k: v for k, v in over.items() if k != "description"})
        out[str(name)] = apply_overrides(merged, list(overrides or []))
    check_variant_names(list(out))
    return out


# ---- parsing -----------------------------------------------------------------------------------------
def _table(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table, got {raw!r}")
    return raw


def _check(raw: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    bad = sorted(set(raw) - set(allowed))
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {bad}; known: {', '.join(allowed)}")


# The largest count (int32, as the engine's counts in sim/app/config.py) and the longest time (seconds, the
# latest arrival a run takes, sim/core/spec.py) a cluster setting may hold: past them a value is a typo.
_MAX_COUNT = 2**31 - 1
_MAX_SECONDS = 1e9


def _opt_number(raw: dict[str, Any], key: str, where: str, *, integer: bool, lo: float,
                hi: float | None = None, unit: str = "") -> Any:
    """``raw[key]`` (None when absent), a finite number (an integer with ``integer``) from ``lo`` to ``hi``
    (default: the largest count or the longest time); ``unit`` follows the range in the message."""
    v = raw.get(key)
    if v is None:
        return None
    if hi is None:
        hi = _MAX_COUNT if integer else _MAX_SECONDS
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    if integer:
        ok = ok and float(v).is_integer()
    if not ok:
        raise ConfigError(
            f"{where}.{key}: expected {'an integer' if integer else 'a number'} from {lo:g} to "
            f"{hi if integer else format(hi, 'g')}{unit}, got {v!r}"
        )
    return int(v) if integer else float(v)


def _router_spec(raw: Any, where: str, default: str) -> RouterSpec:
    if raw is None:
        return RouterSpec(default)
    if isinstance(raw, str):
        return RouterSpec(resolve_router_name(raw, where))
    t = dict(_table(raw, where))
    name = t.pop("name", default)
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected a router name, got {name!r}")
    return RouterSpec(resolve_router_name(name, f"{where}.name"), t)


def _replica_run(base_raw: dict[str, Any], rep: dict[str, Any], where: str) -> RunConfig:
    sections = {k: base_raw.get(k, {}) for k in ("model", "hardware", "engine", "simulation", "slo")}
    for k in ("model", "hardware", "engine"):
        sections[k] = deep_merge(_table(sections[k], f"[{k}]"), _table(rep.get(k), f"{where}.{k}"))
    try:
        return config_from_dict(sections)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def cluster_from_dict(raw: dict[str, Any], base_dir: str | Path | None = None) -> ClusterConfig:
    """Validate a raw cluster config (one variant) into a ClusterConfig; nothing is built or written."""
    cfg, unused = _cluster_and_unused(raw, base_dir)
    refuse_unused({"": unused})
    return cfg


def _cluster_and_unused(raw: dict[str, Any], base_dir: str | Path | None) -> tuple[ClusterConfig, dict[str, Any]]:
    """The ClusterConfig of ``raw`` (every value checked) and ``unused_settings`` of it."""
    _check(raw, TOP_KEYS, "cluster config")
    if "variants" in raw:
        raise ConfigError(
            "this config has [variants]: pick one (sim.app.cluster_config.variants) or run them all"
        )
    base = config_from_dict({k: raw[k] for k in RUN_SECTIONS if k in raw})
    cl = _table(raw.get("cluster"), "[cluster]")
    _check(cl, CLUSTER_KEYS, "[cluster]")
    reps_raw = raw.get("replica")
    n = cl.get("replicas")
    if reps_raw is not None and n is not None:
        raise ConfigError("give [cluster] replicas = N or a [[replica]] list, not both")
    if reps_raw is None:
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REPLICAS:
            raise ConfigError(f"[cluster] replicas: expected an integer from 1 to {MAX_REPLICAS}, got {n!r}")
        reps_raw = [{"name": f"r{k}"} for k in range(n)]
    if not isinstance(reps_raw, list) or not reps_raw:
        raise ConfigError("[[replica]] must be a non-empty list of tables")
    replicas: list[ReplicaSpec] = []
    for j, rep in enumerate(reps_raw):
        where = f"[[replica]] #{j + 1}"
        rep = _table(rep, where)
        _check(rep, REPLICA_KEYS, where)
        count = rep.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REPLICAS - len(replicas):
            raise ConfigError(f"{where}.count: expected an integer from 1 to {MAX_REPLICAS - len(replicas)} "
                              f"(at most {MAX_REPLICAS} replicas in all), got {count!r}")
        role = rep.get("role", "mixed")
        if role not in ROLES:
            raise ConfigError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
        for key in ("name", "pool", "device"):  # a blank device would be one card named ''
            if key in rep and (not isinstance(rep[key], str) or not rep[key].strip()):
                raise ConfigError(f"{where}.{key}: expected a non-empty string, got {rep[key]!r}")
        name = str(rep.get("name", f"r{len(replicas)}"))
        device = rep.get("device")
        run = _replica_run(raw, rep, where)
        for k in range(count):  # the copies of a replica with a device share that card (module doc)
            rname = f"{name}{k}" if count > 1 else name
            replicas.append(ReplicaSpec(rname, str(rep.get("pool", "default")), role, device, run))
    names = [r.name for r in replicas]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise ConfigError(f"[[replica]] names must be unique, repeated: {dup}")
    check_devices(replicas)
    gw = _table(cl.get("gateway"), "[cluster.gateway]")
    _check(gw, GATEWAY_KEYS, "[cluster.gateway]")
    gateway = GatewayConfig(
        max_queue=_opt_number(gw, "max_queue", "[cluster.gateway]", integer=True, lo=0),
        queue_timeout_s=_opt_number(gw, "queue_timeout_s", "[cluster.gateway]", integer=False, lo=0),
        max_outstanding=_opt_number(gw, "max_outstanding", "[cluster.gateway]", integer=True, lo=1),
        poll_interval_s=_poll_interval(gw),
    )
    overlap = _opt_number(cl, "device_overlap", "[cluster]", integer=False, lo=0, hi=1) or 0.0
    roles = {r.role for r in replicas}
    disagg = None
    if roles & {"prefill", "decode"}:
        if roles != {"prefill", "decode"}:
            raise ConfigError(
                "disaggregation needs prefill and decode replicas and no mixed ones; "
                f"roles given: {sorted(roles)}"
            )
        for r in replicas:
            if r.role == "decode" and r.run.engine.enable_prefix_caching is False:
                raise ConfigError(
                    f"replica {r.name!r}: decode replicas receive the KV through their prefix cache; "
                    "enable_prefix_caching must stay on"
                )
        check_kv_handoff(replicas)
        disagg = _disagg(cl.get("disagg"))
    else:  # a comparison's base may set the link for its P/D variants: checked here (keys and values);
        _disagg(cl.get("disagg"))  # unused by every variant, it is refused (unused_settings)
    streams = _streams(raw.get("stream"))
    if streams and raw.get("workload"):
        raise ConfigError("give a [workload] table or [[stream]] tables, not both")
    router = _router_spec(cl.get("router"), "[cluster].router", "round-robin")
    # built once over the replicas the config names (as sim/app/cluster.py hands them), so a bad option or
    # pool is refused now: before any replica is built, and before any other variant runs
    views = [ReplicaView(index=i, name=r.name, pool=r.pool, role=r.role) for i, r in enumerate(replicas)]
    built = check_router(router.name, router.options, [v for v in views if v.role in ("mixed", "prefill")])
    if disagg is not None:
        check_router(disagg.decode_router.name, disagg.decode_router.options, [v for v in views if v.role == "decode"])
    cfg = ClusterConfig(
        base=base,
        replicas=tuple(replicas),
        router=router,
        gateway=gateway,
        disagg=disagg,
        device_overlap=overlap,
        streams=streams,
        base_dir=None if base_dir is None else str(base_dir),
        raw=copy.deepcopy(raw),
    )
    return cfg, unused_settings(cfg, cl, built)


def _poll_interval(gw: dict[str, Any]) -> float:
    """``[cluster.gateway] poll_interval_s``: 0 (live: the router reads the engines' metrics as of each
    routing decision) or at least ``MIN_POLL_INTERVAL_S``."""
    v = gw.get("poll_interval_s")
    msg = (f"[cluster.gateway].poll_interval_s: expected 0 (live metrics, read at every routing decision) or a "
           f"number from {MIN_POLL_INTERVAL_S:g} to {_MAX_SECONDS:g} s, got {v!r}")
    try:
        out = _opt_number(gw, "poll_interval_s", "[cluster.gateway]", integer=False, lo=0)
    except ConfigError:
        raise ConfigError(msg) from None
    if out is None:
        return 0.0
    if 0 < out < MIN_POLL_INTERVAL_S:
        raise ConfigError(msg)
    return out


def _disagg(raw: Any) -> DisaggConfig:
    """``[cluster.disagg]``: the KV hand-off link and the decode router, every value checked."""
    d = _table(raw, "[cluster.disagg]")
    _check(d, DISAGG_KEYS, "[cluster.disagg]")
    # A KV hand-off link: from a slow TCP path (0.01 GB/s) to well past NVLink; latency up to a minute.
    bw = _opt_number(d, "link_bandwidth_gb_s", "[cluster.disagg]", integer=False, lo=0.01, hi=1e5, unit=" GB/s")
    lat = _opt_number(d, "link_latency_ms", "[cluster.disagg]", integer=False, lo=0, hi=60_000, unit=" ms")
    dflt = DisaggConfig()
    return DisaggConfig(
        link_bandwidth_gb_s=dflt.link_bandwidth_gb_s if bw is None else bw,
        link_latency_ms=dflt.link_latency_ms if lat is None else lat,
        decode_router=_router_spec(d.get("decode_router"), "[cluster.disagg].decode_router", "least-outstanding"),
    )


def _streams(raw: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError("[[stream]] must be a non-empty list of workload tables")
    out = []
    for j, s in enumerate(raw):
        s = dict(_table(s, f"[[stream]] #{j + 1}"))
        name = s.pop("name", f"s{j}")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"[[stream]] #{j + 1}: name {name!r}; allowed: a non-empty string")
        if s.get("kind", "open") not in ("open", "trace") and "trace" not in s:
            raise ConfigError(f"[[stream]] {name!r}: only open-loop or trace streams can be merged")
        out.append((name, s))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"[[stream]] names must be unique, got {names}")
    return tuple(out)


def load_cluster(path: str | Path, overrides: list[str] | None = None) -> dict[str, ClusterConfig]:
    """Every variant of a cluster config file (``{"": cfg}`` without variants), validated."""
    p = Path(path)
    raw = read_toml(p)
    check_rate_scales(raw)  # the file's and the --set's (a user's bound; sim/app/config.py)
    check_rate_scales(apply_overrides({}, list(overrides or [])))
    return cluster_variants(raw, overrides, p.parent)


def cluster_variants(raw: dict[str, Any], overrides: list[str] | None = None,
                     base_dir: str | Path | None = None) -> dict[str, ClusterConfig]:
    """Every variant of a raw cluster config, validated; a variant's error names it (``[variants.NAME]``)."""
    out: dict[str, ClusterConfig] = {}
    found: dict[str, dict[str, Any]] = {}
    for name, v in variants(raw, overrides).items():
        try:
            out[name], found[name] = _cluster_and_unused(v, base_dir)
        except ConfigError as e:
            if not name:
                raise
            raise ConfigError(f"[variants.{name}]: {e}") from None
    table = raw.get("variants")
    refuse_unused(found, table if isinstance(table, dict) else None)
    return out


def replace_base(cfg: ClusterConfig, **sections: Any) -> ClusterConfig:
    """A copy with some sections of the shared run config replaced (e.g. simulation=...)."""
    return dataclasses.replace(cfg, base=dataclasses.replace(cfg.base, **sections))
