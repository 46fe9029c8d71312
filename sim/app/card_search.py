"""Which card, how many, at what cost: ``servesim size --gpus ...`` searches deployments (card × weight
dtype × KV dtype × TP × instances per card) for the cheapest one that carries a target under the SLOs.

The seeds' order (seeds/002): fix the concurrency target and the context length, compute the memory, then
pick the card; quantize first, then decide whether to add cards. For every candidate deployment:

1. **fits?** The memory planner (sim/app/memory.py) and the cost model's kernel choice (sim/cost/quant.py)
   decide: weights + activations within ``gpu_memory_utilization`` (split evenly between the instances of
   a shared card) with room for one ``max_model_len`` request; a dtype the card cannot run does not fit.
2. **capacity** of one unit (``tp`` cards holding ``instances`` engines) under the SLOs, by the sizing
   search (sim/app/sizing.py: bracketing and bisection on the load, replications, robust one-sided SLO
   checks, t-intervals), for each ``max_num_seqs`` candidate; the best ``max_num_seqs`` is sizing's
   recommendation. Several instances on one card run as a cluster on one shared device (sim/app/devices.py:
   busy instances split its compute) behind a least-outstanding router. ``goal="throughput"``: the
   offline throughput instead (no SLO: the batch-job question).
3. **how many**: units = ceil(target / capacity) (the target in req/s, or concurrent clients with
   ``target_concurrency``: the workload becomes a closed loop of that many clients); the interval of the
   capacity gives an interval of the count. GPUs = units × tp.
4. **cost**: GPUs × the card's price per GPU-hour (sim/app/prices.py); per month; per million output
   tokens at capacity (the unit's throughput there) and at the target.
5. **check at the target**: the chosen setting is run once more at its share of the target (target /
   units per unit) and its SLO margins there are reported: what the target itself leaves in hand.

Ranked: deployments that carry the target first, cheapest per hour first (ties: cheaper per token).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.app.config import RunConfig
from sim.app.prices import GpuPrice, gpu_hour_price
from sim.app.replicate import DEFAULT_LEVEL, t_interval
from sim.app.sizing import default_max_num_seqs, prepare, recommend, run_searches
from sim.app.sizing_report import CandidateResult
from sim.app.sweep import with_params
from sim.core.errors import ConfigError, ServesimError
from sim.cost.hardware import get_gpu
from sim.cost.models import kv_dtype_bytes, normalize_dtype
from sim.cost.modelspec import dtype_format

MAX_INSTANCES = 8
# The largest --target-rate: a billion requests a second is past any fleet (its GPU counts still fit an int64
# column of the table; 1e20 overflowed it after the searches ran).
MAX_TARGET_RATE = 1e9
SEQS_KEY = "engine.max_num_seqs"


@dataclass(frozen=True)
class Deployment:
    gpu: str
    dtype: str
    kv_cache_dtype: str = "auto"
    tp: int = 1
    instances: int = 1  # engines sharing the unit's tp cards

    @property
    def label(self) -> str:
        kv = "" if self.kv_cache_dtype == "auto" else f", kv {self.kv_cache_dtype}"
        tp = f", TP{self.tp}" if self.tp > 1 else ""
        k = f", {self.instances} per card" if self.instances > 1 else ""
        return f"{self.gpu} {self.dtype}{kv}{tp}{k}"


@dataclass
class DeploymentResult:
    deployment: Deployment
    price: GpuPrice
    fits: bool = False
    reason: str = ""
    kernel: str | None = None
    kv_tokens: int | None = None  # per instance
    candidates: list[CandidateResult] = field(default_factory=list)
    best: int | None = None
    target_check: CandidateResult | None = None
    units: int | None = None
    units_range: tuple[int | None, int | None] = (None, None)

    @property
    def chosen(self) -> CandidateResult | None:
        return self.candidates[self.best] if self.best is not None else None

    @property
    def gpus(self) -> int | None:
        return None if self.units is None else self.units * self.deployment.tp

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.gpus is None else self.gpus * self.price.per_hour


def run_shared_card(
    cfg: RunConfig, seed: int, slo: Mapping[str, float] | None, *, instances: int, overlap: float = 0.0
) -> dict[str, Any]:
    """One replication of ``instances`` copies of ``cfg``'s engine on one shared card (a cluster behind
    a least-outstanding router): the same flat row as ``sim.app.replicate.run_one``."""
    from sim.app.cluster import simulate_cluster
    from sim.app.cluster_metrics import summarize_cluster
    from sim.app.replicate import flatten, load_stability

    t0 = time.perf_counter()
    raw = {k: v for k, v in cfg.to_dict().items() if v is not None or k == "frontend"}  # None: none
    raw["simulation"] = {**raw["simulation"], "seed": int(seed)}
    raw["cluster"] = {"router": "least-outstanding", "device_overlap": overlap}
    raw["replica"] = [{"name": f"i{j}", "device": "card"} for j in range(instances)]
    result = simulate_cluster(raw)
    slo = dict(cfg.slo) if slo is None else dict(slo)
    row = {"seed": int(seed), **flatten(summarize_cluster(result, slo=slo or None)), **load_stability(result)}
    row["wall_time_s"] = time.perf_counter() - t0
    return row


def _list(values: Sequence[Any] | None, what: str, default: Sequence[Any]) -> list[Any]:
    vals = list(values) if values else list(default)
    if len(set(map(str, vals))) != len(vals):
        raise ConfigError(f"{what}: a value is given twice in {vals}")
    return vals


def _ints(values: Sequence[Any] | None, what: str, hi: int) -> list[int]:
    vals = _list(values, what, [1])
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise ConfigError(f"{what}: expected integers from 1 to {hi}, got {v!r}")
    return vals


def _distinct(vals: Sequence[str], what: str) -> None:
    """Two spellings of one format (``fp16,half``) would be one deployment twice: refused."""
    seen: dict[str, str] = {}
    for v in vals:
        key = dtype_format(v)
        if key in seen:
            raise ConfigError(f"{what}: {seen[key]!r} and {v!r} are the same dtype ({key}); allowed: distinct dtypes")
        seen[key] = v


def deployments(cfg: RunConfig, gpus, dtypes=None, kv_dtypes=None, tps=None, instances=None) -> list[Deployment]:
    """Every combination, validated by name before anything runs."""
    given = _list(gpus, "--gpus", [])
    names = [get_gpu(g).name for g in given]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ConfigError(f"--gpus: {given[names.index(n)]!r} and {given[i]!r} are the same card ({n})")
    if not names:
        raise ConfigError("--gpus: give at least one card, e.g. --gpus 'RTX 4090,A100 40GB'")
    dts = _list(dtypes, "--dtypes", [cfg.model.dtype])
    for d in dts:
        normalize_dtype(d)
    _distinct(dts, "--dtypes")
    kvs = _list(kv_dtypes, "--kv-dtypes", [cfg.engine.kv_cache_dtype])
    for k in kvs:
        kv_dtype_bytes(k)
    _distinct(kvs, "--kv-dtypes")
    tp = _ints(tps, "--tp", 8)
    ks = _ints(instances, "--instances-per-gpu", MAX_INSTANCES)
    return [Deployment(*c) for c in itertools.product(names, dts, kvs, tp, ks)]


def closed_loop(cfg: RunConfig, clients: int) -> RunConfig:
    """``cfg`` with its open-loop workload turned into ``clients`` closed-loop clients (same lengths)."""
    wl = dict(cfg.workload)
    kind = wl.get("kind", "trace" if "trace" in wl else "open")
    if kind not in ("open", "closed"):
        raise ConfigError(f"--target-concurrency needs synthetic lengths (an open or closed workload), not {kind!r}")
    for k in ("arrival", "rate", "burstiness", "rescale"):
        wl.pop(k, None)
    wl.update(kind="closed", num_clients=int(clients))
    return dataclasses.replace(cfg, workload=wl)


def unit_config(cfg: RunConfig, d: Deployment) -> RunConfig:
    util = cfg.engine.gpu_memory_utilization / d.instances
    return with_params(cfg, {"hardware.gpu": d.gpu, "hardware.tensor_parallel_size": d.tp, "model.dtype": d.dtype,
                             "engine.kv_cache_dtype": d.kv_cache_dtype, "engine.gpu_memory_utilization": util})


def check_fit(cfg: RunConfig, d: Deployment, price: GpuPrice) -> tuple[DeploymentResult, RunConfig | None]:
    """Memory plan and kernel of one deployment; a MemoryPlanError or an unsupported dtype is 'does not fit'."""
    from sim.app.simulate import resolve

    res = DeploymentResult(d, price)
    try:
        ucfg = unit_config(cfg, d)
        setup = resolve(ucfg)
    except ServesimError as e:
        res.reason = str(e).split(": ", 1)[-1] if str(e).startswith("hardware.gpu=") else str(e)
        return res, None
    res.fits = True
    res.kernel = getattr(getattr(setup.cost_model, "quant_kernel", None), "name", None)
    res.kv_tokens = setup.limits.num_gpu_blocks * setup.limits.block_size
    return res, ucfg


def search_cards(
    cfg: RunConfig,
    slo: Mapping[str, float] | None = None,
    *,
    gpus: Sequence[str],
    dtypes: Sequence[str] | None = None,
    kv_dtypes: Sequence[str] | None = None,
    tps: Sequence[int] | None = None,
    instances: Sequence[int] | None = None,
    target_rate: float | None = None,
    target_concurrency: int | None = None,
    max_num_seqs: Sequence[int] | None = None,
    goal: str = "slo",
    replications: int = 3,
    level: float = DEFAULT_LEVEL,
    rel_tol: float = 0.05,
    min_attainment: float = 0.99,
    jobs: int | None = 1,
    progress: bool = False,
    device_overlap: float = 0.0,
    seqs_per_deployment: int = 3,
) -> Any:
    """The ranked deployments (module doc) as a ``sim.app.card_report.CardSearchResult``."""
    from sim.app.card_report import CardSearchResult

    t0 = time.perf_counter()
    if (target_rate is None) == (target_concurrency is None):
        raise ConfigError("give one target: --target-rate REQ_PER_S or --target-concurrency CLIENTS")
    if target_rate is not None and not (isinstance(target_rate, int | float) and not isinstance(target_rate, bool)
                                        and 0 < target_rate <= MAX_TARGET_RATE):  # fmt: skip
        raise ConfigError(f"--target-rate: expected a number of requests per second in (0, {MAX_TARGET_RATE:g}], "
                          f"got {target_rate!r}")
    if target_concurrency is not None:
        if isinstance(target_concurrency, bool) or not isinstance(target_concurrency, int) or target_concurrency < 1:
            raise ConfigError(f"--target-concurrency: expected an integer >= 1, got {target_concurrency!r}")
        if goal != "slo":
            raise ConfigError("--target-concurrency sizes clients under the SLOs: use --goal slo (or --target-rate)")
        cfg = closed_loop(cfg, target_concurrency)
    if goal not in ("slo", "throughput"):
        raise ConfigError(f"--goal {goal!r} with --gpus: expected 'slo' or 'throughput'")
    if not 0 <= device_overlap <= 1:
        raise ConfigError(f"--device-overlap must be in [0, 1], got {device_overlap}")
    slo = dict(cfg.slo if slo is None else slo)
    knob, seeds, notes = prepare(cfg, slo, goal, rel_tol, replications)
    if target_rate is not None and knob.per_unit is None:
        raise ConfigError("--target-rate needs an open-loop, trace or sessions workload; this one is a closed "
                          "loop: give --target-concurrency")  # fmt: skip
    target = float(target_rate if target_rate is not None else target_concurrency)
    deps = deployments(cfg, gpus, dtypes, kv_dtypes, tps, instances)
    prices = {g: gpu_hour_price(cfg.cost, g) for g in {d.gpu for d in deps}}  # a missing price fails now
    results, cands, cfgs, runners, owner = [], [], [], [], []
    for d in deps:
        res, ucfg = check_fit(cfg, d, prices[d.gpu])
        results.append(res)
        if ucfg is None:
            continue
        seqs = list(max_num_seqs) if max_num_seqs else default_max_num_seqs(ucfg, limit=seqs_per_deployment)
        run = None if d.instances == 1 else functools.partial(run_shared_card, instances=d.instances,
                                                                overlap=device_overlap)  # fmt: skip
        for s in seqs:
            res.candidates.append(CandidateResult({SEQS_KEY: int(s)}))
            cands.append(res.candidates[-1])
            cfgs.append(with_params(ucfg, {SEQS_KEY: int(s)}))
            runners.append(run)
            owner.append(len(results) - 1)
    if not cands:  # nothing to simulate: every deployment is ruled out by its memory plan or its names
        _no_deployment(results, gpus, dtypes, kv_dtypes, tps, instances)
    nsim = run_searches(cands, cfgs, knob, seeds, slo, goal=goal, rel_tol=rel_tol, level=level,
                        min_attainment=min_attainment, jobs=jobs, progress=progress, runners=runners)  # fmt: skip
    checks, check_cfgs, check_runs, check_loads, check_of = [], [], [], [], []
    for ri, res in enumerate(results):
        mine = [j for j, o in enumerate(owner) if o == ri]
        if not mine:
            continue
        res.best = recommend(res.candidates, goal, rel_tol)
        cap = _capacity(res, knob, goal)
        if res.best is None or not cap:
            res.reason = res.reason or ("no load met the SLOs" if goal == "slo" else "nothing finished")
            continue
        res.units = max(1, math.ceil(target / cap - 1e-9))
        ci = _capacity_ci(res, knob, goal, level)
        lo, hi = (None if not (c is not None and c > 0) else max(1, math.ceil(target / c - 1e-9))
                  for c in (ci[2], ci[1]))  # more capacity, fewer units
        # the interval of the per-replication capacities, widened to hold the pooled (robust) answer
        res.units_range = (min(lo or res.units, res.units), None if hi is None else max(hi, res.units))
        if goal == "slo" and res.chosen.bracket[1] is None:
            notes.append(f"{res.deployment.label}: still meets the SLOs at the highest load tried "
                         f"({res.chosen.bracket[0]:.4g} {knob.unit}), so its capacity is a lower bound (add requests)")
        share = target / res.units
        j = mine[res.best]
        checks.append(CandidateResult(dict(res.chosen.params)))
        check_cfgs.append(cfgs[j])
        check_runs.append(runners[j])
        check_loads.append(math.ceil(share) if knob.integer else share)
        check_of.append(res)
    if checks and goal == "slo":
        nsim += run_searches(checks, check_cfgs, knob, seeds, slo, goal=goal, level=level,
                             min_attainment=min_attainment, jobs=jobs, progress=progress, runners=check_runs,
                             fixed_loads=check_loads)  # fmt: skip
        for c, res in zip(checks, check_of, strict=True):
            res.target_check = c
    return CardSearchResult(cfg, knob, slo, goal, target, "clients" if target_concurrency else "req/s", results,
                            len(seeds), level, nsim, time.perf_counter() - t0, notes)  # fmt: skip


def _no_deployment(results: Sequence[DeploymentResult], gpus, dtypes, kv_dtypes, tps, instances) -> None:
    """ConfigError: no deployment can run, naming the flags given and each deployment's reason."""
    flags = [f"{f} {','.join(map(str, v))}" for f, v in (("--gpus", gpus), ("--dtypes", dtypes),
             ("--kv-dtypes", kv_dtypes), ("--tp", tps), ("--instances-per-gpu", instances)) if v]  # fmt: skip
    why = [f"{r.deployment.label}: {' '.join(r.reason.split()) or 'does not fit'}" for r in results[:3]]
    more = f"; and {len(results) - 3} more" if len(results) > 3 else ""
    raise ConfigError(f"{' '.join(flags)}: no deployment can run ({'; '.join(why)}{more}); allowed: at least one "
                      "card/dtype/TP combination that fits the model")


def _capacity(res: DeploymentResult, knob: Any, goal: str) -> float | None:
    c = res.chosen
    if c is None:
        return None
    if goal == "throughput":
        off = c.offline
        return off.metrics["request_throughput"][0] if off and "request_throughput" in off.metrics else None
    return knob.req_rate(c.capacity) if knob.per_unit else c.capacity


def _capacity_ci(res: DeploymentResult, knob: Any, goal: str, level: float) -> tuple[float, float, float]:
    c = res.chosen
    if goal == "throughput":
        return c.offline.metrics.get("request_throughput", (math.nan,) * 3)
    caps = [knob.req_rate(x) if knob.per_unit else x for x in c.capacity_by_replication()]
    return t_interval(caps, level) if caps else (math.nan,) * 3

