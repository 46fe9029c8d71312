"""llama.cpp ``llama-server`` slots (engines.md §3.1, LC-1 .. LC-7; tree vendored in llama-cpp-python
0.3.16).

- LC-1: ``n_parallel`` slots of ``n_ctx / n_parallel`` tokens each (``-c`` is the total); no paging.
- LC-2: an idle slot is chosen by prompt similarity (longest common prefix with its cached tokens, if
  ``lcp / cached > slot_prompt_similarity``), else the least recently used; no idle slot -> deferred
  (unbounded FIFO, no error).
- LC-3: with ``cache_prompt`` only the suffix after the common prefix is evaluated; a full match keeps one.
- LC-4: each iteration: context shift where needed, one token per generating slot in slot order (decode
  first), then prompt tokens of slots in slot order until ``n_batch`` tokens (with ``cont_batching``; without
  it, prompts only in iterations with no decode).
- LC-5: a prompt of ``n_ctx_slot`` tokens or more is an error 400 with ``ctx_shift`` off, else truncated.
- LC-6: context full while generating: stop (``ctx_shift`` off) or drop half the tokens after ``n_keep``.
- LC-7: stop at the request's output length.

Default ``ctx_shift = false`` follows llama.cpp since PR #15416 (Aug 2025); the vendored tree had it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import PolicyLimits, StepPlan, register
from policies.options import MemoryRule, PolicyOptions, fixed_token_pool, invalid, refuse_switches
from policies.slots import Slot, SlotPolicy, common_prefix
from sim.core.errors import ConfigError
from sim.core.request import Request, RequestSpec


@dataclass(frozen=True)
class LlamaCppOptions(PolicyOptions):
    """common.h defaults (engines.md §3.1); ``-np`` / ``-b`` are ``n_parallel`` / ``n_batch``."""

    LIMITS = {"max_num_seqs": 1, "max_num_batched_tokens": 2048}  # -np, -b
    ALIASES = {"n_parallel": "max_num_seqs", "n_batch": "max_num_batched_tokens"}

    n_ctx: int = 4096  # -c: the total over all slots
    ctx_shift: bool = False
    n_keep: int = 0
    slot_prompt_similarity: float = 0.5
    cache_prompt: bool = True
    cont_batching: bool = True

    def validate(self) -> None:
        if not 0 <= self.slot_prompt_similarity <= 1:
            raise invalid("slot_prompt_similarity", self.slot_prompt_similarity, "in [0, 1]")

    GPU_MEMORY_UTILIZATION = 1.0  # no cap: llama.cpp allocates weights, n_ctx of KV and its buffers

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """KV = n_ctx tokens up front; the ggml compute buffer is sized for one ubatch at n_ctx; the input
        embedding stays on the host (sim/app/engine_memory.py). A request's context is n_ctx / n_parallel."""
        n_par = max(1, int(limits["max_num_seqs"]))
        return MemoryRule(profile="llamacpp", profile_tokens=int(limits["max_num_batched_tokens"]),
                          free_fraction=1.0, context_knob="n_ctx", context_tokens=self.n_ctx, max_model_len=max(1, self.n_ctx // n_par))

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Any) -> LlamaCppOptions:
        # the engine's settings are not PolicyLimits fields here: only what the user set says they were asked
        refuse_switches(explicit, enable_prefix_caching="llama.cpp has no paged prefix cache (a slot keeps its "
                        "last prompt's KV for the next, LC-3: cache_prompt)", enable_chunked_prefill="llama.cpp "
                        "always evaluates a prompt n_batch tokens at a time (size the pieces with n_batch)")
        fixed_token_pool(self.n_ctx, "n_ctx", plan, limits,  # LC-1: n_ctx tokens of KV up front
                         "; llama.cpp fails to allocate it (lower -c or offload fewer layers)")
        return self


LC_OPTIONS: dict[str, Any] = LlamaCppOptions.defaults()

TOO_LONG = "the request exceeds the available context size (400)"


class LlamaCppPolicy(SlotPolicy):
    name = "llamacpp"

    def __init__(self, limits: PolicyLimits, options: LlamaCppOptions | None = None) -> None:
        options = options or LlamaCppOptions()
        self.n_ctx = options.n_ctx
        self.ctx_shift = options.ctx_shift
        self.n_keep = options.n_keep
        self.similarity = options.slot_prompt_similarity
        self.cache_prompt = options.cache_prompt
        self.cont_batching = options.cont_batching
        n_par = limits.max_num_seqs
        if self.n_ctx // n_par < 1:
            raise ConfigError(
                f"[engine] n_ctx = {self.n_ctx} leaves no context for {n_par} slots (n_parallel)"
            )
        super().__init__(limits, n_par, self.n_ctx // n_par)  # LC-1: integer division

    # ---- LC-5 ----------------------------------------------------------------------------------------
    def rejection_reason(self, spec: RequestSpec) -> str | None:
        return TOO_LONG if spec.prompt_len >= self.n_ctx_slot and not self.ctx_shift else None

    def _truncation(self, n_prompt: int) -> tuple[int, int]:
        """(new prompt length, n_keep) of server.cpp's prompt truncation."""
        n_ctx = self.n_ctx_slot
        n_keep = n_prompt if self.n_keep < 0 else min(n_ctx - 4, self.n_keep)
        n_left = n_ctx - n_keep
        n_block = max(n_left // 2, 1)
        erased = (n_prompt - n_keep - n_block) // n_block
        return n_prompt - erased * n_block, n_keep

    def prepare_prompt(self, req: Request, plan: StepPlan) -> int | None:
        reason = self.rejection_reason(req.spec)
        if reason is not None:
            plan.rejected.append((req, reason))
            return None
        if req.prompt_len < self.n_ctx_slot:
            return req.prompt_len
        return self._truncation(req.prompt_len)[0]

    def truncated_keep(self, req: Request, n_prompt: int) -> int | None:
        return None if n_prompt == req.prompt_len else self._truncation(req.prompt_len)[1]

    # ---- LC-2 / LC-3 ---------------------------------------------------------------------------------
    def choose_slot(self, req: Request, idle: list[Slot]) -> tuple[Slot, int]:
        def lcp(s: Slot) -> int:
            if not self.cache_prompt or s.cache_req is None:
                return 0
            return common_prefix(s.cache_req, s.cache_len, req, req.prompt_len)

        if self.similarity > 0:
            best, best_lcp = None, 0
            for s in idle:
                if s.cache_len == 0:
                    continue
                n = lcp(s)
                if n > best_lcp and n / s.cache_len > self.similarity:
                    best, best_lcp = s, n
            if best is not None:
                return best, best_lcp
        slot = min(idle, key=lambda s: (s.t_last_used, s.id))
        return slot, lcp(slot)

    # ---- LC-4 / LC-6 ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        before = set(map(id, self.running))
        self.launch(plan, now)
        plan.admitted = [r for r in self.running if id(r) not in before]
        if self.ctx_shift:
            for s in self.slots:
                if s.req is not None and s.generating and s.n_past + 1 >= self.n_ctx_slot:
                    self._shift(s)
        work: list[tuple[Slot, int]] = [(s, 1) for s in self.slots if s.req is not None and s.generating]
        tokens = len(work)
        if self.cont_batching or not work:
            n_batch = self.limits.max_num_batched_tokens
            for s in self.slots:
                if s.req is None or s.generating:
                    continue
                if tokens >= n_batch:
                    break
                n = min(s.pending, n_batch - tokens)
                work.append((s, n))
                tokens += n
        return self.build_plan(plan, work)

    def _shift(self, s: Slot) -> None:
        """LC-6 context shift: drop half of the tokens after n_keep (+1 for BOS)."""
        n_keep = self.n_keep + 1
        n_discard = (s.n_past - n_keep) // 2
        s.n_past -= n_discard
        self.kv.used -= n_discard
        s.keep = n_keep if s.keep is None else min(s.keep, n_keep)

    def stop_reason(self, slot: Slot) -> str | None:
        reason = super().stop_reason(slot)
        if reason is None and not self.ctx_shift and slot.n_past + 1 >= self.n_ctx_slot:
            return "context limit"  # LC-6, STOP_TYPE_LIMIT
        return reason


@register("llamacpp", options=LlamaCppOptions)
def _make(limits: PolicyLimits, options: LlamaCppOptions) -> LlamaCppPolicy:
    return LlamaCppPolicy(limits, options)
