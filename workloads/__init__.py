"""Workloads: arrival processes, length distributions, the servesim JSONL trace, synthetic builders.

Real-trace loaders (Azure, BurstGPT, Mooncake) live in ``workloads.tracefmt``.
"""

from workloads.gen.arrivals import ARRIVAL_KINDS, ArrivalConfig, constant, gamma, make_arrivals, poisson
from workloads.gen.draws import PriorityMix, SharedPrefix
from workloads.gen.lengths import LengthDist, clip_to_context, load_csv_column
from workloads.plugins import register_workload, workload_kinds
from workloads.synthetic import (
    STREAMS,
    ClosedWorkload,
    OpenWorkload,
    SyntheticOpenWorkload,
    build_workload,
    spawn_streams,
)
from workloads.tracefmt.jsonl import LoadedTrace, load_jsonl, save_jsonl, spec_to_row

__all__ = [
    "ARRIVAL_KINDS",
    "STREAMS",
    "ArrivalConfig",
    "ClosedWorkload",
    "LengthDist",
    "LoadedTrace",
    "OpenWorkload",
    "PriorityMix",
    "SharedPrefix",
    "SyntheticOpenWorkload",
    "build_workload",
    "clip_to_context",
    "constant",
    "gamma",
    "load_csv_column",
    "load_jsonl",
    "make_arrivals",
    "poisson",
    "register_workload",
    "save_jsonl",
    "spawn_streams",
    "spec_to_row",
    "workload_kinds",
]
