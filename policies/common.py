"""Machinery every continuous-batching policy shares: queues, admission checks, the batch summary,
token accounting and finishing. Policies keep only their own scheduling rules."""

from __future__ import annotations

from collections import deque

import numpy as np

from policies.base import DecodeRun, PolicyLimits, StepPlan
from sim.core.batch import BatchSummary
from sim.core.request import Request, RequestSpec, Status
from sim.kv import KVCacheManager


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
        reason = self.rejection_reason(req.spec)
        if reason is not None:
            return reason
        req.queued_time = now
        req.seq = self._seq
        self._seq += 1
        self.waiting.append(req)
        return None

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        """Why this policy could never run ``spec`` (None if it can): its limits, not its load."""
        lim = self.limits
        if spec.prompt_len >= lim.max_model_len:
            # vLLM rejects prompts that leave no room for one output token.
            return f"prompt longer than max_model_len ({spec.prompt_len} >= {lim.max_model_len})"
        need = -(-min(spec.prompt_len + spec.output_len, lim.max_model_len) // lim.block_size)
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
        add_dec, add_sampled = dec.append, sampled.append  # bound once: this loop sees every row
        for req, n in plan.scheduled:
            before = req.num_computed_tokens
            after = before + n
            req.num_computed_tokens = after
            total = req.num_tokens
            if after == total:
                if n == 1 and req.num_output_tokens > 0:
                    add_dec(after)
                else:
                    chunks.append(n)
                    ctxs.append(before)
                add_sampled(req)
            else:
                chunks.append(n)
                ctxs.append(before)
                if after > total:
                    add_sampled(req)
        plan.batch = BatchSummary.of(dec, chunks, ctxs, len(sampled))
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
    def decode_run(self, finishes_ok: bool = False) -> DecodeRun | None:
        return None

    def apply_decode_run(self, run: DecodeRun, end_times: np.ndarray) -> list[Request]:
        """Apply k decode steps at once: the same end state as k calls to schedule+update.

        Rows that finish inside the run split it into segments: each segment grows the rows still
        running, then frees the finished ones, so blocks return to the free queue in the same order and
        at the same step as step by step (later growth may pop them, or evict cached blocks instead).
        """
        k = len(end_times)
        kv = self.kv
        fin = run.finish_step
        cum = run.new_blocks
        free_out = np.empty(k, dtype=np.int64)
        cached_out = np.empty(k, dtype=np.int64)
        bounds = np.unique(fin[fin < k]).tolist()  # steps after which rows finish, then the last
        bounds.append(k)
        # Rows whose blocks get hashed need their token counts current at every allocation; the others
        # are advanced once, when they finish or when the run ends (the manager is given their counts).
        reqs = run.requests
        lazy = not kv.enable_caching or not any(r.spec.shares_content for r in reqs)
        fin_l = fin.tolist()
        base = run.computed.tolist()
        max_len = self.limits.max_model_len
        finished: list[Request] = []
        alive = list(range(len(reqs)))
        a = 0
        for b in bounds:
            m = b - a
            rows = [reqs[i] for i in alive]
            free0 = kv.num_free_blocks
            free_out[a:b] = free0 - (cum[a + 1:b + 1] - cum[a])
            cached0 = run.cached_free_start if a == 0 else kv.num_cached_free_blocks
            np.minimum(free_out[a:b], cached0, out=cached_out[a:b])  # uncached free blocks go first
            if lazy:
                kv.grow_decodes(rows, m, computed=[base[i] + a for i in alive])
            else:
                # Hashed content registers each block when it completes, step by step and row by row
                # as vLLM does: two rows completing blocks of the same content in one run must register
                # them in that order (the first registered is the one a later lookup returns).
                for _ in range(m):
                    kv.grow_decodes(rows, 1)
                    for req in rows:
                        req.num_computed_tokens += 1
                        req.num_output_tokens += 1  # inlined add_output_tokens
                        req.num_tokens += 1
            if kv.num_free_blocks != free_out[b - 1]:
                raise RuntimeError(f"decode run: {free0 - kv.num_free_blocks} blocks taken, "
                                   f"{free0 - free_out[b - 1]} predicted")
            done = [reqs[i] for i in alive if fin_l[i] == b]
            if done:
                for req in done:
                    if lazy:
                        req.num_computed_tokens += b
                        req.num_output_tokens += b
                        req.num_tokens += b
                    if req.num_output_tokens < req.output_len and req.num_tokens < max_len:
                        raise RuntimeError(f"decode run: request {req.request_id} was to finish at step {b}")
                self._finish(done, float(end_times[b - 1]))
                finished.extend(done)
                alive = [i for i in alive if fin_l[i] != b]
            a = b
        if lazy:
            for i in alive:
                req = reqs[i]
                req.num_computed_tokens += k
                req.num_output_tokens += k
                req.num_tokens += k
        run.free_blocks, run.cached_free = free_out, cached_out
        return finished

    # A finish frees blocks and a batch slot; with nothing waiting, that changes no later decision of a
    # policy that sets this, so its decode runs may go on past finishes (DecodeRun).
    finishes_in_runs = False

    def quiet_decode_run(self, waiting_blocked: bool, finishes_ok: bool = False) -> DecodeRun | None:
        """Shared test for a fast-forwardable stretch: every running row is decoding, nothing can be
        admitted, and the free blocks cover every row's growth (finished rows' frees not counted).
        The run ends at the first finish unless the engine allows finishes (``finishes_ok``), the
        policy's rules do (``finishes_in_runs``) and nothing waits."""
        running = self.running
        if not running or (self.waiting and not waiting_blocked):
            return None
        max_len = self.limits.max_model_len
        n = len(running)
        computed = [0] * n
        left = [0] * n
        for i, req in enumerate(running):
            c = req.num_computed_tokens
            t = req.num_tokens
            if t - c != 1 or t == req.prompt_len:
                return None
            computed[i] = c
            rest = req.output_len - req.num_output_tokens
            left[i] = rest if rest < max_len - t else max_len - t
        through = finishes_ok and self.finishes_in_runs and not self.waiting
        k = max(left) if through else min(left)
        if k < 2:
            return None
        kv = self.kv
        c = np.array(computed, dtype=np.int64)
        fin = np.array(left, dtype=np.int64)
        held = kv.num_blocks_held_array(running)
        cum = kv.decode_run_blocks(c, held, fin, k)
        free = kv.num_free_blocks
        if cum[k] > free:
            k = int(np.searchsorted(cum, free, side="right")) - 1  # cum is non-decreasing
            if k < 2:
                return None
        return DecodeRun(requests=list(running), max_steps=k, computed=c, finish_step=fin,
                         new_blocks=cum[:k + 1], cached_free_start=kv.num_cached_free_blocks)
