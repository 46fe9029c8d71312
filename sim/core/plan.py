"""A step's plan: what a policy decided for one step (compiled, sim/native.py: every policy step and every
async decode run makes one; the interpreted dataclass's constructor, with a default factory a field, took
~0.46 us, a fifth of it its batch summary)."""

from __future__ import annotations

from typing import Any

from mypy_extensions import mypyc_attr

from sim.core.batch import BatchSummary
from sim.core.request import Request


@mypyc_attr(allow_interpreted_subclasses=True)  # a plug-in policy may extend it
class StepPlan:
    """One step's decisions. ``scheduled`` keeps order: running first, then admitted. Each list is the
    one given, or a new empty one (as the dataclass's default factories made them). The fields hold real
    lists and a BatchSummary (checked when set by the compiled class); a plan is not a dataclass any more
    (no ``dataclasses.replace``) and compares by identity, as no caller compared plans."""

    __slots__ = ("scheduled", "preempted", "admitted", "sampled", "rejected", "batch")  # a misspelt field fails

    def __init__(self, scheduled: list[tuple[Request, int]] | None = None, preempted: list[Request] | None = None,
                 admitted: list[Request] | None = None, sampled: list[Request] | None = None,
                 rejected: list[tuple[Request, str]] | None = None, batch: BatchSummary | None = None) -> None:
        self.scheduled: list[tuple[Request, int]] = [] if scheduled is None else scheduled
        self.preempted: list[Request] = [] if preempted is None else preempted
        self.admitted: list[Request] = [] if admitted is None else admitted
        self.sampled: list[Request] = [] if sampled is None else sampled  # rows that emit a token when the step ends
        self.rejected: list[tuple[Request, str]] = [] if rejected is None else rejected  # dropped, with why
        self.batch: BatchSummary = BatchSummary() if batch is None else batch

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and self.batch.is_empty and not self.rejected

    def __repr__(self) -> str:
        fields: Any = (("scheduled", self.scheduled), ("preempted", self.preempted), ("admitted", self.admitted),
                       ("sampled", self.sampled), ("rejected", self.rejected), ("batch", self.batch))  # fmt: skip
        return type(self).__name__ + "(" + ", ".join(f"{k}={v!r}" for k, v in fields) + ")"
