"""Machinery every continuous-batching policy shares: queues, admission checks, the batch summary,
token accounting and finishing. Policies keep only their own scheduling rules."""

from __future__ import annotations

from collections import deque

import numpy as np

from policies.base import DecodeRun, PolicyLimits, StepPlan
from sim.batch import BatchSummary
from sim.kv import KVCacheManager
from sim.request import Request, Status


class QueuedPolicy:
    """Waiting deque + running list + KV manager; ``schedule`` is the subclass's job."""

    name = "base"

    def __init__(self, limits: PolicyLimits) -> None:
        self.limits = limits
        self.kv = KVCacheManager(
            num_gpu_blocks=limits.num_gpu_blocks,
            block_size=limits.block_size,
            enable_caching=limits.enable_prefix_caching,
            max_model_len=limits.max_model_len,
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._seq = 0

    # ---- queue -----------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> str | None:
        reason = self.rejection_reason(req)
        if reason is not None:
            return reason
        req.queued_time = now
        req.seq = self._seq
        self._seq += 1
        self.waiting.append(req)
        return None

    def rejection_reason(self, req: Request) -> str | None:
        lim = self.limits
        if req.prompt_len >= lim.max_model_len:
            # vLLM rejects prompts that leave no room for one output token.
            return f"prompt longer than max_model_len ({req.prompt_len} >= {lim.max_model_len})"
        need = -(-min(req.prompt_len + req.output_len, lim.max_model_len) // lim.block_size)
        if need > self.kv.usable_blocks:
            return f"needs {need} KV blocks, the pool has {self.kv.usable_blocks}"
        return None

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- plan helpers ----------------------------------------------------------------------------
    def finalize_plan(self, plan: StepPlan) -> StepPlan:
        """Advance computed tokens (vLLM's _update_after_schedule) and summarise the batch for pricing."""
        dec: list[int] = []
        chunks: list[int] = []
        ctxs: list[int] = []
        sampled = plan.sampled
        for req, n in plan.scheduled:
            before = req.num_computed_tokens
            after = before + n
            req.num_computed_tokens = after
            if n == 1 and req.num_output_tokens > 0 and after == req.num_tokens:
                dec.append(after)
            else:
                chunks.append(n)
                ctxs.append(before)
            if after >= req.num_tokens:
                sampled.append(req)
        plan.batch = BatchSummary(
            decode_ctx=np.asarray(dec, dtype=np.int64),
            prefill_chunk=np.asarray(chunks, dtype=np.int64),
            prefill_ctx=np.asarray(ctxs, dtype=np.int64),
            num_logits=len(sampled),
        )
        return plan

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        """Each sampled row gained a token (timestamps are set by the recorder); finish the done ones."""
        finished: list[Request] = []
        max_len = self.limits.max_model_len
        for req in plan.sampled:
            req.num_output_tokens += 1  # inlined add_output_tokens(1)
            req.num_tokens += 1
            if req.num_output_tokens >= req.output_len or req.num_tokens >= max_len:
                finished.append(req)
        if finished:
            self._finish(finished, now)
        return finished

    def _finish(self, finished: list[Request], now: float) -> None:
        for req in finished:
            req.status = Status.FINISHED
            req.finish_time = now
            req.finish_reason = "length" if req.num_output_tokens >= req.output_len else "max_model_len"
            self.kv.free(req)
        done = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in done]

    # ---- fast-forward ----------------------------------------------------------------------------
    def decode_run(self) -> DecodeRun | None:
        return None

    def apply_decode_run(self, run: DecodeRun, end_times: np.ndarray) -> list[Request]:
        """Apply k decode steps at once: the same end state as k calls to schedule+update."""
        k = len(end_times)
        max_len = self.limits.max_model_len
        finished: list[Request] = []
        reqs = run.requests
        # Output tokens first so that allocation may register the blocks these tokens fill.
        for req in reqs:
            req.num_output_tokens += k - 1  # inlined add_output_tokens
            req.num_tokens += k - 1
        self.kv.grow_decodes(reqs, k)
        for req in reqs:
            req.num_computed_tokens += k
            req.num_output_tokens += 1
            req.num_tokens += 1
            if req.num_output_tokens >= req.output_len or req.num_tokens >= max_len:
                finished.append(req)
        if finished:
            self._finish(finished, float(end_times[-1]))
        return finished

    def quiet_decode_run(self, waiting_blocked: bool) -> DecodeRun | None:
        """Shared test for a fast-forwardable stretch: every running row is decoding, nothing can be
        admitted, and the free blocks cover the growth of every row until the first one finishes."""
        running = self.running
        if not running or (self.waiting and not waiting_blocked):
            return None
        max_len = self.limits.max_model_len
        k = 1 << 30
        computed = []
        for req in running:
            c = req.num_computed_tokens
            if req.num_tokens - c != 1 or req.num_tokens == req.prompt_len:
                return None
            left = req.output_len - req.num_output_tokens
            if left < k:
                k = left
            if max_len - req.num_tokens < k:
                k = max_len - req.num_tokens
            computed.append(c)
        if k < 2:
            return None
        c = np.asarray(computed, dtype=np.int64)
        kv = self.kv
        held = np.fromiter((kv.num_blocks_held(r) for r in running), np.int64, len(running))
        bs = self.limits.block_size
        free = kv.num_free_blocks
        if np.maximum(-(-(c + k) // bs) - held, 0).sum() > free:
            steps = np.arange(1, k + 1, dtype=np.int64)
            need = np.maximum(-(-(c[None, :] + steps[:, None]) // bs) - held[None, :], 0).sum(axis=1)
            k = int(np.searchsorted(need, free, side="right"))  # need is non-decreasing in steps
        if k < 2:
            return None
        return DecodeRun(requests=list(running), max_steps=k, ctx_sum=int(c.sum()) + len(running),
                         computed=c, held=held)
