"""Tensor-parallel all-reduce latency per interconnect: an alpha-beta model per protocol, fastest one wins.

The figures and their sources are in ``sim/cost/data/allreduce.json``. Each protocol costs
``latency + 2(t−1)·hop + 2(t−1)/t · bytes / (link BW · fraction)`` (the ring form; the one-shot / two-shot
custom all-reduce is written in the same form with its own measured bus bandwidth) and applies up to its
``max_bytes``. ``graph`` protocols apply inside a captured CUDA graph, ``eager`` ones outside it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.cost.hardware import FAST_LINKS, GpuSpec

DATA_FILE = Path(__file__).resolve().parent / "data" / "allreduce.json"


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    return json.loads(DATA_FILE.read_text())


def interconnect_class(gpu: GpuSpec, tp: int) -> str:
    """'nvlink' when the GPU's fast link (NVLink, Infinity Fabric, HCCS) spans ``tp`` GPUs, else 'pcie'."""
    return "nvlink" if gpu.interconnect in FAST_LINKS and tp <= gpu.max_link_gpus else "pcie"


def protocols(gpu: GpuSpec, tp: int, graph: bool) -> list[dict[str, Any]]:
    cls = _table()["classes"][interconnect_class(gpu, tp)]
    key = "graph" if graph else "eager"
    entry = cls[key]
    if isinstance(entry, str):  # an alias: "eager": "graph"
        entry = cls[entry]
    return entry


def allreduce_seconds(nbytes: Any, tp: int, gpu: GpuSpec, *, graph: bool) -> np.ndarray:
    """Seconds of one all-reduce of ``nbytes`` (scalar or array) across ``tp`` GPUs; 0 for tp == 1."""
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
    b = np.asarray(nbytes, dtype=np.float64)
    if np.any(b < 0):
        raise ConfigError("all-reduce size must be >= 0 bytes")
    if tp == 1:
        return np.zeros_like(b)
    link = gpu.link_bandwidth(tp)
    if link <= 0:
        raise ConfigError(f"{gpu.name}: no link bandwidth for a tensor-parallel all-reduce")
    best = np.full_like(b, np.inf)
    for p in protocols(gpu, tp, graph):
        t = (
            p["latency_s"]
            + 2 * (tp - 1) * p["hop_latency_s"]
            + 2 * (tp - 1) / tp * b / (link * p["bus_bw_link_frac"])
        )
        if p["max_bytes"] is not None:
            t = np.where(b <= p["max_bytes"], t, np.inf)
        best = np.minimum(best, t)
    return best
