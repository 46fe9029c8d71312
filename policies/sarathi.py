"""Sarathi-Serve: chunked prefills with stall-free batching (engines.md §5.2, SAR-1 .. SAR-3; the
scheduler of microsoft/sarathi-serve ``sarathi_scheduler.py`` and its block manager).

Per iteration, with a token budget of ``chunk_size``:
1. every running request whose prompt is done gets one decode token; when no block is free
   (``can_append_slot`` is ``free > 0``), the last not-yet-visited running request is preempted by
   recompute (front of waiting), or the request itself when none is left;
2. running requests with an unfinished prompt get ``min(remaining prompt, chunk_size - batched)``;
3. waiting requests FCFS while the whole prompt's blocks fit above the watermark, ``len(running) <
   max_num_seqs`` and budget is left; each gets a chunk. The whole prompt is allocated at admission.

Decodes never wait for a prefill (no prefill-only iterations). SAR-4 (dynamic chunk schedule) is not
modelled. Unlike vLLM V1, a step that preempted may still admit (the Sarathi code has no such check).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import MemoryRule, PolicyOptions, invalid, refuse_switches
from policies.preemption import preempt_recompute
from sim.core.errors import ConfigError
from sim.core.request import Request, Status


@dataclass(frozen=True)
class SarathiOptions(PolicyOptions):
    LIMITS = {
        "max_num_batched_tokens": 512,  # chunk_size (SAR-1)
        "max_num_seqs": 128,
        "block_size": 16,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
    }
    ALIASES = {"chunk_size": "max_num_batched_tokens"}  # Sarathi-Serve's name for the token budget

    watermark: float = 0.01
    GPU_MEMORY_UTILIZATION = 0.8  # sarathi/config/config.py WorkerConfig.gpu_memory_utilization

    def validate(self) -> None:
        if not 0 <= self.watermark < 1:
            raise invalid("watermark", self.watermark, "in [0, 1)")

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """sarathi/model_executor/model_runner.py profile_num_available_blocks: one forward of a chunk_size
        chunk, no sampler; KV = total x util - torch.cuda.max_memory_allocated() (no non-torch term)."""
        return MemoryRule(profile="sarathi", profile_tokens=int(limits["max_num_batched_tokens"]))


class SarathiPolicy(QueuedPolicy):
    name = "sarathi"

    def __init__(self, limits: PolicyLimits, options: SarathiOptions | None = None) -> None:
        watermark = (options or SarathiOptions()).watermark
        if not limits.enable_chunked_prefill:
            raise ConfigError("[engine] enable_chunked_prefill: Sarathi-Serve always chunks prefills (SAR-2)")
        refuse_switches(asdict(limits), enable_prefix_caching="Sarathi-Serve has no prefix cache")
        super().__init__(limits)
        self.watermark_blocks = int(watermark * limits.num_gpu_blocks)

    def schedule(self, now: float) -> StepPlan:
        lim, kv = self.limits, self.kv
        chunk = lim.max_num_batched_tokens
        plan = StepPlan()
        batched = 0
        running: list[Request] = []
        prefills: list[Request] = []
        queue = list(self.running)
        while queue:
            req = queue.pop(0)
            if req.num_tokens - req.num_computed_tokens > 1 or not req.num_output_tokens:  # prompt left
                prefills.append(req)
                continue
            # SAR-2.1; can_append_slot is "some block is free" in Sarathi's block manager.
            while kv.num_free_blocks == 0:
                victim = queue.pop() if queue else req
                preempt_recompute(kv, victim)
                plan.preempted.append(victim)
                self.waiting.appendleft(victim)
                if victim is req:
                    break
            else:
                ok = kv.allocate_slots(req, 1) is not None
                assert ok, "a free block exists"
                plan.scheduled.append((req, 1))
                running.append(req)
                batched += 1
        for req in prefills:  # SAR-2.2: their blocks were allocated at admission (SAR-3)
            n = min(req.num_tokens - req.num_computed_tokens, chunk - batched)
            running.append(req)
            if n <= 0:
                continue
            ok = kv.allocate_slots(req, n)
            assert ok is not None, "prompt blocks are held"
            plan.scheduled.append((req, n))
            batched += n
        waiting = self.waiting
        while waiting:  # SAR-2.3
            req = waiting[0]
            need = -(-req.num_tokens // lim.block_size)
            if kv.num_free_blocks - need < self.watermark_blocks:
                break
            if len(running) >= lim.max_num_seqs:
                break
            n = min(req.num_tokens, chunk - batched)
            if n <= 0:
                break
            waiting.popleft()
            blocks = kv.allocate_slots(req, n, num_lookahead_tokens=req.num_tokens - n)
            assert blocks is not None, "checked against the free blocks"
            if req.status is Status.WAITING:
                req.num_cached_tokens = 0
                req.scheduled_time = now
            req.status = Status.RUNNING
            plan.scheduled.append((req, n))
            plan.admitted.append(req)
            running.append(req)
            batched += n
        self.running = running
        return self.finalize_plan(plan)

    def quiet(self) -> Quiet | None:
        # With nothing waiting and no prompt left, a step is the running rows' decodes in order (they
        # are not counted against the chunk), as long as some block stays free: SAR-2.1 preempts on an
        # empty pool even when the row needs no block.
        return None if self.waiting else Quiet(waiting_blocked=False, keep_free=1)


@register("sarathi", options=SarathiOptions)
def _make(limits: PolicyLimits, options: SarathiOptions) -> SarathiPolicy:
    return SarathiPolicy(limits, options)
