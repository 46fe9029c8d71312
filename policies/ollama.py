"""Ollama v0.12.0 (Go runner), rule by rule from engines.md §3.2 (OL-1 .. OL-7).

- OL-1: the runner gets ``num_ctx x OLLAMA_NUM_PARALLEL`` tokens of KV, exactly ``num_ctx`` per slot.
- OL-2: ``OLLAMA_MAX_QUEUE`` (512) pending requests, then 503 "server busy". Since v0.11.5 a request for an
  already loaded model bypasses that queue; ``model_loaded = false`` applies the cap to every request not
  yet running (our stand-in for requests pending on a model load).
- OL-3: at most ``num_parallel`` requests run; the others wait FIFO (no cap in v0.12).
- OL-4: the idle slot with the longest common prefix is chosen (ties: lowest slot); with
  ``multiuser_cache`` a slot whose cache is a prefix of the prompt is used, else the least recently
  used slot gets the best prefix copied in. A full match keeps one token to evaluate.
- OL-5: each forward walks the sequences round-robin from where the previous one stopped, each adding its
  pending inputs (prompt rest, or 1 decode token) until ``num_batch`` tokens; a sequence cut mid-prompt
  starts the next forward.
- OL-6: a prompt longer than ``num_ctx`` keeps its first ``num_keep`` tokens and its tail (``num_ctx`` all).
- OL-7: a full context while generating discards ``(num_ctx - num_keep) / 2`` tokens after ``num_keep``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.base import PolicyLimits, StepPlan, register
from policies.options import MemoryRule, PolicyOptions, fixed_token_pool, invalid, refuse_switches
from policies.slots import Slot, SlotPolicy, common_prefix
from sim.core.request import Request


@dataclass(frozen=True)
class OllamaOptions(PolicyOptions):
    """envconfig/config.go, api/types.go (engines.md §3.2)."""

    LIMITS = {"max_num_seqs": 1, "max_num_batched_tokens": 512}
    ALIASES = {"num_parallel": "max_num_seqs", "num_batch": "max_num_batched_tokens"}  # OLLAMA_NUM_PARALLEL

    num_ctx: int = 4096  # OLLAMA_CONTEXT_LENGTH in v0.9 - v0.12; per request
    num_keep: int = 4
    max_queue: int = 512  # OLLAMA_MAX_QUEUE
    multiuser_cache: bool = False  # OLLAMA_MULTIUSER_CACHE
    model_loaded: bool = True  # v0.11.5+: requests for a loaded model bypass OLLAMA_MAX_QUEUE

    def validate(self) -> None:
        if self.max_queue < 1:
            raise invalid("max_queue", self.max_queue, ">= 1")
        # OL-7 discards (num_ctx - num_keep) / 2 tokens when the context is full: at least one must go
        if self.num_ctx < max(self.num_keep, 0) + 2:
            raise invalid("num_ctx", self.num_ctx, f">= num_keep + 2 = {max(self.num_keep, 0) + 2} (a full context "
                          "discards (num_ctx - num_keep) / 2 tokens)")

    GPU_MEMORY_UTILIZATION = 1.0  # no cap: Ollama fits layers into the free VRAM (llm/memory.go)

    def memory_rule(self, limits: Mapping[str, Any], explicit: Mapping[str, Any], max_model_len: int) -> MemoryRule:
        """OL-1: KV = num_ctx x num_parallel up front; the graph as Ollama estimates it (fs/ggml/ggml.go
        GraphSize) and its 457 MiB per CUDA GPU (sim/app/engine_memory.py). A request's context is num_ctx."""
        n_par = max(1, int(limits["max_num_seqs"]))
        return MemoryRule(profile="ollama", profile_tokens=int(limits["max_num_batched_tokens"]),
                          free_fraction=1.0, context_knob="num_ctx x num_parallel", context_tokens=self.num_ctx * n_par, max_model_len=max(1, self.num_ctx))

    def from_memory(self, plan: Any, limits: dict[str, Any], explicit: Any) -> OllamaOptions:
        refuse_switches(explicit, enable_prefix_caching="Ollama has no paged prefix cache (a slot keeps its "
                        "last prompt's KV for the next, OL-4: multiuser_cache)", enable_chunked_prefill="Ollama "
                        "always evaluates a prompt num_batch tokens at a time (size the pieces with num_batch)")
        # OL-1: the runner gets num_ctx x OLLAMA_NUM_PARALLEL tokens of KV.
        fixed_token_pool(self.num_ctx * limits["max_num_seqs"], "num_ctx x num_parallel", plan, limits,
                         "; Ollama would offload layers to the CPU instead (llm/memory.go), which is not modelled")
        return self


