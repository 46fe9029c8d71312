"""TensorRT-LLM in-flight batching: capacity scheduler + micro-batch scheduler (engines.md §2, TRT-1..9).

Per iteration, over the active requests in arrival order:
- capacity (which requests get KV): GUARANTEED_NO_EVICT reserves each request's blocks to completion
  (prompt + max new tokens) and admits new ones only while their whole need fits, head-of-line
  (TRT-1); MAX_UTILIZATION admits what fits for the next step only and pauses the last started
  request (recompute, generated tokens folded into the prompt) when something does not fit (TRT-2);
  STATIC_BATCH is no-evict but admits only when nothing is in progress (TRT-3); PREFILL_FIRST runs
  only context requests when any fit (TRT-4). With block reuse, a first-chunk context request whose
  first uncached block another context request computes in this pass waits a step (TRT-5).
- micro batch (what runs): within ``max_batch_size`` rows and ``max_num_tokens`` tokens, breaking at
  the first request that does not fit (TRT-6); with chunked context, generation tokens first and the
  contexts share what is left, FCFS in multiples of ``tokens_per_block`` or EQUAL_PROGRESS (TRT-7);
  contexts precede generations in the batch (TRT-8). KV block reuse is the radix/hash prefix cache
  with LRU eviction (TRT-9). The whole prompt's blocks are allocated when a context starts.

Assumption (not in engines.md): the executor keeps at most ``max_batch_size`` active requests; the
others wait FIFO in its queue. ``max_batch_size`` / ``max_num_tokens`` defaults are the commonly cited
LLM-API values (2048 / 8192), which engines.md §2.1 could not verify from source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import MemoryRule, PolicyOptions, invalid
from policies.preemption import preempt_recompute
from sim.core.request import Request, RequestSpec, Status

POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH", "PREFILL_FIRST")
CHUNKING = ("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")


@dataclass(frozen=True)
class TrtllmOptions(PolicyOptions):
    LIMITS = {
        "block_size": 32,  # KvCacheConfig.tokens_per_block (engines.md §2.1)
        "max_num_seqs": 2048,  # max_batch_size
        "max_num_batched_tokens": 8192,  # max_num_tokens
        "enable_prefix_caching": True,  # enable_block_reuse
        "enable_chunked_prefill": False,
    }
    ALIASES = {  # TensorRT-LLM's names for the shared limits
        "max_batch_size": "max_num_seqs",
        "max_num_tokens": "max_num_batched_tokens",
        "tokens_per_block": "block_size",
        "enable_block_reuse": "enable_prefix_caching",
    }

    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    context_chunking_policy: str = "FIRST_COME_FIRST_SERVED"

    free_gpu_memory_fraction: float = 0.9  # KvCacheConfig: the share of free memory the KV cache takes
    GPU_MEMORY_UTILIZATION = 1.0  # no cap of its own: [engine] gpu_memory_utilization is the card's share

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """PyTorch backend, tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator: dummy *context*
        requests of min(max_num_tokens, max_seq_len) tokens fill max_num_tokens (one logits row each);
        ``_cal_max_memory``: KV = (total - peak) x free_gpu_memory_fraction, peak = torch peak + non-torch
        (CUDA context, NCCL, CUDA graphs). docs/memory_reservations.md."""
        return MemoryRule(profile="trtllm", profile_tokens=int(limits["max_num_batched_tokens"]),
                          free_fraction=self.free_gpu_memory_fraction)

    def validate(self) -> None:
        if self.capacity_scheduler_policy not in POLICIES:
            raise invalid("capacity_scheduler_policy", self.capacity_scheduler_policy, f"one of {POLICIES}")
        if self.context_chunking_policy not in CHUNKING:
            raise invalid("context_chunking_policy", self.context_chunking_policy, f"one of {CHUNKING}")
        if not 0 < self.free_gpu_memory_fraction <= 1:
            raise invalid("free_gpu_memory_fraction", self.free_gpu_memory_fraction, "in (0, 1]")


class TrtllmPolicy(QueuedPolicy):
    name = "trtllm"

    def __init__(self, limits: PolicyLimits, options: TrtllmOptions | None = None) -> None:
        options = options or TrtllmOptions()
        self.capacity = options.capacity_scheduler_policy
        self.chunking_policy = options.context_chunking_policy
        super().__init__(limits)
        self.reuse = limits.enable_prefix_caching and self.capacity != "STATIC_BATCH"
        # self.running holds the *active* requests (started or not) in arrival order.

    # ---- queue ---------------------------------------------------------------------------------------
    def rejection_reason(self, spec: RequestSpec) -> str | None:
        reason = super().rejection_reason(spec)
        lim = self.limits
        if reason is None and not lim.enable_chunked_prefill and spec.prompt_len > lim.max_num_batched_tokens:
            return (
                f"prompt ({spec.prompt_len} tokens) exceeds max_num_tokens {lim.max_num_batched_tokens} "
                "without chunked context"
            )
        return reason

    @property
    def num_running(self) -> int:
        holds = self.kv.holds
        return sum(1 for r in self.running if holds(r))

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.running) - self.num_running

    def drop_waiting(self, gone: set[int]) -> None:
        self.running = [r for r in self.running if id(r) not in gone]
        self.waiting = type(self.waiting)(r for r in self.waiting if id(r) not in gone)

    # ---- request state -------------------------------------------------------------------------------
    def _generating(self, req: Request) -> bool:
        return (
            req.num_output_tokens > 0 and req.num_tokens - req.num_computed_tokens == 1 and self.kv.holds(req)
        )

    def _total(self, req: Request) -> int:
        return min(req.prompt_len + req.output_len, self.limits.max_model_len)

    def _hits(self, req: Request, cache: dict[int, tuple[list, int]]) -> tuple[list, int]:
        key = id(req)
        if key not in cache:
            cache[key] = self.kv.peek_computed_blocks(req) if not self.kv.holds(req) else ([], 0)
        return cache[key]

    def _need_to_completion(self, req: Request, cache) -> int:
        """getRemainingBlocksToCompletion, crediting reusable blocks (TRT-1, TRT-9)."""
        blocks, _ = self._hits(req, cache)
        n = self.kv.num_blocks_needed(req, self._total(req)) - len(blocks)
        return n + sum(1 for b in blocks if b.ref_cnt == 0)

    def _need_one_step(self, req: Request, cache) -> int:
        """getNeededBlocksOneStep: a new context needs its whole prompt, a generation its next slot."""
        if self.kv.holds(req):
            return self.kv.num_blocks_needed(req, req.num_computed_tokens + 1) if self._generating(req) else 0
        blocks, _ = self._hits(req, cache)
        n = self.kv.num_blocks_needed(req, req.num_tokens) - len(blocks)
        return n + sum(1 for b in blocks if b.ref_cnt == 0)

    def _contributes(self, req: Request, cache) -> set[int]:
        """Hashes of the full prompt blocks ``req`` will compute (for TRT-5)."""
        if not req.spec.shares_content:
            return set()
        bs = self.limits.block_size
        start = len(self._hits(req, cache)[0]) if not self.kv.holds(req) else req.num_computed_tokens // bs
        end = req.num_tokens // bs
        return set(req.block_hashes(bs, end * bs)[start:end]) if end > start else set()

    def _skip_for_reuse(self, req: Request, cache, contributed: set[int]) -> bool:
        """TRT-5 beneficialToSkip: wait for a block an earlier context computes in this pass."""
        if not self.reuse or self.kv.holds(req) or not contributed or not req.spec.shares_content:
            return False
        bs = self.limits.block_size
        idx = len(self._hits(req, cache)[0])
        if (idx + 1) * bs > req.num_tokens:
            return False
        return req.block_hashes(bs, (idx + 1) * bs)[idx] in contributed

    # ---- capacity scheduler --------------------------------------------------------------------------
    def _no_evict(self, cache, static: bool) -> list[Request]:
        avail = self.kv.num_free_blocks
        max_n = self.limits.max_num_seqs
        fitting: list[Request] = []
        pending: list[Request] = []
        for req in self.running:
            if len(fitting) >= max_n:
                break
            if self._generating(req):
                fitting.append(req)
                avail -= self._need_to_completion(req, cache)
            else:
                pending.append(req)
        if static and fitting:
            return fitting  # TRT-3: no new request while any is in progress
        contributed: set[int] = set()
        for req in pending:
            if len(fitting) >= max_n:
                break
            if self._skip_for_reuse(req, cache, contributed):
                continue
            need = self._need_to_completion(req, cache)
            if need > avail:
                break  # head-of-line (TRT-1)
            avail -= need
            fitting.append(req)
            if self.reuse:
                contributed |= self._contributes(req, cache)
        return fitting

    def _max_utilization(self, cache) -> tuple[list[Request], list[Request]]:
        active = self.running
        free = self.kv.num_free_blocks
        used = 0
        fitting: list[Request] = []
        paused: list[Request] = []
        contributed: set[int] = set()
        end, i = len(active), 0
        while i < end:
            req = active[i]
            if self._skip_for_reuse(req, cache, contributed):
                i += 1
                continue
            if len(fitting) < self.limits.max_num_seqs:
                need = self._need_one_step(req, cache)
                if used + need <= free:
                    fitting.append(req)
                    used += need
                    if self.reuse and not self._generating(req):
                        contributed |= self._contributes(req, cache)
                    i += 1
                    continue
            # TRT-2: pause the last started request from the current one to the end, then retry.
            j = next((k for k in range(end - 1, i - 1, -1) if self.kv.holds(active[k])), None)
            if j is None:
                break
            paused.append(active[j])
            free += self.kv.num_blocks_held(active[j])
            end = j
        return fitting, paused

    def _prefill_first(self, cache) -> list[Request]:
        gens = [r for r in self.running if self._generating(r)][: self.limits.max_num_seqs]
        avail = self.kv.num_free_blocks - sum(self._need_to_completion(r, cache) for r in gens)
        ctx: list[Request] = []
        for req in self.running:
            if self._generating(req):
                continue
            if len(ctx) >= self.limits.max_num_seqs:
                break
            need = self._need_to_completion(req, cache)
            if need > avail:
                break
            avail -= need
            ctx.append(req)
        return ctx if ctx else gens  # TRT-4

    # ---- micro batch ---------------------------------------------------------------------------------
    def _micro_batch(
        self, fitting: list[Request], cache
    ) -> tuple[list[tuple[Request, int]], list[tuple[Request, int]]]:
        lim = self.limits
        max_tokens, chunked = lim.max_num_batched_tokens, lim.enable_chunked_prefill
        gens: list[tuple[Request, int]] = []
        ctxs: list[tuple[Request, int]] = []
        tokens = 0
        for req in fitting:
            if len(gens) + len(ctxs) >= lim.max_num_seqs:
                break
            if self._generating(req):
                if tokens + 1 > max_tokens:
                    break
                tokens += 1
                gens.append((req, 1))
                continue
            left = req.num_tokens - req.num_computed_tokens - self._hits(req, cache)[1]
            if chunked:
                ctxs.append((req, left))  # sized below (TRT-7)
                continue
            if tokens + left > max_tokens:
                break
            tokens += left
            ctxs.append((req, left))
        if chunked and ctxs:
            ctxs = self._chunk(ctxs, max_tokens - tokens)
        return ctxs, gens

    def _chunk(self, ctxs: list[tuple[Request, int]], capacity: int) -> list[tuple[Request, int]]:
        unit = self.limits.block_size  # chunkUnitSize = tokens_per_block
        rem = [n for _, n in ctxs]
        got = [0] * len(ctxs)
        if self.chunking_policy == "FIRST_COME_FIRST_SERVED":
            for k, left in enumerate(rem):
                n = left if left <= capacity else (capacity // unit) * unit
                got[k] = n
                capacity -= n
        else:  # EQUAL_PROGRESS: +unit per context per round
            progress = True
            while capacity > 0 and progress:
                progress = False
                for k, left in enumerate(rem):
                    add = min(unit, left - got[k])
                    if add > 0 and add <= capacity:
                        got[k] += add
                        capacity -= add
                        progress = True
        return [(req, n) for (req, _), n in zip(ctxs, got, strict=True) if n > 0]

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        lim, kv = self.limits, self.kv
        while self.waiting and len(self.running) < lim.max_num_seqs:
            self.running.append(self.waiting.popleft())  # the executor fills its active requests
        cache: dict[int, tuple[list, int]] = {}
        plan = StepPlan()
        paused: list[Request] = []
        if self.capacity == "MAX_UTILIZATION":
            fitting, paused = self._max_utilization(cache)
        elif self.capacity == "PREFILL_FIRST":
            fitting = self._prefill_first(cache)
        else:
            fitting = self._no_evict(cache, static=self.capacity == "STATIC_BATCH")
        for req in paused:
            preempt_recompute(kv, req)
            plan.preempted.append(req)
        ctxs, gens = self._micro_batch(fitting, cache)
        for req, n in ctxs:  # TRT-8: contexts first
            if kv.holds(req):
                if kv.allocate_slots(req, n) is None:
                    continue
            else:
                hit_blocks, hit = kv.get_computed_blocks(req)
                left = req.num_tokens - hit
                n = min(n, left)
                if kv.allocate_slots(req, n, hit, hit_blocks, num_lookahead_tokens=left - n) is None:
                    continue
                if req.status is Status.WAITING:
                    req.num_cached_tokens = hit
                    req.scheduled_time = now
                req.status = Status.RUNNING
                req.num_computed_tokens = hit
                plan.admitted.append(req)
            plan.scheduled.append((req, n))
        for req, _ in gens:
            if kv.allocate_slots(req, 1) is not None:
                plan.scheduled.append((req, 1))
        return self.finalize_plan(plan)

    def quiet(self) -> Quiet | None:
        if self.waiting or any(not self._generating(r) for r in self.running):
            return None
        if len(self.running) > self.limits.max_num_batched_tokens:
            return None
        return Quiet(waiting_blocked=False)


@register("trtllm", options=TrtllmOptions)
def _make(limits: PolicyLimits, options: TrtllmOptions) -> TrtllmPolicy:
    return TrtllmPolicy(limits, options)
