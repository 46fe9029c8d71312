"""Text-Generation-Inference (HEAD, router + backends/v3), rule by rule from engines.md §4.2.

- TGI-1: at most ``max_concurrent_requests`` requests in the system; beyond, HTTP 429 "Model is overloaded".
- TGI-2: FIFO queue; an entry is admitted only if blocks for ``input + max_new_tokens - 1`` tokens can be
  reserved (no preemption ever), else it goes back to the front and admission stops (head-of-line);
  a prefill budget of ``max_batch_prefill_tokens``: with chunking the last entry gets the budget left as a
  chunk, without chunking it waits; a new batch smaller than ``min_size`` is put back whole.
- TGI-3: prefill a first batch, then loop {try to admit a new batch; one decode step}. Without chunking
  ``min_size = floor(batch_size x waiting_served_ratio)`` unless ``max_waiting_tokens`` decode steps passed
  since the last admission, and the new batch is prefilled alone while the running batch waits. With
  chunking (TGI's default where the backend supports it) the new batch is prefilled together with the
  running batch (its rows decode in the same forward), its budget is ``max_batch_prefill_tokens`` minus the
  running batch's tokens, and ``min_size`` is ignored.

Simplification (our reading): a prompt that was cut into a chunk continues, one chunk per forward, in
the following steps before new entries are considered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import MemoryRule, PolicyOptions, invalid
from sim.core.errors import ConfigError
from sim.core.request import Request, RequestSpec, Status


@dataclass(frozen=True)
class TgiOptions(PolicyOptions):
    LIMITS = {
        "block_size": 16,  # BLOCK_SIZE for paged attention (models/globals.py)
        "max_num_batched_tokens": 4096,  # max_batch_prefill_tokens
        "max_num_seqs": 128,  # max_batch_size is unset by default; max_concurrent_requests bounds the batch
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,  # PREFILL_CHUNKING=1 where the attention backend supports it
    }
    ALIASES = {"max_batch_size": "max_num_seqs", "max_batch_prefill_tokens": "max_num_batched_tokens"}

    max_concurrent_requests: int = 128
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    max_batch_total_tokens: int | None = None  # None: inferred from memory (the whole KV pool)
    wiggle_room: float = 0.90  # TGI_WIGGLE_ROOM: the share of free memory after warmup the KV cache takes
    # [engine] gpu_memory_utilization plays TGI's --cuda-memory-fraction (default 1.0: the whole card).
    GPU_MEMORY_UTILIZATION = 1.0

    def validate(self) -> None:
        for key in ("max_concurrent_requests", "max_waiting_tokens"):
            if getattr(self, key) < 1:
                raise invalid(key, getattr(self, key), ">= 1")
        if not self.waiting_served_ratio >= 0:
            raise invalid("waiting_served_ratio", self.waiting_served_ratio, ">= 0")
        if not 0 < self.wiggle_room < 1:  # TGI asserts 0 < TGI_WIGGLE_ROOM < 1
            raise invalid("wiggle_room", self.wiggle_room, "in (0, 1)")

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """Warmup (server/text_generation_server/models/flash_causal_lm.py): a prefill of
        max_batch_prefill_tokens, with prefill logprobs (backends/v3 grpc_client.rs), then KV =
        TGI_WIGGLE_ROOM x (free - (1 - cuda_memory_fraction) x total); unset max_input/total tokens come
        from what fits (launcher passes None to the warmup). docs/memory_reservations.md."""
        return MemoryRule(profile="tgi", profile_tokens=int(limits["max_num_batched_tokens"]),
                          free_fraction=self.wiggle_room, cap_max_model_len=True)

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Any) -> TgiOptions:
        mbtt = self.max_batch_total_tokens
        if mbtt is not None:
            # TGI sizes its block allocator from max_batch_total_tokens; more than fits fails at warmup.
            blocks = mbtt // limits["block_size"]
            if blocks + 1 > plan.num_gpu_blocks:
                raise ConfigError(
                    f"[engine] max_batch_total_tokens = {mbtt} needs {blocks} KV blocks, only "
                    f"{plan.num_gpu_blocks - 1} fit (memory plan)"
                )
            if blocks < 1:
                raise ConfigError(f"[engine] max_batch_total_tokens = {mbtt} is less than one block")
            # TGI refuses both at start-up (launcher, backends/v3 main.rs): a prefill batch, and a request's
            # max_total_tokens where it is given, must fit the batch's total
            checks = [("max_batch_prefill_tokens", limits["max_num_batched_tokens"])]
            if explicit.get("max_model_len") is not None:
                checks.append(("max_model_len (TGI's max_total_tokens)", limits["max_model_len"]))
            for knob, v in checks:
                if v > mbtt:
                    raise ConfigError(f"[engine] {knob} = {v} is past max_batch_total_tokens = {mbtt}; TGI refuses "
                                      f"this at start-up; allowed: max_batch_total_tokens >= {v}")
            limits["num_gpu_blocks"] = blocks + 1
        return self


OVERLOADED = "Model is overloaded (429)"


class TgiPolicy(QueuedPolicy):
    name = "tgi"

    def __init__(self, limits: PolicyLimits, options: TgiOptions | None = None) -> None:
        options = options or TgiOptions()
        self.max_concurrent = options.max_concurrent_requests
        self.ratio = options.waiting_served_ratio
        self.max_waiting_tokens = options.max_waiting_tokens
        super().__init__(limits)
        self.chunking = limits.enable_chunked_prefill
        self.waiting_tokens = 0
        self._decode_due = False  # after a prefill forward, the loop always decodes next (TGI-3)

    def add_request(self, req: Request, now: float) -> str | None:
        if len(self.running) + len(self.waiting) >= self.max_concurrent:
            return OVERLOADED  # TGI-1
        return super().add_request(req, now)

    def rejection_reason(self, spec: RequestSpec) -> str | None:
        reason = super().rejection_reason(spec)
        if reason is None and not self.chunking and spec.prompt_len > self.limits.max_num_batched_tokens:
            return (
                f"input ({spec.prompt_len} tokens) exceeds max_batch_prefill_tokens without prefill chunking"
            )
        return reason

    def _reserve(self, req: Request) -> int:
        # TGI-2: input + max_new_tokens + speculate - 1 tokens (speculate = 0)
        return min(req.prompt_len + req.output_len - 1, self.limits.max_model_len)

    def _next_batch(self, plan: StepPlan, min_size: int | None, budget: int, now: float) -> None:
        """queue.rs next_batch: pop FIFO entries while their reservation and the prefill budget allow.

        Decided on a dry run first, so that a batch put back for ``min_size`` leaves no trace."""
        kv, waiting = self.kv, self.waiting
        taken: list[tuple[Request, int]] = []
        prefill_tokens = 0
        free = kv.num_free_blocks
        for req in waiting:
            if len(self.running) + len(taken) >= self.limits.max_num_seqs:
                break
            hit_blocks, hit = kv.peek_computed_blocks(req)  # a full hit keeps one token (KV-5 cap)
            postfix = req.num_tokens - hit
            chunk = postfix
            if prefill_tokens + postfix > budget:
                if not self.chunking or budget - prefill_tokens <= 0:
                    break
                chunk = budget - prefill_tokens
            need = kv.num_blocks_needed(req, self._reserve(req)) - len(hit_blocks)
            need += sum(1 for b in hit_blocks if b.ref_cnt == 0)
            if need > free:
                break  # the reservation does not fit: back to the front, stop (head-of-line)
            free -= need
            taken.append((req, chunk))
            prefill_tokens += chunk
            if chunk < postfix:
                break
        if not taken or (min_size is not None and len(taken) < min_size):
            return  # the whole batch stays queued, in order
        for req, chunk in taken:
            hit_blocks, hit = kv.get_computed_blocks(req)
            chunk = min(chunk, req.num_tokens - hit)
            ahead = self._reserve(req) - hit - chunk
            if kv.allocate_slots(req, chunk, hit, hit_blocks, num_lookahead_tokens=ahead) is None:
                break  # two entries hit the same evictable block: the later one waits
            waiting.popleft()
            if req.status is Status.WAITING:
                req.num_cached_tokens = hit
                req.scheduled_time = now
            req.status = Status.RUNNING
            req.num_computed_tokens = hit
            self.running.append(req)
            plan.scheduled.append((req, chunk))
            plan.admitted.append(req)

    def _continuing(self, plan: StepPlan, budget: int) -> int:
        """Rows of the running batch: a decode token each, or the next chunk of a cut prompt."""
        used = 0
        for req in self.running:
            left = req.num_tokens - req.num_computed_tokens
            if left == 1 and req.num_output_tokens:
                n = 1
            else:
                n = min(left, max(budget - used, 0))
                if n <= 0:
                    continue
            ok = self.kv.allocate_slots(req, n)
            assert ok is not None, "reserved at admission"
            plan.scheduled.append((req, n))
            used += n
        return used

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        lim = self.limits
        if not self.running:
            self._next_batch(plan, None, lim.max_num_batched_tokens, now)  # first batch, prefilled alone
            if plan.scheduled:
                self.waiting_tokens = 1
                self._decode_due = False  # the batching loop starts with an admission attempt
            return self.finalize_plan(plan)
        if not self._decode_due:
            if self.chunking:
                current = sum(
                    1
                    if (r.num_tokens - r.num_computed_tokens == 1 and r.num_output_tokens)
                    else r.num_tokens - r.num_computed_tokens
                    for r in self.running
                )
                before = len(self.running)
                self._continuing(plan, lim.max_num_batched_tokens)
                self._next_batch(plan, None, max(lim.max_num_batched_tokens - current, 0), now)
                if len(self.running) > before:
                    self.waiting_tokens = 1
                    self._decode_due = True
                    return self.finalize_plan(plan)
                plan = StepPlan()  # nothing joined: this forward is the decode step
            else:
                batch_size = len(self.running)
                min_size = None
                if self.waiting_tokens < self.max_waiting_tokens:
                    min_size = math.floor(batch_size * self.ratio)
                self._next_batch(plan, min_size, lim.max_num_batched_tokens, now)
                if plan.scheduled:  # the new batch is prefilled alone; the running batch waits
                    self.waiting_tokens = 1
                    self._decode_due = True
                    return self.finalize_plan(plan)
        self._continuing(plan, lim.max_num_batched_tokens)
        self._decode_due = False
        self.waiting_tokens += 1
        return self.finalize_plan(plan)

    # ---- quiet stretches: with nobody waiting, the loop is a run of decode steps ---------------------
    def quiet(self) -> Quiet | None:
        return None if self.waiting else Quiet(waiting_blocked=False)

    def on_skipped_steps(self, k: int) -> None:
        # What k decode-only passes through schedule() would have left behind.
        self.waiting_tokens += k
        self._decode_due = False


@register("tgi", options=TgiOptions)
def _make(limits: PolicyLimits, options: TgiOptions) -> TgiPolicy:
    return TgiPolicy(limits, options)
