"""The cluster's gateway: its queue (with a cap and a timeout), the fit check, routing to the replicas,
and what each replica has outstanding. Its events run after the replicas' step boundaries at the same
instant (sim/app/timing.py).

While the gateway's queue is empty, a finish changes nothing but its counts (outstanding, the router's
and the source's on_done) as long as the router reads no engine metrics, arrivals ignore finishes and no
card is shared: then the replicas' decode runs go on past finishes (``lazy``), and the gateway takes
each finish from the run's view at its time, before anything at or after that time reads the counts. A
request held in the queue cuts those runs (a finish may then release it).

The fit check asks each replica's own policy (``Policy.rejection_reason``), so a request is never routed
to a replica that would reject it; one no replica can hold is rejected here, with their reasons.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import simpy

from routers.base import BaseRouter, ReplicaView, Router
from sim.app.cluster_config import GatewayConfig
from sim.app.devices import Devices
from sim.app.replica import Replica
from sim.app.timing import LATE_GATEWAY, LATE_POLL, Scheduler
from sim.core.request import RequestSpec
from sim.engine.fastforward import RunView

if TYPE_CHECKING:
    from sim.app.disagg import PDCoordinator


class Gateway:
    """Routes the source's requests to the front replicas (mixed, or prefill under P/D)."""

    def __init__(
        self,
        env: simpy.Environment,
        cfg: GatewayConfig,
        horizon: float | None,
        source: Any,
        replicas: Sequence[Replica],
        router: Router,
        devices: Devices,
    ) -> None:
        self.env = env
        self.clock = Scheduler(env)
        self.cfg = cfg
        self.horizon = horizon
        self.source = source
        self.replicas = replicas
        self.front = [r for r in replicas if r.spec.role in ("mixed", "prefill")]
        # Front replicas built from equal configs answer the fit check alike (a policy's
        # rejection_reason reads its limits, never its load): one question per group, not per replica.
        self._fit_group = _fit_groups(self.front)
        self._group_first = [self.front[self._fit_group.index(g)] for g in range(max(self._fit_group, default=-1) + 1)]
        self._front_views = [r.view for r in self.front]
        self._front_index = {r.index for r in self.front}
        self._with_room = sum(v.room for v in self._front_views)  # front replicas below max_outstanding
        self._on_routed: Any = None
        self._on_done: Any = None
        self.router = router  # and its hooks (the property below)
        self.devices = devices
        self.disagg: PDCoordinator | None = None  # the P/D hooks, when the cluster has them
        self.queue: deque[tuple[RequestSpec, float]] = deque()
        self.spec_of: dict[str, RequestSpec] = {}  # every request that arrived, by id, as the client sent it
        self.rejected: list[tuple[RequestSpec, str, float]] = []
        self.max_queue_len = 0
        self.poll_on = cfg.poll_interval_s > 0
        self._ticks: set[float] = set()
        self.polls = True  # whether anything reads the replicas' polled metrics (decided by start())
        self.lazy = False  # finishes taken from decode runs' views (module doc; decided by start())
        # The next finish of each replica's run in flight, by replica index: its time (inf: none), its
        # order of announcement (ties in time go in that order), the run's view and the finish's place in
        # it. A list a replica, scanned (16 replicas: cheaper than a heap of tuples, ~2 pushes a finish).
        n = len(replicas)
        self._due_t: list[float] = [math.inf] * n
        self._due_seq: list[int] = [0] * n
        self._due_view: list[RunView | None] = [None] * n
        self._due_j: list[int] = [0] * n
        self._due_min = math.inf  # no due time is earlier (a bound: an entry may have been cleared since)
        self._seq = 0
        self.num_mid_run_finishes = 0  # finishes counted from a run's view (tests and benchmarks read it)

    @property
    def router(self) -> Router:
        return self._router

    @router.setter
    def router(self, router: Router) -> None:
        """The router, and its hooks where they are not BaseRouter's no-ops (those are not called: two
        calls a request). They are looked up here: a hook set on the router afterwards is not seen."""
        self._router = router
        self._on_routed = _live_hook(router, "on_routed")
        self._on_done = _live_hook(router, "on_done")

    def start(self) -> None:
        """Decide whether to poll and whether runs may pass finishes (once the P/D hooks are set);
        schedule the first arrival and the first metrics poll."""
        self.polls = self.disagg is not None or getattr(self.router, "reads_engine_metrics", True)
        self.lazy = not self.polls and not self.devices.groups and bool(
            getattr(self.source, "arrivals_ignore_finishes", False)
        )
        if self.lazy:
            for r in self.front:
                r.inbox.may_pass = self._queue_empty
                r.inbox.run_hook = partial(self._expect, r.index)
        t0 = self.source.peek_time()
        if t0 is not None:
            self.schedule_tick(t0)
        if self.poll_on and self.polls:
            self.clock.at_late(0.0, LATE_POLL, self._poll)

    # ---- events --------------------------------------------------------------------------------------
    def schedule_tick(self, t: float) -> None:
        if t in self._ticks or (self.horizon is not None and t > self.horizon):
            return
        self._ticks.add(t)
        self.clock.late_event(t, LATE_GATEWAY, self._on_tick, t)

    def _on_tick(self, ev: simpy.Event) -> None:
        self._tick(ev._value)  # the tick's time (late_event)

    def _tick(self, t: float) -> None:
        self._ticks.discard(t)
        now = max(self.clock.now(), t)  # the scheduled instant itself (env.now + delay may round below it)
        if self._due_min <= now:
            self.settle(now)
        if self.horizon is None or now <= self.horizon:
            for spec in self.source.pop_due(now):
                self.spec_of[spec.request_id] = spec
                self.queue.append((spec, now))
        if self.queue:
            self._dispatch(now)
            if self.queue:
                self._enforce_queue_limits(now)
        if self.disagg is not None:
            self.disagg.dispatch(now)
        if self.devices.groups:
            self.refresh_devices()
        nxt = self.source.peek_time()
        if nxt is not None:
            self.schedule_tick(max(nxt, now))
        timeout = self.cfg.queue_timeout_s
        if self.queue and timeout is not None:
            self.schedule_tick(self.queue[0][1] + timeout)
        if self.queue and self.lazy:
            self._cut_runs()

    def _poll(self) -> None:
        now = self.env.now
        for r in self.replicas:
            r.poll(now)
        if self.active() and (self.horizon is None or now < self.horizon):
            self.clock.at_late(now + self.cfg.poll_interval_s, LATE_POLL, self._poll)

    def active(self) -> bool:
        return bool(
            self.source.peek_time() is not None
            or self.queue
            or any(r.view.outstanding for r in self.replicas)
            or (self.disagg is not None and self.disagg.busy())
        )

    # ---- routing -------------------------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        if not self.poll_on and self.polls:
            for r in self.front:
                r.poll(now)
        kept: deque[tuple[RequestSpec, float]] = deque()
        while self.queue:
            if not self._with_room:
                kept.extend(self.queue)
                self.queue.clear()
                break
            spec, t0 = self.queue.popleft()
            cands, reasons = self._candidates(spec)
            if not cands:
                self.reject(spec, "no replica can hold it: " + "; ".join(dict.fromkeys(reasons)), now)
                continue
            chosen = self.router.route(spec, cands, now)
            if chosen is None:
                kept.append((spec, t0))
                continue
            if self._on_routed is not None:
                self._on_routed(spec, chosen, now)
            pushed = spec if self.disagg is None else self.disagg.prefill_spec(spec)
            self.push(chosen.index, pushed, now)
        self.queue = kept

    def _candidates(self, spec: RequestSpec) -> tuple[list[ReplicaView], list[str]]:
        """The front replicas whose policy would queue ``spec`` (under P/D: its prefill part, and some
        decode replica must take the rest), and the reasons of those that would not."""
        if self.disagg is not None:
            why = self.disagg.decode_rejection(spec)
            if why is not None:
                return [], [why]
            spec = self.disagg.prefill_spec(spec)
        answers = [r.rejection_reason(spec) for r in self._group_first]  # one question per fit group
        if all(why is None for why in answers):  # the usual case: no pass over the replicas (callgrind,
            # replicas_16 at 3,000 requests: ~39M instructions more without it, 71M less a 32M change beside it)
            return list(self._front_views), []
        groups = self._fit_group
        cands = [v for v, g in zip(self._front_views, groups, strict=True) if answers[g] is None]
        reasons = [why for g in groups if (why := answers[g]) is not None]
        return cands, reasons

    def _enforce_queue_limits(self, now: float) -> None:
        gw = self.cfg
        if gw.queue_timeout_s is not None:
            kept: deque[tuple[RequestSpec, float]] = deque()
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
        self.rejected.append((spec, reason, now))
        self.source.on_done(spec, now)

    # ---- replicas' outstanding requests --------------------------------------------------------------
    def push(self, index: int, spec: RequestSpec, now: float) -> None:
        self.reserve(index)
        self.deliver(index, spec, now)

    def reserve(self, index: int) -> None:
        """Count one more request outstanding at replica ``index`` (before it gets there, under P/D)."""
        v = self.replicas[index].view
        v.outstanding += 1
        self._set_room(v)

    def deliver(self, index: int, spec: RequestSpec, now: float) -> None:
        """Put ``spec`` (already counted by ``reserve``) into replica ``index``'s inbox."""
        r = self.replicas[index]
        r.inbox.push(spec)
        if not self.poll_on and self.polls:
            r.poll(now)

    def _set_room(self, v: ReplicaView) -> None:
        cap = self.cfg.max_outstanding
        room = cap is None or v.outstanding < cap
        if room != v.room:
            v.room = room
            if v.index in self._front_index:
                self._with_room += 1 if room else -1

    def refresh_devices(self) -> None:
        reps = self.replicas
        self.devices.refresh(lambda i: reps[i].view.outstanding > 0, lambda j: reps[j].inbox.nudge())

    def on_replica_done(self, index: int, spec: RequestSpec, now: float) -> None:
        """Replica ``index`` finished (or rejected) ``spec``: the client's request ends, or under P/D its
        KV goes on to a decode replica."""
        if self._due_min <= now:
            self.settle(now)  # earlier finishes inside other replicas' runs first
        self._finished(index, spec, now)
        if self.queue or not self.lazy:  # lazy with nothing queued: the finish's tick would do nothing
            self.schedule_tick(now)

    # ---- finishes inside decode runs (``lazy``) ------------------------------------------------------
    def _queue_empty(self) -> bool:
        return not self.queue

    def _expect(self, index: int, view: RunView) -> None:
        """Replica ``index`` runs past finishes: its view lists them with their times (its previous run's,
        if any, is over: the engine holds one run at a time)."""
        if len(view.finish_specs):
            self._due(index, view, 0)

    def _due(self, i: int, view: RunView, j: int) -> None:
        t = float(view.finish_times[j])
        self._due_t[i] = t
        self._due_seq[i] = self._seq
        self._seq += 1
        self._due_view[i] = view
        self._due_j[i] = j
        if t < self._due_min:
            self._due_min = t

    def settle(self, now: float) -> None:
        """Count every finish inside a replica's run in flight up to ``now``, in time order (ties: in the
        order announced), as its step boundary would have (with the queue empty a finish schedules no
        tick of its own: it would do no more). A run cut by a push keeps the steps started by then, so
        each finish so far is certain; a run that has ended reported its own (its view is gone)."""
        due_t, due_seq, reps = self._due_t, self._due_seq, self.replicas
        while True:
            i = -1
            t = math.inf
            seq = 0
            for k in range(len(due_t)):
                tk = due_t[k]
                if tk < t or (tk == t and tk != math.inf and due_seq[k] < seq):
                    i, t, seq = k, tk, due_seq[k]
            self._due_min = t
            if i < 0 or t > now:
                return
            view = self._due_view[i]
            due_t[i] = math.inf
            self._due_view[i] = None
            r = reps[i]
            if view is None or r.engine.run_view is not view:  # (never None with a finite time: for the types)
                continue
            j = self._due_j[i]
            spec = view.finish_specs[j]
            r.inbox.taken.add(spec.request_id)
            self._finished(i, spec, t)
            self.num_mid_run_finishes += 1
            if j + 1 < len(view.finish_specs):
                self._due(i, view, j + 1)

    def _cut_runs(self) -> None:
        """A request waits in the queue: each finish may release it, so runs past finishes end now."""
        for r in self.front:
            rv = r.engine.run_view
            if rv is not None and rv.free_blocks is None:
                r.inbox.nudge()

    def _finished(self, index: int, spec: RequestSpec, now: float) -> None:
        r = self.replicas[index]
        v = r.view
        v.outstanding -= 1
        self._set_room(v)
        rejected = r.engine.last_rejected is spec
        orig = self.spec_of[spec.request_id]
        on_done = self._on_done
        if self.disagg is not None:
            if self.disagg.hand_off(r, orig, rejected, now):
                return
            if r.spec.role == "decode":
                on_done = self.disagg.on_done
        if on_done is not None:
            on_done(orig, v, now)
        self.source.on_done(orig, now)


def _live_hook(router: Router, name: str) -> Any:
    """``router``'s hook ``name``, or None where it is BaseRouter's no-op (set on neither the router nor
    a class of its own) or a plug-in router does not have it (one with route() alone routes)."""
    own = getattr(type(router), name, None)
    if name not in getattr(router, "__dict__", {}) and (own is None or own is getattr(BaseRouter, name)):
        return None
    return getattr(router, name)


def _fit_groups(front: Sequence[Replica]) -> list[int]:
    """Each front replica's fit group: replicas with the same policy class built from equal configs
    share one, numbered in order of first appearance (so a group's first member comes first)."""
    keys: list[tuple[type, Any]] = []
    for r in front:
        if (key := (type(r.policy), r.spec.run)) not in keys:
            keys.append(key)
    return [keys.index((type(r.policy), r.spec.run)) for r in front]
