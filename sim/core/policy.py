"""What a policy is to the engine: the step plan it returns, the limits it gets, its protocol.

The engine and the recorder see policies only through these types, so they live below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sim.core.plan import StepPlan  # compiled (sim/native.py); policies import it from here
from sim.core.request import Request, RequestSpec

if TYPE_CHECKING:  # the KV layer sits above core; a policy only holds a manager
    from sim.kv import KVCacheManager


@dataclass(frozen=True, slots=True)
class Quiet:
    """A policy's answer when its next steps may be plain decodes (``Policy.quiet``).

    ``waiting_blocked``: nobody waiting can be admitted while the running rows only decode (e.g. the
    batch is full, or the queue head waits for blocks that decodes only consume); with it False the
    steps are quiet only when nothing waits. ``finishes_matter``: a finish may change the policy's next
    decision even with nothing waiting (a policy that counts steps or re-forms batches says True).
    ``keep_free``: free KV blocks every step must leave, for a policy whose rules change when the pool
    runs dry even if no row needs a block then (Sarathi preempts whenever no block is free).
    """

    waiting_blocked: bool
    finishes_matter: bool = True
    keep_free: int = 0


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """Resolved engine limits every policy sees (after presets and the memory plan)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    scheduling_policy: str = "fcfs"
    max_new_tokens: int | None = None
    # vLLM V1's async scheduling (an engine setting the scheduler must know: rows carry tokens in flight).
    async_scheduling: bool = False


class Policy(Protocol):
    name: str
    kv: KVCacheManager

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        """Why this policy could never run ``spec`` (None if it can), from its limits alone (prompt
        length, KV pool, token budget), never its load: a cluster gateway asks it before routing."""

    def add_request(self, req: Request, now: float) -> str | None:
        """Queue a request; return a rejection reason instead. It rejects with ``rejection_reason(
        req.spec)`` when that is not None (a slot engine, which defers every task, reports it when a
        slot takes the request), and may also reject for the moment's load (a full queue)."""

    def schedule(self, now: float) -> StepPlan: ...

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step: emit tokens, finish requests, free their blocks. Returns the finished."""

    def abort(self, req: Request, now: float) -> None:
        """Drop ``req`` wherever it is (its client went away): out of every queue, its KV freed.
        The engine sets its status; finished or rejected requests are never passed."""

    def quiet(self) -> Quiet | None:
        """May the next steps be plain decodes: every running row computes one token, nobody joins,
        nobody is preempted, no timer fires? None when not (or when the policy does not say). A policy
        that answers also offers ``running``, ``limits`` and ``finish(requests, now)`` (QueuedPolicy)."""

    def on_skipped_steps(self, k: int) -> None:
        """The engine advanced k plain decode steps without calling schedule/update: do the
        bookkeeping ``schedule`` would have done in them (step counters, due flags)."""

    def has_unfinished(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...
