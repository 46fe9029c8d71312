"""Machinery every continuous-batching policy shares: queues, admission checks, the batch summary,
token accounting and finishing. Policies keep only their own scheduling rules."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol

from mypy_extensions import mypyc_attr

from policies.base import PolicyLimits, Quiet, StepPlan
from sim.core.batch import BatchSummary
from sim.core.request import Request, RequestSpec, Status
from sim.kv import KVCacheManager


class RequestQueue(Protocol):
    """What the policies ask of their waiting queue (vLLM's RequestQueue): a deque, or the priority heap."""

    def append(self, req: Request) -> None: ...
    def appendleft(self, req: Request) -> None: ...
    def popleft(self) -> Request: ...
    def remove(self, req: Request) -> None: ...
    def __getitem__(self, i: int) -> Request: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # every continuous-batching preset subclasses it
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
        self.waiting: RequestQueue = deque()
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
        dec_sum = 0
        sampled: list[Request] = plan.sampled  # appended to directly: compiled, list.append is a C call
        for req, n in plan.scheduled:
            before = req.num_computed_tokens
            after = before + n
            req.num_computed_tokens = after
            total = req.num_tokens
            if after == total:
                if n == 1 and req.num_output_tokens > 0:
                    dec.append(after)
                    dec_sum += after
                else:
                    chunks.append(n)
                    ctxs.append(before)
                sampled.append(req)
            else:
                chunks.append(n)
                ctxs.append(before)
                if after > total:
                    sampled.append(req)
        plan.batch = BatchSummary.of_lists(dec, chunks, ctxs, len(sampled), dec_sum)
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
            self.finish(finished, now)
        return finished

    def finish(self, finished: list[Request], now: float) -> None:
        """Finish these running requests at ``now``: status, reason, their blocks freed."""
        for req in finished:
            req.status = Status.FINISHED
            req.finish_time = now
            req.finish_reason = "length" if req.num_output_tokens >= req.output_len else "max_model_len"
            self.kv.free(req)
        self.drop_finished(finished)

    def drop_finished(self, finished: list[Request]) -> None:
        """Take ``finished`` (their status set to FINISHED already) out of the running list, in order.
        A few: a scan in C each. More: one pass reading each row's status (a set of ids boxed every
        row's id: a quarter of an overloaded step's update, callgrind at 240 rows running). A row among
        them that was not running (async: preempted, finished by its stale output) is skipped."""
        running = self.running
        if len(finished) <= 4:
            for req in finished:
                for i in range(len(running)):  # by identity, as list.remove would find it
                    if running[i] is req:
                        del running[i]
                        break
        else:
            done = Status.FINISHED
            self.running = [r for r in running if r.status is not done]

    def abort(self, req: Request, now: float) -> None:
        """vLLM's abort_requests: out of the running list or the waiting queue, blocks freed."""
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)

    # ---- quiet stretches ---------------------------------------------------------------------------
    def quiet(self) -> Quiet | None:
        """Policies whose next steps can be told to be plain decodes override this (Policy.quiet)."""
        return None

    def on_skipped_steps(self, k: int) -> None:
        """Nothing to do: the base keeps no per-step state outside the requests and the KV manager."""
