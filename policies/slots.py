"""Machinery of slot engines (llama.cpp server, Ollama): fixed slots of ``n_ctx_slot`` tokens, no paging,
a per-slot prompt cache, a FIFO of deferred requests. The scheduling rules are in llamacpp.py / ollama.py.

KV here is not a block pool: each slot owns a contiguous context. ``SlotKV`` gives the engine and the
results what they read from a KV manager (usage, free "blocks" counted in tokens, prefix-cache stats);
tokens of finished requests that stay in an idle slot as its prompt cache count as free, as vLLM counts
cached-but-unreferenced blocks (KV-3).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from policies.base import PolicyLimits, StepPlan
from sim.core.batch import BatchSummary
from sim.core.request import Request, RequestSpec, Status


class SlotKV:
    """Token-granular KV accounting for slot engines (block_size 1)."""

    block_size = 1

    def __init__(self, num_tokens: int) -> None:
        self.capacity = num_tokens
        self.used = 0  # tokens of active requests
        self.cached = 0  # tokens idle slots keep as prompt cache
        self._queries = self._hits = self._requests = 0

    @property
    def num_free_blocks(self) -> int:
        return self.capacity - self.used

    @property
    def usable_blocks(self) -> int:
        return self.capacity

    @property
    def num_cached_free_blocks(self) -> int:
        """Prompt-cache tokens idle slots keep (the slot engines' cached-but-unreferenced KV)."""
        return self.cached

    @property
    def usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    def record_lookup(self, prompt_tokens: int, hit_tokens: int) -> None:
        self._requests += 1
        self._queries += prompt_tokens
        self._hits += hit_tokens

    def prefix_cache_stats(self) -> dict[str, int]:
        return {"queries": self._queries, "hits": self._hits, "requests": self._requests,
                "preempted_queries": 0, "preempted_hits": 0, "preempted_requests": 0}  # fmt: skip

    @property
    def hit_rate(self) -> float:
        return self._hits / self._queries if self._queries else 0.0


def common_prefix(a: Request, a_len: int, b: Request, b_len: int) -> int:
    """Tokens ``a[:a_len]`` and ``b[:b_len]`` share from the start, from their content description
    (token_ids, hash_ids or segments: sim/core/request.py). Output tokens are compared by their output key."""
    sa, sb = a.spec, b.spec
    limit = min(a_len, b_len)
    if limit <= 0:
        return 0
    if sa.token_ids is not None or sb.token_ids is not None:
        if sa.token_ids is None or sb.token_ids is None:
            return 0
        n = min(a.prompt_len, b.prompt_len, limit)
        x = np.asarray(sa.token_ids[:n])
        y = np.asarray(sb.token_ids[:n])
        diff = np.nonzero(x != y)[0]
        return int(diff[0]) if len(diff) else n
    if not sa.shares_content and not sb.shares_content and sa.request_id != sb.request_id:
        return 0
    runs_a, runs_b = _runs(a), _runs(b)
    i = j = 0
    off_a = off_b = 0  # offset inside the current run
    pos = 0
    while i < len(runs_a) and j < len(runs_b) and pos < limit:
        (ka, na), (kb, nb) = runs_a[i], runs_b[j]
        if ka != kb or off_a != off_b:
            break
        step = min(na - off_a, nb - off_b, limit - pos)
        pos += step
        off_a += step
        off_b += step
        if off_a == na:
            i, off_a = i + 1, 0
        if off_b == nb:
            j, off_b = j + 1, 0
    return pos


def _runs(req: Request) -> list[tuple[Any, int]]:
    spec = req.spec
    out_key = spec.output_key if spec.output_key is not None else ("o", spec.request_id)
    return [*spec.prompt_segments(), (out_key, spec.output_len)]


class Slot:
    """One server slot. ``cache_req``/``cache_len``: the tokens its KV still holds (its prompt cache)."""

    __slots__ = ("id", "req", "n_past", "n_prompt", "cache_req", "cache_len", "t_last_used", "keep", "gen")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.req: Request | None = None
        self.n_past = 0  # tokens in this slot's KV for the active request
        self.n_prompt = 0  # prompt tokens to evaluate (after any truncation)
        self.cache_req: Request | None = None
        self.cache_len = 0
        self.t_last_used = -1.0
        self.keep: int | None = (
            None  # after truncation / context shift only KV[:keep] is the request's prefix
        )
        self.gen = False  # prompt done: one token per forward from now on

    @property
    def generating(self) -> bool:
        return self.gen

    @property
    def pending(self) -> int:
        """Inputs waiting for the next forward: the prompt's rest, or the last sampled token."""
        if self.req is None:
            return 0
        return 1 if self.gen else self.n_prompt - self.n_past


class SlotPolicy:
    """Deferred FIFO + slots + SlotKV; subclasses pick slots and build each batch."""

    name = "slots"

    def __init__(self, limits: PolicyLimits, n_slots: int, n_ctx_slot: int) -> None:
        self.limits = limits
        self.slots = [Slot(i) for i in range(n_slots)]
        self.n_ctx_slot = n_ctx_slot
        self.kv = SlotKV(n_slots * n_ctx_slot)
        self.waiting: deque[Request] = deque()  # deferred tasks: unbounded FIFO (LC-2)
        self._seq = 0

    # ---- Policy protocol -------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> str | None:
        # Never rejects here: the server defers every task and errors when a slot takes it (LC-5), so
        # ``rejection_reason`` is reported through the step plan at launch, after the queue.
        req.queued_time = now
        req.seq = self._seq
        self._seq += 1
        self.waiting.append(req)
        return None

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        """Why a slot would refuse ``spec`` at launch (``prepare_prompt``); None: it truncates."""
        return None

    @property
    def running(self) -> list[Request]:
        return [s.req for s in self.slots if s.req is not None]

    @property
    def num_running(self) -> int:
        return sum(1 for s in self.slots if s.req is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(s.req is not None for s in self.slots)

    def quiet(self) -> None:
        """Slot engines are stepped one by one (their cache is not the paged pool the fast path reads)."""
        return None

    def on_skipped_steps(self, k: int) -> None:  # pragma: no cover - quiet() is always None
        raise NotImplementedError

    # ---- launching -------------------------------------------------------------------------------------
    def choose_slot(self, req: Request, idle: list[Slot]) -> tuple[Slot, int]:
        """(slot, cached prefix tokens to reuse). Subclasses implement LC-2 / OL-4."""
        raise NotImplementedError

    def prepare_prompt(self, req: Request, plan: StepPlan) -> int | None:
        """Prompt tokens to evaluate (after truncation), or None when the request was rejected."""
        raise NotImplementedError

    def truncated_keep(self, req: Request, n_prompt: int) -> int | None:
        """Tokens at the head of a truncated prompt that are still the request's prefix (else None)."""
        return None

    def launch(self, plan: StepPlan, now: float) -> None:
        """Move deferred requests into idle slots, FIFO, as slots free up."""
        while self.waiting:
            idle = [s for s in self.slots if s.req is None]
            if not idle:
                return
            req = self.waiting.popleft()
            n_prompt = self.prepare_prompt(req, plan)
            if n_prompt is None:
                continue
            slot, reuse = self.choose_slot(req, idle)
            keep = self.truncated_keep(req, n_prompt)
            reuse = min(reuse, n_prompt if keep is None else keep)
            if reuse >= n_prompt:
                reuse = n_prompt - 1  # at least one prompt token is evaluated (LC-3, OL-4)
            self.kv.cached -= slot.cache_len
            slot.cache_req, slot.cache_len = None, 0
            slot.req, slot.n_prompt, slot.n_past = req, n_prompt, reuse
            slot.keep = keep
            self.kv.used += reuse
            self.kv.record_lookup(n_prompt, reuse)
            req.status = Status.RUNNING
            req.scheduled_time = now
            req.num_cached_tokens = reuse
            req.num_computed_tokens = reuse

    # ---- steps -----------------------------------------------------------------------------------------
    def build_plan(self, plan: StepPlan, work: list[tuple[Slot, int]]) -> StepPlan:
        """Turn (slot, tokens) pairs into the plan and its batch summary; rows that finish their inputs
        sample a token. Advances each slot's ``n_past`` (the forward runs now)."""
        dec, chunks, ctxs = [], [], []
        for slot, n in work:
            req = slot.req
            assert req is not None
            if slot.generating:
                dec.append(slot.n_past + 1)
            else:
                chunks.append(n)
                ctxs.append(slot.n_past)
            slot.n_past += n
            self.kv.used += n
            req.num_computed_tokens += n
            plan.scheduled.append((req, n))
            if slot.gen or slot.n_past >= slot.n_prompt:
                plan.sampled.append(req)
                slot.gen = True
        plan.batch = BatchSummary(
            decode_ctx=np.asarray(dec, dtype=np.int64),
            prefill_chunk=np.asarray(chunks, dtype=np.int64),
            prefill_ctx=np.asarray(ctxs, dtype=np.int64),
            num_logits=len(plan.sampled),
        )
        return plan

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        finished: list[Request] = []
        by_req = {id(s.req): s for s in self.slots if s.req is not None}
        for req in plan.sampled:
            req.num_output_tokens += 1
            req.num_tokens += 1
            slot = by_req[id(req)]
            reason = self.stop_reason(slot)
            if reason is not None:
                finished.append(req)
                self.release(slot, req, reason, now)
        return finished

    def abort(self, req: Request, now: float) -> None:
        """The client closed the connection: a deferred task leaves the queue, a slot is released."""
        for slot in self.slots:
            if slot.req is req:
                self.release(slot, req, "abort", now)
                return
        self.waiting.remove(req)

    def stop_reason(self, slot: Slot) -> str | None:
        req = slot.req
        assert req is not None
        if req.num_output_tokens >= req.output_len:
            return "length"
        return None

    def release(self, slot: Slot, req: Request, reason: str, now: float) -> None:
        req.status = Status.FINISHED
        req.finish_time = now
        req.finish_reason = reason
        self.kv.used -= slot.n_past
        slot.req = None
        slot.t_last_used = now
        if getattr(self, "cache_prompt", True):
            valid = slot.n_past if slot.keep is None else min(slot.n_past, slot.keep)
            slot.cache_req, slot.cache_len = req, valid
            self.kv.cached += valid
        slot.n_past = slot.n_prompt = 0
        slot.keep = None
        slot.gen = False
