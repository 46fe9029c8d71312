"""Orca (OSDI'22) iteration-level scheduling, Algorithm 1 (engines.md §5.1, ORCA-1 .. ORCA-3).

Every iteration re-selects the batch in arrival order: requests already running stay (one decode
token each), new ones join FCFS while ``|batch| < max_bs`` and their ``max_tokens`` (prompt + maximum
output) fit in the KV slots still unreserved; the first that does not fit stops the selection (strict
FCFS). The reservation makes preemption impossible (ORCA-2); a new request's whole prompt runs in one
iteration beside the decodes (selective batching, no chunking, no token budget: ORCA-3).

Slots are counted in KV blocks of ``block_size`` tokens (a reservation is rounded up to a block).
ORCA-4 (n_workers > 1 pipeline stages in flight) is not modelled: the engine runs one batch at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from policies.base import PolicyLimits, Quiet, StepPlan, register
from policies.common import QueuedPolicy
from policies.options import PolicyOptions, refuse_switches
from sim.core.request import Status


@dataclass(frozen=True)
class OrcaOptions(PolicyOptions):
    """No knobs of its own; its defaults for the shared limits."""

    LIMITS = {
        "max_num_seqs": 256,  # max_bs
        "block_size": 16,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
    }


class OrcaPolicy(QueuedPolicy):
    name = "orca"

    def __init__(self, limits: PolicyLimits, options: OrcaOptions | None = None) -> None:
        refuse_switches(asdict(limits), enable_chunked_prefill="Orca runs a whole prompt in one iteration (ORCA-3)",
                        enable_prefix_caching="Orca has no prefix cache")
        super().__init__(limits)

    def _max_tokens(self, req) -> int:
        return min(req.prompt_len + req.output_len, self.limits.max_model_len)

    def schedule(self, now: float) -> StepPlan:
        kv = self.kv
        plan = StepPlan()
        for req in self.running:  # INCREMENT requests: their slots are reserved already
            ok = kv.allocate_slots(req, 1) is not None
            assert ok, "reserved at admission"
            plan.scheduled.append((req, 1))
        max_bs = self.limits.max_num_seqs
        waiting = self.waiting
        while waiting and len(self.running) < max_bs:
            req = waiting[0]
            if kv.num_blocks_needed(req, self._max_tokens(req)) > kv.num_free_blocks:
                break  # n_rsrv + max_tokens > n_slots: strict FCFS (ORCA-2)
            waiting.popleft()
            n = req.num_tokens
            blocks = kv.allocate_slots(req, n, num_lookahead_tokens=self._max_tokens(req) - n)
            assert blocks is not None
            req.status = Status.RUNNING
            req.scheduled_time = now
            req.num_cached_tokens = 0
            self.running.append(req)
            plan.scheduled.append((req, n))
            plan.admitted.append(req)
        return self.finalize_plan(plan)

    def quiet(self) -> Quiet | None:
        # Nothing can be admitted while the head's reservation does not fit or the batch is full; both
        # stay true until a request finishes, since running requests grow inside their reservations.
        return Quiet(waiting_blocked=True)


@register("orca", options=OrcaOptions)
def _make(limits: PolicyLimits, options: OrcaOptions) -> OrcaPolicy:
    return OrcaPolicy(limits, options)
