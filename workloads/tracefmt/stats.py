"""Summary numbers of a loaded trace: size, rate, burstiness, lengths, prefix sharing."""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.core.errors import ConfigError
from sim.core.request import NONE_HASH, Request
from workloads.tracefmt.jsonl import LoadedTrace  # the base class: servesim JSONL traces work too

PERCENTILES = (50, 90, 99)


def _lengths(name: str, values: np.ndarray) -> dict[str, float | int | None]:
    if not len(values):
        return {f"{name}_{k}": None for k in ("mean", *(f"p{q}" for q in PERCENTILES), "max")}
    out: dict[str, float | int | None] = {f"{name}_mean": float(values.mean())}
    for q in PERCENTILES:  # numpy's default (linear interpolation between order statistics)
        out[f"{name}_p{q}"] = float(np.percentile(values, q))
    out[f"{name}_max"] = int(values.max())
    return out


def _chain(ids: tuple[int, ...]) -> list[int]:
    """Chained identities of hash-id blocks (same equalities as Request.block_hashes, much faster)."""
    out: list[int] = []
    parent = NONE_HASH
    for h in ids:
        parent = hash((parent, h))
        out.append(parent)
    return out


def _prefix_sharing(trace: LoadedTrace, block_size: int) -> tuple[float, float]:
    """(fraction of requests whose first prompt block an earlier request already had, fraction of all
    prompt tokens in such reused full blocks). This is the hit rate of an infinite prefix cache that
    keeps every full block, in arrival order; blocks are chained (a block hits only if its prefix did),
    as in vLLM (engines.md KV-4). Mooncake-style hash ids use their own block size (512)."""
    seen: set[int] = set()
    shared = hit_tokens = total = 0
    for spec in trace.specs:
        total += spec.prompt_len
        if not spec.shares_content:
            continue
        if spec.hash_ids is not None:
            bs = spec.hash_block_size
            hashes = _chain(spec.hash_ids[: spec.prompt_len // bs])
        else:
            bs = block_size
            hashes = Request(spec).block_hashes(bs, spec.prompt_len)
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        shared += k > 0
        hit_tokens += k * bs
        seen.update(hashes)
    n = len(trace.specs)
    return shared / n, (hit_tokens / total if total else 0.0)


def trace_stats(trace: LoadedTrace, block_size: int = 16) -> dict[str, Any]:
    """A flat dict (JSON-ready; None where a number is undefined) describing ``trace``.

    ``mean_rate_rps`` is (count − 1) / duration, the inverse of the mean inter-arrival gap;
    ``interarrival_cv`` is the coefficient of variation (population std / mean) of the gaps, 1 for a
    Poisson process; ``gamma_shape`` = 1/CV², the shape of the gamma renewal process with that CV
    (vLLM's "burstiness"). ``block_size`` (vLLM default 16) is the cache block for the prefix numbers.
    """
    if not isinstance(trace, LoadedTrace):  # a list of specs, None: no .specs / .format to read
        raise ConfigError(f"trace stats: trace: expected a loaded trace (what load_trace or load_jsonl returns), "
                          f"got {type(trace).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"trace stats: block_size must be an integer >= 1, got {block_size!r}")
    specs = trace.specs
    n = len(specs)
    t = np.array([s.arrival_time for s in specs], dtype=float)
    fmt, source = getattr(trace, "format", "jsonl"), getattr(trace, "source", None)  # load_jsonl's has neither
    out: dict[str, Any] = {"format": fmt, "source": str(source) if source else None}
    out["count"] = n
    duration = float(t.max() - t.min()) if n else 0.0
    out["duration_s"] = duration
    out["first_arrival_s"] = float(t.min()) if n else None
    out["mean_rate_rps"] = (n - 1) / duration if n > 1 and duration > 0 else None
    cv = None
    if n > 2:
        gaps = np.diff(np.sort(t))
        if gaps.mean() > 0:
            cv = float(gaps.std() / gaps.mean())
    out["interarrival_cv"] = cv
    out["gamma_shape"] = 1.0 / cv**2 if cv else None
    out.update(_lengths("prompt_len", np.array([s.prompt_len for s in specs], dtype=np.int64)))
    out.update(_lengths("output_len", np.array([s.output_len for s in specs], dtype=np.int64)))
    out["has_prefix_identity_frac"] = sum(s.shares_content for s in specs) / n if n else None
    if n:
        out["prefix_shared_frac"], out["ideal_prefix_hit_ratio"] = _prefix_sharing(trace, block_size)
    else:
        out["prefix_shared_frac"] = out["ideal_prefix_hit_ratio"] = None
    out["prefix_block_size"] = block_size
    out["num_rows"] = getattr(trace, "num_rows", n)
    for k in ("num_skipped", "num_clipped", "num_failed"):
        out[k] = getattr(trace, k, 0)
    return out
