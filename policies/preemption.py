"""The two ways a policy takes KV back from a running request (issue 3, engines.md V1-3, V0-5, TRT-2,
SAR-2). The caller decides who the victim is and where it queues; these only change the request and
the KV manager, the same way for every policy.

- recompute: blocks freed (hashes kept, so a resume may hit its own blocks: KV-7), computed tokens back
  to 0; the prompt *and* the tokens generated so far are prefilled again on resume.
- swap: blocks copied to the CPU pool (priced through ``BatchSummary.swap_out_blocks``), computed tokens
  kept; ``swap_in`` copies them back before the request runs again (``swap_in_blocks``).
"""

from __future__ import annotations

from sim.core.request import Request, Status
from sim.kv import KVCacheManager


def preempt_recompute(kv: KVCacheManager, victim: Request) -> None:
    kv.free(victim, preempted=True)
    victim.status = Status.PREEMPTED
    victim.num_discarded_tokens += victim.num_computed_tokens
    victim.num_computed_tokens = 0
    victim.num_preemptions += 1


def preempt_swap(kv: KVCacheManager, victim: Request) -> int:
    """Swap ``victim`` out; returns the blocks copied. Raises SwapSpaceError when the CPU pool is full."""
    n = kv.swap_out(victim)
    victim.status = Status.SWAPPED
    victim.num_swaps += 1
    victim.num_preemptions += 1  # V0 counts both kinds in num_cumulative_preemption (engines.md V0-5)
    return n


def swap_in(kv: KVCacheManager, req: Request) -> int | None:
    """Copy ``req`` back to the GPU; returns the blocks copied, or None when they do not fit."""
    n = kv.swap_in(req)
    if n is not None:
        req.status = Status.RUNNING
    return n
