"""A cluster: N replicas (each a full Engine with its own policy, KV pool, cost model, GPU and TP) on one
SimPy clock, behind a gateway with a router, its own queue, a queue cap and a queue timeout.

Timing rules (why fast-forward stays exact with replicas). Everything the gateway does at an instant --
route arrivals, release its queue, poll metrics, finish a KV transfer -- runs *after* every replica's
step boundary at that instant (events at priority LATE_*, after SimPy's NORMAL). So a request pushed
at time t joins a replica at its first step boundary strictly after t (or at t if the replica is idle
and woken), whether or not that replica was inside a fast-forwarded decode run: the engine cuts a run
when its inbox is pushed to (sim/engine/loop.py). The router reads a replica mid-run through
``Engine.run_view``, so its KV usage is the same as step by step.

``simulate_cluster(cfg)`` is the entry point (a ClusterConfig, a raw dict or a TOML path).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

from policies.base import Policy, make_policy
from routers.base import ReplicaView, RouterContext, make_router
from sim.app.cluster_config import ClusterConfig, ReplicaSpec, cluster_from_dict, load_cluster
from sim.app.results import SimResult
from sim.app.simulate import Setup, resolve
from sim.core.errors import ConfigError
from sim.core.request import Request, RequestSpec, Status
from sim.engine.loop import Engine
from sim.engine.recorder import Recorder, requests_frame
from sim.engine.sources import ClosedSource, OpenSource
from workloads.synthetic import ClosedWorkload, OpenWorkload, build_workload

LATE_POLL = 2  # metrics polls: after replica boundaries, before routing at the same instant
LATE_GATEWAY = 3  # routing, queue release, KV transfer arrivals


def at_late(env: simpy.Environment, when: float, priority: int, fn: Callable[[], None]) -> None:
    """Call ``fn`` at time ``when``, after every NORMAL event of that instant."""
    ev = simpy.Event(env)
    ev._ok = True  # a pre-triggered event, as simpy.Timeout builds itself
    ev._value = None
    ev.callbacks.append(lambda _e: fn())
    env.schedule(ev, priority, max(when - env.now, 0.0))


class Inbox:
    """A replica's request source: the gateway pushes specs in, the engine pulls them at its next step
    boundary. It cannot know when the next push comes, so it offers the engine a wake-up event."""

    def __init__(self, env: simpy.Environment, on_done: Callable[[RequestSpec, float], None]) -> None:
        self.env = env
        self.items: deque[tuple[float, RequestSpec]] = deque()
        self._on_done = on_done
        self._wake: simpy.Event | None = None

    def push(self, spec: RequestSpec) -> None:
        self.items.append((self.env.now, spec))
        self.nudge()

    def nudge(self) -> None:
        """Wake the engine (a push, or a change of its shared card's load that ends a decode run)."""
        if self._wake is not None:
            ev, self._wake = self._wake, None
            ev.succeed()

    def wake_event(self) -> simpy.Event:
        if self._wake is None:
            self._wake = self.env.event()
        return self._wake

    def peek_time(self) -> float | None:
        return self.items[0][0] if self.items else None

    def pop_due(self, now: float) -> list[RequestSpec]:
        out = []
        while self.items and self.items[0][0] <= now:
            out.append(self.items.popleft()[1])
        return out

    def on_done(self, spec: RequestSpec, now: float) -> None:
        self._on_done(spec, now)

    def remaining(self) -> list[RequestSpec]:
        return [s for _, s in self.items]


class DeviceGroup:
    """Replicas sharing one card: busy instances split its compute and bandwidth (module doc of
    sim.app.cluster_config). Busy = the gateway has requests outstanding there; the flags change only in
    gateway events, so every step sees the same flags with or without fast-forward."""

    def __init__(self, name: str, overlap: float) -> None:
        self.name = name
        self.overlap = overlap
        self.members: list[int] = []
        self.busy: dict[int, bool] = {}

    def factor(self, index: int) -> float:
        others = sum(1 for j in self.members if j != index and self.busy.get(j, False))
        return 1.0 + (1.0 - self.overlap) * others


class SharedDeviceCost:
    """A replica's cost model on a shared card: its own step time times the card's contention factor."""

    def __init__(self, base: Any, group: DeviceGroup, index: int) -> None:
        self.base, self.group, self.index = base, group, index

    def step_time(self, batch) -> float:
        return self.base.step_time(batch) * self.group.factor(self.index)

    def decode_step_times(self, num_decode: int | np.ndarray, ctx_sums: np.ndarray, num_logits: int | None = None):
        return self.base.decode_step_times(num_decode, ctx_sums, num_logits) * self.group.factor(self.index)

    def breakdown(self, batch) -> dict[str, float]:
        f = self.group.factor(self.index)
        return {k: v * f for k, v in self.base.breakdown(batch).items()}


@dataclass
class Replica:
    index: int
    spec: ReplicaSpec
    setup: Setup
    policy: Policy
    recorder: Recorder
    inbox: Inbox
    engine: Engine
    view: ReplicaView

    def kv_usage(self, now: float) -> float:
        """KV usage at ``now`` after the step boundaries up to ``now``, also inside a decode run."""
        rv = self.engine.run_view
        if rv is None:
            return self.policy.kv.usage
        starts, free = rv
        j = max(int(np.searchsorted(starts, now, side="right")) - 1, 0)
        return 1.0 - float(free[j]) / self.policy.kv.usable_blocks

    def poll(self, now: float) -> None:
        v = self.view
        v.num_running = self.policy.num_running
        v.num_waiting = self.policy.num_waiting + len(self.inbox.items)
        v.kv_usage = self.kv_usage(now)
        v.polled_at = now

    def fits(self, spec: RequestSpec) -> bool:
        """The replica's policy would queue it (QueuedPolicy.rejection_reason's two checks)."""
        lim = self.setup.limits
        if spec.prompt_len >= lim.max_model_len:
            return False
        need = -(-min(spec.prompt_len + spec.output_len, lim.max_model_len) // lim.block_size)
        return need <= lim.num_gpu_blocks - 1


def _rename(spec: RequestSpec, stream: str) -> RequestSpec:
    """A stream's request under a cluster-unique id; its content keys are the stream's own too."""
    segs = None if spec.segments is None else tuple(((stream, k), n) for k, n in spec.segments)
    return dataclasses.replace(spec, request_id=f"{stream}-{spec.request_id}", segments=segs)


def build_source(cfg: ClusterConfig, max_model_len: int) -> tuple[Any, Any]:
    """(workload, source) for the cluster: the [workload] table, or the [[stream]]s merged by time."""
    seed = cfg.base.simulation.seed
    n_override = cfg.base.simulation.num_requests
    if cfg.streams:
        specs: list[RequestSpec] = []
        for k, (name, table) in enumerate(cfg.streams):
            wl = build_workload(
                table,
                seed=np.random.SeedSequence(seed, spawn_key=(300 + k,)),
                max_model_len=max_model_len,
                base_dir=cfg.base_dir,
            )
            if not isinstance(wl, OpenWorkload):
                raise ConfigError(f"[[stream]] {name!r}: only open-loop or trace workloads can be merged")
            specs.extend(_rename(s, name) for s in wl.specs)
        specs.sort(key=lambda s: s.arrival_time)
        if n_override is not None:
            specs = specs[:n_override]
        wl = OpenWorkload(specs)
        return wl, OpenSource(wl.specs)
    table = dict(cfg.base.workload)
    if n_override is not None:
        table["num_requests"] = n_override
    wl = build_workload(table, seed=seed, max_model_len=max_model_len, base_dir=cfg.base_dir)
    if hasattr(wl, "make_source"):
        return wl, wl.make_source()
    if isinstance(wl, ClosedWorkload):
        return wl, ClosedSource(wl)
    return wl, OpenSource(wl.specs)


class Cluster:
    """Builds the replicas, the gateway and (for P/D) the KV hand-off; ``run()`` gives a SimResult."""

    def __init__(self, cfg: ClusterConfig, *, fast_forward: bool = True) -> None:
        self.cfg = cfg
        self.env = env = simpy.Environment()
        sim = cfg.base.simulation
        self.horizon = sim.horizon
        self.groups: dict[str, DeviceGroup] = {}
        self.replicas: list[Replica] = []
        for i, rs in enumerate(cfg.replicas):
            setup = resolve(rs.run)
            # the preset with its options and admission control, where the Setup knows how
            policy = (
                setup.make_policy()
                if hasattr(setup, "make_policy")
                else make_policy(rs.run.engine.policy, setup.limits)
            )
            cost = setup.cost_model
            if rs.device is not None:
                group = self.groups.setdefault(rs.device, DeviceGroup(rs.device, cfg.device_overlap))
                group.members.append(i)
                cost = SharedDeviceCost(cost, group, i)
            rec = Recorder(replica=i, trace=sim.record_step_trace)
            inbox = Inbox(env, self._done_callback(i))
            engine = Engine(env, policy, cost, inbox, rec, sim.horizon, fast_forward)
            lim = setup.limits
            view = ReplicaView(
                index=i,
                name=rs.name,
                pool=rs.pool,
                role=rs.role,
                block_size=lim.block_size,
                max_model_len=lim.max_model_len,
                num_gpu_blocks=lim.num_gpu_blocks,
            )
            self.replicas.append(Replica(i, rs, setup, policy, rec, inbox, engine, view))
        self.max_model_len = max(r.setup.limits.max_model_len for r in self.replicas)
        self.workload, self.source = build_source(cfg, self.max_model_len)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(sim.seed, spawn_key=(500,))))
        self.disagg = None
        front = [r.view for r in self.replicas if r.spec.role in ("mixed", "prefill")]
        self.front = [r for r in self.replicas if r.spec.role in ("mixed", "prefill")]
        self.router = make_router(cfg.router.name, cfg.router.options, RouterContext(front, rng))
        if cfg.disagg is not None:
            from sim.app.disagg import PDCoordinator

            self.disagg = PDCoordinator(self, cfg.disagg, rng)
        # gateway state
        self.queue: deque[tuple[RequestSpec, float]] = deque()
        self.spec_of: dict[str, RequestSpec] = {}
        self.gateway_rejected: list[tuple[RequestSpec, str, float]] = []
        self.max_queue_len = 0
        self._ticks: set[float] = set()
        self._poll_on = cfg.gateway.poll_interval_s > 0
        t0 = self.source.peek_time()
        if t0 is not None:
            self.schedule_tick(t0)
        if self._poll_on:
            at_late(env, 0.0, LATE_POLL, self._poll)

    # ---- gateway events -----------------------------------------------------------------------------
    def schedule_tick(self, t: float) -> None:
        if t in self._ticks or (self.horizon is not None and t > self.horizon):
            return
        self._ticks.add(t)
        at_late(self.env, t, LATE_GATEWAY, lambda: self._tick(t))

    def _tick(self, t: float) -> None:
        self._ticks.discard(t)
        now = max(self.env.now, t)  # the scheduled instant itself (env.now + delay may round below it)
        if self.horizon is None or now <= self.horizon:
            for spec in self.source.pop_due(now):
                self.spec_of[spec.request_id] = spec
                self.queue.append((spec, now))
        self._dispatch(now)
        self._enforce_queue_limits(now)
        if self.disagg is not None:
            self.disagg.dispatch(now)
        self.refresh_devices()
        nxt = self.source.peek_time()
        if nxt is not None:
            self.schedule_tick(max(nxt, now))
        timeout = self.cfg.gateway.queue_timeout_s
        if self.queue and timeout is not None:
            self.schedule_tick(self.queue[0][1] + timeout)

    def _poll(self) -> None:
        now = self.env.now
        for r in self.replicas:
            r.poll(now)
        if self.active() and (self.horizon is None or now < self.horizon):
            at_late(self.env, now + self.cfg.gateway.poll_interval_s, LATE_POLL, self._poll)

    def active(self) -> bool:
        return bool(
            self.source.peek_time() is not None
            or self.queue
            or any(r.view.outstanding for r in self.replicas)
            or (self.disagg is not None and self.disagg.busy())
        )

    def _dispatch(self, now: float) -> None:
        if not self.queue:
            return
        if not self._poll_on:
            for r in self.front:
                r.poll(now)
        kept: deque[tuple[RequestSpec, float]] = deque()
        while self.queue:
            if not any(r.view.room for r in self.front):
                kept.extend(self.queue)
                self.queue.clear()
                break
            spec, t0 = self.queue.popleft()
            cands = [r.view for r in self.front if self._fits(r, spec)]
            if not cands:
                self.reject(
                    spec,
                    f"no replica can hold it (prompt {spec.prompt_len} + output {spec.output_len} "
                    "tokens exceeds every replica's max_model_len or KV pool)",
                    now,
                )
                continue
            chosen = self.router.route(spec, cands, now)
            if chosen is None:
                kept.append((spec, t0))
                continue
            self.router.on_routed(spec, chosen, now)
            pushed = spec if self.disagg is None else self.disagg.prefill_spec(spec)
            self.push(chosen.index, pushed, now)
        self.queue = kept

    def _fits(self, r: Replica, spec: RequestSpec) -> bool:
        if self.disagg is not None:
            return r.fits(self.disagg.prefill_spec(spec)) and self.disagg.decodable(spec)
        return r.fits(spec)

    def _enforce_queue_limits(self, now: float) -> None:
        gw = self.cfg.gateway
        if gw.queue_timeout_s is not None:
            kept = deque()
            for spec, t0 in self.queue:
                if t0 + gw.queue_timeout_s <= now:
                    self.reject(spec, f"gateway queue timeout ({gw.queue_timeout_s:g} s)", now)
                else:
                    kept.append((spec, t0))
            self.queue = kept
        if gw.max_queue is not None:
            while len(self.queue) > gw.max_queue:  # the newest arrivals find the queue full
                spec, _ = self.queue.pop()
                self.reject(spec, f"gateway queue full (max_queue {gw.max_queue})", now)
        self.max_queue_len = max(self.max_queue_len, len(self.queue))

    def reject(self, spec: RequestSpec, reason: str, now: float) -> None:
        self.gateway_rejected.append((spec, reason, now))
        self.source.on_done(spec, now)

    def push(self, index: int, spec: RequestSpec, now: float) -> None:
        r = self.replicas[index]
        v = r.view
        v.outstanding += 1
        self._set_room(v)
        r.inbox.push(spec)
        if not self._poll_on:
            r.poll(now)

    def _set_room(self, v: ReplicaView) -> None:
        cap = self.cfg.gateway.max_outstanding
        v.room = cap is None or v.outstanding < cap

    def refresh_devices(self) -> None:
        for g in self.groups.values():
            for i in g.members:
                busy = self.replicas[i].view.outstanding > 0
                if g.busy.get(i, False) != busy:
                    g.busy[i] = busy
                    for j in g.members:
                        if j != i:
                            self.replicas[j].inbox.nudge()  # its step times change: end its decode run

    def _done_callback(self, index: int) -> Callable[[RequestSpec, float], None]:
        return lambda spec, now: self._on_replica_done(index, spec, now)

    def _on_replica_done(self, index: int, spec: RequestSpec, now: float) -> None:
        r = self.replicas[index]
        v = r.view
        v.outstanding -= 1
        self._set_room(v)
        rejected = bool(r.engine.rejected) and r.engine.rejected[-1].spec is spec
        orig = self.spec_of[spec.request_id]
        if self.disagg is not None and r.spec.role == "prefill" and not rejected and orig.output_len > 1:
            self.disagg.prefill_done(index, orig, now)
        else:
            if self.disagg is not None and r.spec.role == "decode":
                self.disagg.router.on_done(orig, v, now)
            else:
                self.router.on_done(orig, v, now)
            self.source.on_done(orig, now)
        self.schedule_tick(now)

    # ---- run and results ----------------------------------------------------------------------------
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        self.env.run()
        return self.collect(time.perf_counter() - t0)

    def _rows(self) -> list[tuple[Request, int, str]]:
        rows: list[tuple[Request, int, str]] = []
        for r in self.replicas:
            if r.spec.role != "mixed":
                continue  # P/D rows are merged by the coordinator
            for req in r.engine.requests:
                rows.append((req, r.index, _status(req)))
            rows.extend((Request(s), r.index, "in_flight") for s in r.inbox.remaining())
        if self.disagg is not None:
            rows.extend(self.disagg.rows())
        rows.extend((Request(s), -1, "in_flight") for s, _ in self.queue)
        for spec, reason, t in self.gateway_rejected:
            req = Request(spec)
            req.status, req.finish_reason, req.finish_time, req.queued_time = Status.REJECTED, reason, t, None
            rows.append((req, -1, "rejected"))
        rows.extend((Request(s), -1, "not_arrived") for s in self.source.remaining())
        return rows

    def collect(self, wall: float) -> SimResult:
        cfg = self.cfg
        rows = self._rows()
        df = requests_frame(rows)
        names = {r.index: r.spec.name for r in self.replicas}
        pools = {r.index: r.spec.pool for r in self.replicas}
        df["replica_name"] = df["replica"].map(names).fillna("gateway")
        df["pool"] = df["replica"].map(pools).fillna("")
        if self.disagg is not None:
            df = self.disagg.annotate(df)
        steps = pd.concat([r.recorder.steps_frame() for r in self.replicas], ignore_index=True)
        itl = [r.recorder.itl() for r in self.replicas]
        trace = None
        if cfg.base.simulation.record_step_trace:
            trace = []
            for r in self.replicas:
                trace.extend({**rec, "replica": r.index} for rec in r.recorder.trace or [])
            trace.sort(key=lambda rec: rec["time"])
        per_replica = []
        pc_total: dict[str, int] = {}
        for r in self.replicas:
            stats = r.policy.kv.prefix_cache_stats()
            if r.spec.role != "decode":  # a decode replica's "hits" are the KV it was sent
                for k, v in stats.items():
                    pc_total[k] = pc_total.get(k, 0) + v
            lim = r.setup.limits
            hw, eng = r.spec.run.hardware, r.spec.run.engine
            per_replica.append(
                {
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
                    "prefix_cache": stats,
                    "num_preemptions": r.recorder.num_preemptions,
                    "num_prefilled": sum(q.status is Status.FINISHED for q in r.engine.requests),
                }
            )
        first = self.replicas[0].setup.meta
        end = float((steps["start"] + steps["duration"]).max()) if len(steps) else 0.0
        meta = {
            "cluster": True,
            "model": first.get("model"),
            "gpu": first.get("gpu"),
            "cost_model": first.get("cost_model"),
            "profile": first.get("profile"),
            "profile_source": first.get("profile_source"),
            "num_gpu_blocks": sum(r.setup.limits.num_gpu_blocks for r in self.replicas),
            "num_replicas": len(self.replicas),
            "num_gpus": cfg.num_gpus,
            "router": cfg.router.name,
            "router_options": dict(cfg.router.options),
            "gateway": dataclasses.asdict(cfg.gateway),
            "num_gateway_rejected": len(self.gateway_rejected),
            "max_gateway_queue": self.max_queue_len,
            "replicas": per_replica,
            "prefix_cache": pc_total,
            "num_preemptions": sum(r.recorder.num_preemptions for r in self.replicas),
            "seed": cfg.base.simulation.seed,
            "wall_time_s": wall,
            "end_time": end,
            "disagg": None if self.disagg is None else self.disagg.meta(),
        }
        return SimResult(
            requests=df,
            steps=steps,
            itl_values=np.concatenate([v for v, _ in itl]),
            itl_weights=np.concatenate([w for _, w in itl]),
            step_trace=trace,
            config=cfg.to_dict(),
            horizon=cfg.base.simulation.horizon,
            meta=meta,
        )


