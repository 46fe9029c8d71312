"""Prefill/decode disaggregation (DistServe, Splitwise, vLLM's disaggregated prefill): prefill replicas
compute prompts, hand the KV to decode replicas over a link, and decode replicas generate the output.

The flow per request, as vLLM's P/D proxy runs it:
1. the gateway routes it to a prefill replica as a request for one token (``max_tokens = 1``);
2. when that finishes, a decode replica is chosen (``decode_router``) and the KV is sent over the
   prefill replica's link: transfers from one prefill replica queue behind each other (one NIC), each
   takes ``latency + prompt tokens x KV bytes per token per GPU / bandwidth`` (every TP rank sends its
   own shard over its own NIC, so TP does not change the time);
3. at arrival the blocks land in the decode replica's prefix cache and the request is queued there with
   its full prompt: the admission finds the transferred blocks as a prefix hit, recomputes the last
   partial block (under ``block_size`` tokens; vLLM's decode side recomputes its last token) and samples
   the first token. So the TTFT includes prefill queue + prefill + transfer + decode queue + first step.

Simplifications: the prefill replica frees its blocks when its token is sampled (vLLM keeps them until the
decode side has pulled them); a transferred block is a free cached block until admission, so a decode
replica short of memory may evict some and recompute them. Requests with one output token end at prefill.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import simpy

from routers.base import RouterContext, make_router
from sim.app.cluster_config import DisaggConfig
from sim.app.collect import request_status
from sim.app.replica import Replica
from sim.app.timing import LATE_GATEWAY, at_late
from sim.core.request import Request, RequestSpec, Status
from sim.kv import KVCacheManager

if TYPE_CHECKING:
    from sim.app.gateway import Gateway


def prefill_spec(spec: RequestSpec) -> RequestSpec:
    """What the prefill replica runs: the prompt and one sampled token."""
    return spec if spec.output_len == 1 else dataclasses.replace(spec, output_len=1)


def decode_spec(spec: RequestSpec) -> RequestSpec:
    """What the decode replica runs: the whole request, with content the prefix cache can match (a
    request of unique content otherwise never hashes its blocks: sim/kv/manager.py's shortcut)."""
    if spec.shares_content and spec.private_from is None:
        return spec
    # Its whole prompt, private part included, arrives as cached blocks that its admission must find;
    # its output stays its own unless a key names it.
    return dataclasses.replace(spec, segments=spec.prompt_segments(),
                               private_from=spec.prompt_len if spec.output_key is None else None)


def inject_kv(kv: KVCacheManager, spec: RequestSpec) -> int:
    """Land the transferred prompt KV of ``spec`` in the decode replica's prefix cache
    (``KVCacheManager.receive_transferred``); returns the blocks its admission can hit."""
    return kv.receive_transferred(Request(spec))


class PDCoordinator:
    """Decode-side routing and the KV links, driven by the gateway's events (its P/D hooks:
    ``prefill_spec``, ``decode_rejection``, ``hand_off``, ``dispatch``, ``busy``)."""

    def __init__(
        self,
        env: simpy.Environment,
        horizon: float | None,
        replicas: Sequence[Replica],
        gateway: Gateway,
        cfg: DisaggConfig,
        rng: np.random.Generator,
    ) -> None:
        self.env = env
        self.horizon = horizon
        self.replicas = replicas
        self.gateway = gateway
        self.cfg = cfg
        self.decoders = [r for r in replicas if r.spec.role == "decode"]
        self.router = make_router(
            cfg.decode_router.name,
            cfg.decode_router.options,
            RouterContext([r.view for r in self.decoders], rng),
        )
        # its hooks, looked up once (a plug-in router may have route() alone)
        self.on_routed = getattr(self.router, "on_routed", None)
        self.on_done = getattr(self.router, "on_done", None)
        self.bandwidth = cfg.link_bandwidth_gb_s * 1e9
        self.latency = cfg.link_latency_ms / 1000.0
        self.link_free_at: dict[int, float] = {}
        self.pending: deque[tuple[RequestSpec, int, float]] = deque()  # prefilled, no decode room yet
        self.transfers: dict[str, dict[str, Any]] = {}  # request id -> prefill/decode/times
        self.bytes_sent = 0
        self.num_in_transfer = 0

    prefill_spec = staticmethod(prefill_spec)

    def decode_rejection(self, spec: RequestSpec) -> str | None:
        """Why no decode replica could run ``spec`` (None: one can, or it ends at prefill). The decode
        side runs the whole request (``decode_spec`` changes only its content keys)."""
        if spec.output_len == 1:
            return None
        reasons = [r.rejection_reason(spec) for r in self.decoders]
        if any(why is None for why in reasons):
            return None
        return "decode: " + "; ".join(dict.fromkeys(reasons))

    def busy(self) -> bool:
        return bool(self.pending) or self.num_in_transfer > 0

    def hand_off(self, r: Replica, orig: RequestSpec, rejected: bool, now: float) -> bool:
        """Replica ``r`` is done with ``orig``: True when it was a prefill whose KV now goes on to a
        decode replica (the request is not over), False when the request ends here."""
        if r.spec.role != "prefill" or rejected or orig.output_len == 1:
            return False
        self.prefill_done(r.index, orig, now)
        return True

    def prefill_done(self, prefill: int, spec: RequestSpec, now: float) -> None:
        self.pending.append((spec, prefill, now))
        self.transfers[spec.request_id] = {
            "prefill": prefill,
            "decode": -1,
            "ready": now,
            "status": "pending",
        }

    def dispatch(self, now: float) -> None:
        if not self.pending:
            return
        for r in self.decoders:
            r.poll(now)
        kept: deque[tuple[RequestSpec, int, float]] = deque()
        while self.pending:
            spec, p, ready = self.pending.popleft()
            cands = [r.view for r in self.decoders if r.rejection_reason(spec) is None]
            chosen = self.router.route(spec, cands, now) if cands else None
            if chosen is None:
                kept.append((spec, p, ready))
                continue
            if self.on_routed is not None:
                self.on_routed(spec, chosen, now)
            self._send(spec, p, chosen.index, now)
        self.pending = kept

    def _send(self, spec: RequestSpec, p: int, d: int, now: float) -> None:
        self.gateway.reserve(d)  # reserved now: the decode side allocates before it pulls the KV
        nbytes = spec.prompt_len * self.replicas[p].setup.memory.kv_bytes_per_token
        start = max(now, self.link_free_at.get(p, 0.0))
        wire = nbytes / self.bandwidth
        self.link_free_at[p] = start + wire
        done = start + wire + self.latency
        self.bytes_sent += nbytes
        t = self.transfers[spec.request_id]
        t.update(decode=d, start=start, done=done, status="transfer")
        self.num_in_transfer += 1
        if self.horizon is None or done <= self.horizon:
            at_late(self.env, done, LATE_GATEWAY, lambda: self._arrive(spec, d))

    def _arrive(self, spec: RequestSpec, d: int) -> None:
        r = self.replicas[d]
        dspec = decode_spec(spec)
        self.transfers[spec.request_id]["status"] = "arrived"
        self.num_in_transfer -= 1
        self.transfers[spec.request_id]["hit_blocks"] = inject_kv(r.policy.kv, dspec)
        self.gateway.deliver(d, dspec, self.env.now)  # counted in its outstanding since the transfer began
        self.gateway.refresh_devices()

    # ---- results --------------------------------------------------------------------------------------
    def rows(self) -> list[tuple[Request, int, str]]:
        """One row per request that reached a prefill replica, merged across its two replicas."""
        by_id = {}
        for r in self.replicas:
            if r.spec.role == "decode":
                for req in r.engine.requests:
                    by_id[req.request_id] = (req, r.index)
        rows: list[tuple[Request, int, str]] = []
        for r in self.replicas:
            if r.spec.role != "prefill":
                continue
            for preq in r.engine.requests:
                rid = preq.request_id
                orig = self.gateway.spec_of[rid]
                if preq.status is not Status.FINISHED or orig.output_len == 1:  # it ended (or is) here
                    rows.append((_merged(orig, preq, preq), r.index, request_status(preq)))
                    continue
                got = by_id.get(rid)
                if got is None:  # waiting for a decode replica, on the link, or in a decode inbox
                    req = Request(orig)
                    _copy_prefill(req, preq)
                    t = self.transfers.get(rid, {})
                    rows.append(
                        (req, t.get("decode", -1) if t.get("decode", -1) >= 0 else r.index, "in_flight")
                    )
                    continue
                dreq, d = got
                req = _merged(orig, preq, dreq)
                req.num_preemptions = preq.num_preemptions + dreq.num_preemptions
                rows.append((req, d, request_status(dreq)))
            spec_of = self.gateway.spec_of
            rows.extend((Request(spec_of[s.request_id]), r.index, "in_flight") for s in r.inbox.remaining())
        return rows

    def annotate(self, df: pd.DataFrame) -> pd.DataFrame:
        """Add ``prefill_replica`` and ``kv_transfer_s`` (prefill done -> KV landed, link queue included)."""
        pre = {rid: t["prefill"] for rid, t in self.transfers.items()}
        xfer = {rid: t["done"] - t["ready"] for rid, t in self.transfers.items() if "done" in t}
        for r in self.replicas:
            if r.spec.role == "prefill":
                for req in r.engine.requests:
                    pre.setdefault(req.request_id, r.index)
        df["prefill_replica"] = df["request_id"].map(pre).fillna(-1).astype(np.int64)
        df["kv_transfer_s"] = df["request_id"].map(xfer).astype(float)
        return df

    def meta(self) -> dict[str, Any]:
        return {
            "link_bandwidth_gb_s": self.cfg.link_bandwidth_gb_s,
            "link_latency_ms": self.cfg.link_latency_ms,
            "decode_router": self.cfg.decode_router.name,
            "num_prefill": sum(1 for r in self.replicas if r.spec.role == "prefill"),
            "num_decode": len(self.decoders),
            "kv_bytes_sent": self.bytes_sent,
        }


_PROGRESS = ("status", "num_computed_tokens", "num_output_tokens", "num_tokens", "first_token_time",
             "last_token_time", "finish_time", "finish_reason")  # fmt: skip


def _merged(orig: RequestSpec, preq: Request, last: Request) -> Request:
    """The request as the client saw it: its own spec, queueing facts from the prefill side, progress
    (tokens, first token, finish) from the replica it ended on."""
    req = Request(orig)
    for f in _PROGRESS:
        setattr(req, f, getattr(last, f))
    _copy_prefill(req, preq)
    return req


def _copy_prefill(req: Request, preq: Request) -> None:
    """The prefill side's queueing facts: when the request was queued and first scheduled, its prefix hit."""
    req.queued_time = preq.queued_time
    req.scheduled_time = preq.scheduled_time
    req.num_cached_tokens = preq.num_cached_tokens
    req.num_preemptions = preq.num_preemptions
