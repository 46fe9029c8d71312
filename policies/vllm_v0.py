"""vLLM V0 scheduler (0.6.3.post1), rule by rule from engines.md §1.5 (V0-1 .. V0-7, V0-9).

Differences from V1 that show in a simulation: a 1% watermark on admission and swap-in; swap
preemption (``preemption_mode = "swap"``; auto = recompute for the single-sequence requests simulated
here); while anything is swapped out no prompt is admitted (default mode); without chunked prefill a
step that admits prompts runs no decodes (prefill-only iteration); the whole prompt's blocks are
allocated at admission; a 4 GiB CPU pool per GPU whose exhaustion aborts the engine (SwapSpaceError).

Not modelled: V0-8 (priority scheduling), beam search / n > 1 groups, V0's own prefix-caching block
manager (prefix hits here use the V1 lookup when enable_prefix_caching is set; off by default).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import GIB, MemoryRule, PolicyOptions, derived, invalid
from policies.preemption import preempt_recompute, preempt_swap, swap_in
from sim.core.fields import MAX_INT32
from sim.core.request import Request, RequestSpec, Status
from sim.kv import KVCacheManager

# vLLM V0 refuses a swap space above 70 % of the host's CPU memory (CacheConfig.verify_with_parallel_config,
# "Too large swap space"); servesim does not know the host, so it bounds it by a host far larger than any:
# 1 PiB per GPU. A larger value (1e300) overflowed the byte count (an OverflowError traceback).
MAX_SWAP_GIB = 2**20


@dataclass(frozen=True)
class VllmV0Options(PolicyOptions):
    # engines.md §1.5 defaults. max_num_batched_tokens 512 applies with chunked prefill; without it
    # resolve() uses max(max_model_len, 2048) (config.py:985-1005).
    LIMITS = {
        "block_size": 16,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 512,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
    }
    VLLM_BUDGET_RULE = True

    preemption_mode: str | None = None  # "recompute" | "swap"; None = V0's auto (recompute for n = 1)
    swap_space: float = 4.0  # GiB of CPU swap space per GPU (at most MAX_SWAP_GIB)
    watermark: float = 0.01  # fraction of GPU blocks kept free at admission (V0-2)
    scheduler_delay_factor: float = 0.0  # V0-9
    num_cpu_blocks: int = derived(0)  # from swap_space and the memory plan (V0-1)

    def validate(self) -> None:
        if self.preemption_mode not in (None, "recompute", "swap"):
            raise invalid("preemption_mode", self.preemption_mode, "'recompute' or 'swap'")
        if not 0 <= self.swap_space <= MAX_SWAP_GIB:  # NaN and inf fail too
            raise invalid("swap_space", self.swap_space, f"from 0 to {MAX_SWAP_GIB} GiB (host memory per GPU)")
        if not 0 <= self.watermark < 1:
            raise invalid("watermark", self.watermark, "in [0, 1)")
        if not self.scheduler_delay_factor >= 0:
            raise invalid("scheduler_delay_factor", self.scheduler_delay_factor, ">= 0")

    @staticmethod
    def chunked_prefill(limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> bool:
        """engines.md §1.5: V0 turns chunked prefill on by itself when max_model_len > 32768."""
        if explicit["enable_chunked_prefill"] is not None:
            return bool(limits["enable_chunked_prefill"])
        return bool(limits["enable_chunked_prefill"]) or max_model_len > 32768

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """V0's profile_run covers the budget it will schedule (max(max_model_len, 2048) without chunked
        prefill), and its non-torch term is all non-torch memory, CUDA context included (vllm/worker/
        worker.py determine_num_available_blocks; sim/app/engine_memory.py)."""
        chunked = self.chunked_prefill(limits, explicit, max_model_len)
        return MemoryRule(profile="vllm-v0",
                          profile_tokens=self.budget_tokens(limits, explicit, max_model_len, chunked))

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Any) -> VllmV0Options:
        limits["enable_chunked_prefill"] = self.chunked_prefill(limits, explicit, limits["max_model_len"])
        # engines.md V0-1: num_cpu_blocks = floor(swap_space_bytes / cache_block_size).
        blocks = int(self.swap_space * GIB) // plan.block_bytes
        if blocks > MAX_INT32:  # small blocks: said as the swap_space the user gave, not the derived count
            most = MAX_INT32 * plan.block_bytes / GIB
            raise invalid("swap_space", self.swap_space, f"at most {most:.4g} GiB with this model's "
                                                          f"{plan.block_bytes:,}-byte KV blocks (num_cpu_blocks "
                                                          "within int32)")
        return dataclasses.replace(self, num_cpu_blocks=blocks)


OK, LATER, NEVER = "ok", "later", "never"
IGNORED = "ignored: needs more KV blocks than the pool minus the watermark (vLLM V0 FINISHED_IGNORED)"


class VllmV0Policy(QueuedPolicy):
    name = "vllm-v0"

    def __init__(self, limits: PolicyLimits, options: VllmV0Options | None = None) -> None:
        options = options or VllmV0Options()
        self.mode = options.preemption_mode
        watermark = options.watermark
        self.delay_factor = options.scheduler_delay_factor
        num_cpu_blocks = int(options.num_cpu_blocks)
        super().__init__(limits)
        # V0's block manager has no null block: all num_gpu_blocks are usable, so the pool gets one more.
        self.kv = KVCacheManager(
            num_gpu_blocks=limits.num_gpu_blocks + 1,
            block_size=limits.block_size,
            enable_caching=limits.enable_prefix_caching,
            max_model_len=limits.max_model_len,
            num_cpu_blocks=num_cpu_blocks,
        )
        self.total_blocks = limits.num_gpu_blocks
        self.watermark_blocks = int(watermark * limits.num_gpu_blocks)  # V0-2
        # V0's _get_prompt_limit: max_model_len with chunking, else also bounded by the token budget.
        self.prompt_limit = limits.max_model_len
        if not limits.enable_chunked_prefill:
            self.prompt_limit = min(limits.max_model_len, limits.max_num_batched_tokens)
        self.swapped: deque[Request] = deque()
        self._head_blocked = False
        self._prev_prompt = False
        self._prev_time = 0.0
        self._last_prompt_latency = 0.0

    # ---- queue -------------------------------------------------------------------------------------
    def rejection_reason(self, spec: RequestSpec) -> str | None:
        if spec.prompt_len > self.prompt_limit:
            return (
                f"Input prompt ({spec.prompt_len} tokens) is too long and exceeds limit of {self.prompt_limit}"
            )
        need = -(-min(spec.prompt_len + spec.output_len, self.limits.max_model_len) // self.limits.block_size)
        if need > self.total_blocks:
            return f"needs {need} KV blocks, the pool has {self.total_blocks}"
        return None

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    def _can_allocate(self, req: Request) -> str:
        """V0-2: the watermark applies to admission; NEVER when the pool could never hold the prompt."""
        required = -(-req.num_tokens // self.limits.block_size)
        if self.total_blocks - required < self.watermark_blocks:
            return NEVER
        if self.kv.num_free_blocks - required >= self.watermark_blocks:
            return OK
        return LATER

    def _passed_delay(self, now: float) -> bool:
        """V0-9: with a delay factor, hold prompts until the oldest waited a fraction of the last prompt
        step's latency, or nothing runs."""
        if self._prev_prompt:
            self._last_prompt_latency = now - self._prev_time
        self._prev_time, self._prev_prompt = now, False
        if self.delay_factor > 0 and self.waiting:
            earliest = min(r.arrival_time for r in self.waiting)
            return now - earliest > self.delay_factor * self._last_prompt_latency or not self.running
        return True

    # ---- one step ----------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        self._head_blocked = False
        self._swap_out = self._swap_in = 0
        if self.limits.enable_chunked_prefill:
            self._schedule_chunked(plan, now)
        else:
            self._schedule_default(plan, now)
        self.finalize_plan(plan)
        plan.batch.swap_out_blocks = self._swap_out
        plan.batch.swap_in_blocks = self._swap_in
        return plan

    def _schedule_default(self, plan: StepPlan, now: float) -> None:
        """V0-3: prompts first (only while nothing is swapped out); a step with prompts runs no decodes."""
        budget = _Budget(self.limits.max_num_batched_tokens, self.limits.max_num_seqs, len(self.running))
        if not self.swapped:
            new = self._schedule_prefills(plan, budget, now, chunked=False)
            if new:
                self.running.extend(new)  # prefill-only iteration (V0-3.2)
                return
        decodes, prefills, preempted = self._schedule_running(plan, budget, chunked=False)
        swapped_in: list[Request] = []
        if not plan.preempted:
            swapped_in = self._schedule_swapped(plan, budget, chunked=False)
        self.waiting.extendleft(preempted)  # V0-5: recompute victims go to the front
        self.running = self.running + decodes + prefills + swapped_in

    def _schedule_chunked(self, plan: StepPlan, now: float) -> None:
        """V0-7: running (decodes and prompt chunks) -> swapped (if nothing was preempted) -> new prompts."""
        budget = _Budget(self.limits.max_num_batched_tokens, self.limits.max_num_seqs, 0)
        decodes, prefills, preempted = self._schedule_running(plan, budget, chunked=True)
        swapped_in: list[Request] = []
        if not plan.preempted:
            swapped_in = self._schedule_swapped(plan, budget, chunked=True)
        new = self._schedule_prefills(plan, budget, now, chunked=True)
        self.waiting.extendleft(preempted)
        # Decode-prioritizing order for the next step (our reading of 0.6.3's _schedule_chunked_prefill):
        # rows not visited, swapped in, decodes, prompt chunks, new prompts.
        self.running = self.running + swapped_in + decodes + prefills + new

    def _schedule_prefills(self, plan: StepPlan, budget: _Budget, now: float, chunked: bool) -> list[Request]:
        new: list[Request] = []
        if not self._passed_delay(now):
            return new
        waiting, kv = self.waiting, self.kv
        while waiting:
            req = waiting[0]
            if req.num_tokens > self.prompt_limit:
                waiting.popleft()
                plan.rejected.append((req, f"Input prompt ({req.num_tokens} tokens) exceeds limit of "
                                           f"{self.prompt_limit}"))  # fmt: skip
                continue
            status = self._can_allocate(req)
            if status == LATER:
                self._head_blocked = True
                break
            if status == NEVER:
                waiting.popleft()
                plan.rejected.append((req, IGNORED))
                continue
            hit_blocks, hit = kv.get_computed_blocks(req)
            remaining = req.num_tokens - hit
            n = min(remaining, budget.tokens_left) if chunked else remaining
            counted = n if chunked else req.num_tokens  # V0 budgets the whole uncomputed prompt
            if n <= 0 or not budget.can_schedule(counted, 1):
                # Blocked by this step's budget, after a prefix lookup that V0 counts in its stats:
                # a decode run must not skip the next steps' lookups (nor a budget that a finished
                # prompt chunk frees), so this does not count as a lasting block.
                break
            waiting.popleft()
            # V0 allocates the whole prompt at admission; only this chunk is computed (and cached).
            blocks = kv.allocate_slots(req, n, hit, hit_blocks, num_lookahead_tokens=remaining - n)
            assert blocks is not None, "can_allocate checked the whole prompt"
            if req.status is Status.WAITING:
                req.num_cached_tokens = hit
                req.scheduled_time = now
            req.status = Status.RUNNING
            req.num_computed_tokens = hit
            plan.scheduled.append((req, n))
            plan.admitted.append(req)
            budget.add(counted, 1)
            new.append(req)
        if new:
            self._prev_prompt = True
        return new

    def _schedule_running(
        self, plan: StepPlan, budget: _Budget, chunked: bool
    ) -> tuple[list[Request], list[Request], list[Request]]:
        """V0-4: in running order; when a row cannot grow, preempt the tail of running (or itself)."""
        queue = deque(self.running)
        self.running = []
        decodes: list[Request] = []
        prefills: list[Request] = []
        preempted: list[Request] = []
        kv = self.kv
        while queue:
            req = queue[0]
            n = req.num_tokens - req.num_computed_tokens
            if chunked:
                n = min(n, budget.tokens_left)
            if n <= 0:
                break  # budget exhausted (chunked mode)
            queue.popleft()
            while kv.allocate_slots(req, n) is None:
                victim = queue.pop() if queue else req
                if not chunked:
                    budget.seqs -= 1  # V0 counted every running group up front in default mode
                if self._preempt(victim, plan) == "recompute":
                    preempted.append(victim)
                if victim is req:
                    break
            else:
                plan.scheduled.append((req, n))
                budget.add(n, 1 if chunked else 0)
                is_decode = req.num_computed_tokens + n == req.num_tokens and req.num_output_tokens > 0
                (decodes if is_decode else prefills).append(req)
        self.running = list(queue)  # rows not visited (budget ran out) keep their place at the front
        return decodes, prefills, preempted

    def _preempt(self, victim: Request, plan: StepPlan) -> str:
        plan.preempted.append(victim)
        if self.mode == "swap":  # V0-5; auto (None) is recompute for single-sequence groups
            self._swap_out += preempt_swap(self.kv, victim)
            self.swapped.append(victim)
            return "swap"
        preempt_recompute(self.kv, victim)
        return "recompute"

    def _schedule_swapped(self, plan: StepPlan, budget: _Budget, chunked: bool) -> list[Request]:
        """V0-6: FCFS swap-in, stopping at the first LATER (watermark) or at the budget; NEVER -> ignored."""
        out: list[Request] = []
        kv = self.kv
        while self.swapped:
            req = self.swapped[0]
            need = kv.num_swap_in_blocks(req)
            if self.total_blocks < need:
                self.swapped.popleft()
                kv.drop_swapped(req)
                plan.rejected.append((req, IGNORED))
                continue
            if kv.num_free_blocks - need < self.watermark_blocks:
                break
            n = req.num_tokens - req.num_computed_tokens
            if chunked:
                n = min(n, budget.tokens_left)
            if n <= 0 or not budget.can_schedule(n, 1):
                break
            self.swapped.popleft()
            copied = swap_in(kv, req)
            assert copied is not None, "free blocks checked above"
            self._swap_in += copied
            ok = kv.allocate_slots(req, n) is not None
            assert ok, "swap-in reserved the slot of the next token"
            plan.scheduled.append((req, n))
            budget.add(n, 1)
            out.append(req)
        return out

    def abort(self, req: Request, now: float) -> None:
        if req in self.swapped:  # its KV sits in CPU memory
            self.swapped.remove(req)
            self.kv.drop_swapped(req)
        else:
            super().abort(req, now)

    # ---- quiet stretches -----------------------------------------------------------------------------
    def quiet(self) -> Quiet | None:
        if self.swapped or self.delay_factor > 0:
            return None
        if self.waiting and not self._head_blocked:
            return None
        if self.limits.enable_chunked_prefill and self.limits.max_num_batched_tokens < len(self.running):
            return None
        # A head blocked by KV (LATER, decided before any prefix lookup) stays blocked while decodes
        # only take blocks (V0 gives no cache credit).
        return Quiet(waiting_blocked=True)


class _Budget:
    """V0's SchedulingBudget: tokens and sequences of one step."""

    __slots__ = ("token_budget", "max_seqs", "tokens", "seqs")

    def __init__(self, token_budget: int, max_seqs: int, seqs: int) -> None:
        self.token_budget, self.max_seqs = token_budget, max_seqs
        self.tokens, self.seqs = 0, seqs

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.tokens

    def can_schedule(self, n_tokens: int, n_seqs: int) -> bool:
        return self.tokens + n_tokens <= self.token_budget and self.seqs + n_seqs <= self.max_seqs

    def add(self, n_tokens: int, n_seqs: int) -> None:
        self.tokens += n_tokens
        self.seqs += n_seqs


@register("vllm-v0", options=VllmV0Options)
def _make(limits: PolicyLimits, options: VllmV0Options) -> VllmV0Policy:
    return VllmV0Policy(limits, options)