def _status(req: Request) -> str:
    if req.status is Status.FINISHED:
        return "finished"
    if req.status is Status.REJECTED:
        return "rejected"
    return "in_flight"


def as_cluster_config(
    cfg: ClusterConfig | dict[str, Any] | str | Path,
    variant: str | None = None,
    overrides: list[str] | None = None,
) -> ClusterConfig:
    """A ClusterConfig from a config object, a raw dict or a TOML path (one variant of it)."""
    if isinstance(cfg, ClusterConfig):
        if overrides:
            raise ConfigError("overrides apply to a raw config or a path, not to a built ClusterConfig")
        return cfg
    if isinstance(cfg, str | Path):
        all_ = load_cluster(cfg, overrides)
    else:
        from sim.app.cluster_config import variants

        all_ = {k: cluster_from_dict(v) for k, v in variants(cfg, overrides).items()}
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
    return Cluster(as_cluster_config(cfg, variant, overrides), fast_forward=fast_forward).run()


def simulate_variants(
    path_or_raw: dict[str, Any] | str | Path,
    overrides: list[str] | None = None,
    names: list[str] | None = None,
) -> dict[str, SimResult]:
    """Every variant of a comparison config (or those in ``names``), run one after another."""
    if isinstance(path_or_raw, str | Path):
        cfgs = load_cluster(path_or_raw, overrides)
    else:
        from sim.app.cluster_config import variants

        cfgs = {k: cluster_from_dict(v) for k, v in variants(path_or_raw, overrides).items()}
    if names:
        missing = [n for n in names if n not in cfgs]
        if missing:
            raise ConfigError(f"no variant(s) {missing}; the config has {list(cfgs)}")
        cfgs = {n: cfgs[n] for n in names}
    return {name: Cluster(c).run() for name, c in cfgs.items()}