OL_OPTIONS: dict[str, Any] = OllamaOptions.defaults()
BUSY = "server busy, please try again. maximum pending requests exceeded (503)"


class OllamaPolicy(SlotPolicy):
    name = "ollama"

    def __init__(self, limits: PolicyLimits, options: OllamaOptions | None = None) -> None:
        options = options or OllamaOptions()
        self.num_ctx = options.num_ctx
        self.num_keep = options.num_keep
        self.max_queue = options.max_queue
        self.multiuser = options.multiuser_cache
        self.model_loaded = options.model_loaded
        if self.num_ctx < 2:
            raise invalid("num_ctx", self.num_ctx, ">= 2")
        super().__init__(limits, limits.max_num_seqs, self.num_ctx)
        self._next = 0  # OL-5 round-robin position
        self._resume: int | None = None

    def add_request(self, req: Request, now: float) -> str | None:
        if not self.model_loaded and len(self.waiting) >= self.max_queue:
            return BUSY  # OL-2
        return super().add_request(req, now)

    # ---- OL-6 ----------------------------------------------------------------------------------------
    def _keep(self, req: Request) -> int:
        return req.prompt_len if self.num_keep < 0 else min(self.num_keep, self.num_ctx - 1)

    def prepare_prompt(self, req: Request, plan: StepPlan) -> int | None:
        return min(req.prompt_len, self.num_ctx)

    def truncated_keep(self, req: Request, n_prompt: int) -> int | None:
        return None if n_prompt == req.prompt_len else self._keep(req)

    # ---- OL-4 ----------------------------------------------------------------------------------------
    def choose_slot(self, req: Request, idle: list[Slot]) -> tuple[Slot, int]:
        def lcp(s: Slot) -> int:
            return 0 if s.cache_req is None else common_prefix(s.cache_req, s.cache_len, req, req.prompt_len)

        scored = [(lcp(s), s) for s in idle]
        if not self.multiuser:
            best_n, best = max(scored, key=lambda x: (x[0], -x[1].id))
            return best, best_n
        for n, s in scored:
            if s.cache_len and n == s.cache_len:
                return s, n  # the slot's cache is a prefix of the prompt
        best_n = max(n for n, _ in scored)
        lru = min(idle, key=lambda s: (s.t_last_used, s.id))
        return lru, best_n  # the best prefix is copied into the LRU slot

    # ---- OL-5 / OL-7 ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        before = set(map(id, self.running))
        self.launch(plan, now)
        plan.admitted = [r for r in self.running if id(r) not in before]
        for s in self.slots:
            if s.req is not None and s.generating and s.n_past + 1 > self.num_ctx:
                self._shift(s)
        n = len(self.slots)
        start = self._resume if self._resume is not None else self._next
        self._resume = None
        num_batch = self.limits.max_num_batched_tokens
        work: list[tuple[Slot, int]] = []
        tokens = 0
        last = start - 1
        for k in range(n):
            idx = (start + k) % n
            s = self.slots[idx]
            if s.req is None:
                last = idx
                continue
            if tokens >= num_batch:
                break
            take = min(s.pending, num_batch - tokens)
            work.append((s, take))
            tokens += take
            last = idx
            if take < s.pending:
                self._resume = idx  # cut mid-prompt: it starts the next batch
                break
        self._next = (last + 1) % n
        return self.build_plan(plan, work)

    def _shift(self, s: Slot) -> None:
        keep = self._keep(s.req) if s.req is not None else self.num_keep
        n_discard = (self.num_ctx - keep) // 2
        s.n_past -= n_discard
        self.kv.used -= n_discard
        s.keep = keep if s.keep is None else min(s.keep, keep)


@register("ollama", options=OllamaOptions)
def _make(limits: PolicyLimits, options: OllamaOptions) -> OllamaPolicy:
    return OllamaPolicy(limits, options)
