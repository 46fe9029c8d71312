"""Static batching as HF transformers ``generate`` does it (engines.md §4.1, rules HF-1..HF-4).

A batch forms only when the engine is idle; prompts are left-padded to the longest; KV is reserved for
the padded prompt plus ``max_new_tokens`` for every row; finished rows keep being computed (pad
tokens) until the longest row ends, and every result is returned at the batch's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from policies.base import PolicyLimits, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import MemoryRule, PolicyOptions, invalid, refuse_switches
from sim.core.batch import BatchSummary
from sim.core.request import Request, Status


@dataclass(frozen=True)
class StaticOptions(PolicyOptions):
    """``max_new_tokens`` goes to PolicyLimits (resolve() copies it there; the policy reads its limits)."""

    LIMITS = {
        "max_num_seqs": 8,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "block_size": 16,
    }
    LIMIT_FIELDS = ("max_new_tokens",)
    VLLM_BUDGET_RULE = True

    max_new_tokens: int | None = None  # HF generate's max_new_tokens (None: the batch's longest output)
    GPU_MEMORY_UTILIZATION = 1.0  # HF reserves nothing: the whole card (a share of it when set)

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """HF-4: no pre-reservation, the cache grows until the GPU is full; the budget is the device less
        the CUDA context, weights and a prefill's intermediates, and a long max_model_len never stops it
        from starting (sim/app/engine_memory.py)."""
        return MemoryRule(profile="hf", profile_tokens=int(limits["max_num_batched_tokens"]), free_fraction=1.0,
                          cap_max_model_len=True)

    def validate(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise invalid("max_new_tokens", self.max_new_tokens, "an integer >= 1 (or unset)")


class StaticPolicy(QueuedPolicy):
    name = "static"

    def __init__(self, limits: PolicyLimits, options: StaticOptions | None = None) -> None:
        # Both default to False here (StaticOptions.LIMITS), so True is the user's: refused, not ignored.
        refuse_switches(asdict(limits), enable_chunked_prefill="HF transformers generate runs every prompt of a "
                        "batch in one forward pass (HF-1)", enable_prefix_caching="HF transformers generate has no "
                        "prefix cache (each batch starts from an empty cache)")
        super().__init__(limits)
        self.batch: list[Request] = []
        self.pad_len = 0  # padded prompt length of the current batch (HF-1)
        self.steps_total = 0  # forward passes of the current batch: 1 prefill + decodes (HF-3)
        self.steps_done = 0

    def _row_len(self, max_prompt: int, max_out: int) -> int:
        max_new = self.limits.max_new_tokens or max_out
        return max_prompt + max_new

    def _form_batch(self, now: float) -> None:
        """FCFS, while the padded reservation of every row still fits (HF-4, StaticCache)."""
        bs = self.limits.block_size
        free = self.kv.num_free_blocks
        batch: list[Request] = []
        max_p = max_o = 0
        for req in self.waiting:
            if len(batch) >= self.limits.max_num_seqs:
                break
            p, o = max(max_p, req.prompt_len), max(max_o, req.output_len)
            per_row = -(-min(self._row_len(p, o), self.limits.max_model_len) // bs)
            if per_row * (len(batch) + 1) > free:
                break
            batch.append(req)
            max_p, max_o = p, o
        if not batch:
            return
        row_tokens = min(self._row_len(max_p, max_o), self.limits.max_model_len)
        for req in batch:
            self.waiting.popleft()
            ok = self.kv.allocate_slots(req, row_tokens)
            assert ok is not None, "reservation checked above"
            req.status = Status.RUNNING
            req.scheduled_time = now
            req.num_cached_tokens = 0
        self.batch = batch
        self.running = list(batch)
        self.pad_len = max_p
        max_new = self.limits.max_new_tokens or max_o
        self.steps_total = min(max_new, max_o)
        self.steps_done = 0

    def _target(self, req: Request) -> int:
        return min(req.output_len, self.limits.max_new_tokens or req.output_len)

    def schedule(self, now: float) -> StepPlan:
        if not self.batch:
            self._form_batch(now)
            if not self.batch:
                return StepPlan()
        plan = StepPlan()
        rows = len(self.batch)
        if self.steps_done == 0:
            for req in self.batch:
                plan.scheduled.append((req, req.prompt_len))
                req.num_computed_tokens = req.prompt_len
                plan.sampled.append(req)
            plan.admitted = list(self.batch)
            # Every row computes the padded prompt (padding is masked, not skipped: HF-1).
            plan.batch = BatchSummary(
                prefill_chunk=np.full(rows, self.pad_len, dtype=np.int64),
                prefill_ctx=np.zeros(rows, dtype=np.int64),
                num_logits=rows,
            )
        else:
            for req in self.batch:
                if req.num_output_tokens < self._target(req):
                    plan.scheduled.append((req, 1))
                    req.num_computed_tokens += 1
                    plan.sampled.append(req)
            # Finished rows still run a full-width forward pass on pad tokens (HF-3).
            ctx = self.pad_len + self.steps_done + 1
            plan.batch = BatchSummary(decode_ctx=np.full(rows, ctx, dtype=np.int64), num_logits=rows)
        return plan

    def abort(self, req: Request, now: float) -> None:
        """A waiting request leaves the queue; a batch row keeps running (HF generate has no
        per-row abort) and its KV is freed with the batch."""
        if req in self.waiting:
            self.waiting.remove(req)

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        for req in plan.sampled:
            req.add_output_tokens(1)
        self.steps_done += 1
        if self.steps_done < self.steps_total:
            return []
        finished = [r for r in self.batch if not r.is_finished]  # every result together
        for req in self.batch:
            if req.is_finished:  # aborted mid-batch: its row ran to the end all the same (HF-3)
                self.kv.free(req)
                continue
            req.status = Status.FINISHED
            req.finish_time = now
            req.finish_reason = "length"
            self.kv.free(req)
        self.batch, self.running = [], []
        return finished

    def has_unfinished(self) -> bool:
        return bool(self.batch or self.waiting)


@register("static", options=StaticOptions)
def _make(limits: PolicyLimits, options: StaticOptions) -> StaticPolicy:
    return StaticPolicy(limits, options)


register("hf-static", options=StaticOptions)(_make)
