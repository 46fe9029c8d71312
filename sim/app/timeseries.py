"""Steps resampled onto a fixed tick, like vLLM's periodic stats log (the columns of
``data/e2e/*/timeseries.csv``), from a result's stored step columns."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError
from sim.engine.recorder import StepTable
from sim.engine.step_store import StepStore

if TYPE_CHECKING:
    from sim.app.results import SimResult

TIMESERIES_COLUMNS = ("t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct")

_SERIES_STEP_COLUMNS = ("replica", "start", "duration", "num_decode_tokens", "num_running", "num_waiting",
                        "kv_usage", "num_finished")  # fmt: skip


def time_series(result: SimResult, interval: float = 1.0, by_replica: bool = False) -> pd.DataFrame:
    """Steps resampled onto ticks t = interval, 2·interval, ... like vLLM's periodic stats log.

    Throughputs count tokens of steps that *ended* in (t − interval, t] (vLLM records iteration stats
    at step end). As in vLLM V1's IterationStats, a request's prompt counts once, when its first token
    comes (recomputation after a preemption is not prompt throughput); generated tokens are decode tokens
    plus each request's first token. running, waiting
    and kv_cache_pct are the latest scheduler snapshot at t; after the last step of an idle period the
    requests that step finished are no longer running. Replicas are summed (kv: averaged) unless
    ``by_replica``. Columns match ``data/e2e/*/timeseries.csv``.
    """
    if not interval > 0:
        raise ConfigError(f"time_series interval must be > 0, got {interval}")
    cols = list(TIMESERIES_COLUMNS) + (["replica"] if by_replica else [])
    if not result.num_steps:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    req = result.requests
    ends_max = max(float((c["start"] + c["duration"]).max()) for c in result.step_chunks(("start", "duration")))
    t_end = max(ends_max, float(np.nanmax(req["finish_time"].to_numpy(float), initial=0.0)))
    n = max(1, int(math.ceil(t_end / interval - 1e-9)))
    grid = interval * np.arange(1, n + 1)
    frames = []
    for rep, chunks in _replicas(result):
        mine = req["replica"] == rep
        ft = req.loc[mine, "first_token_time"].to_numpy(float)
        plen = req.loc[mine, "prompt_len"].to_numpy(float)
        ok = np.isfinite(ft)
        tick = np.clip(np.ceil(ft[ok] / interval - 1e-9).astype(np.int64) - 1, 0, n - 1)
        prompt = np.bincount(tick, weights=plen[ok], minlength=n)
        gen, idx = np.zeros(n), np.full(n, -1, dtype=np.int64)
        offset = 0
        for c in chunks():  # the replica's steps in start order, a chunk at a time: each touches its ticks only
            start = c["start"]
            if not len(start):
                continue
            k = np.clip(np.ceil((start + c["duration"]) / interval - 1e-9).astype(np.int64) - 1, 0, n - 1)
            k0 = int(k.min())
            got = np.bincount(k - k0, weights=c["num_decode_tokens"].astype(np.float64))  # integers
            gen[k0 : k0 + len(got)] += got  # the ticks this chunk's steps end in (the others would add 0.0)
            # the latest step started by each tick: a search for the ticks inside the chunk's starts, and
            # its last step marked at the first tick past them (carried forward by the running max below)
            lo, hi = np.searchsorted(grid, start[[0, -1]], side="left")
            idx[lo:hi] = np.searchsorted(start, grid[lo:hi], side="right") - 1 + offset
            offset += len(start)
            if hi < n:
                idx[hi] = max(idx[hi], offset - 1)
        np.maximum.accumulate(idx, out=idx)  # a step index is a lower bound for every later tick
        gen += np.bincount(tick, minlength=n)
        has = idx >= 0
        j = np.where(has, idx, 0)
        at = _at(chunks, j)
        running = np.where(has, at["num_running"], 0.0)
        waiting = np.where(has, at["num_waiting"], 0.0)
        kv = np.where(has, at["kv_usage"], 0.0)
        idle = has & (at["end"] <= grid)
        running = np.where(idle, np.maximum(running - at["num_finished"], 0.0), running)
        kv = np.where(idle & (running == 0), 0.0, kv)
        frames.append(pd.DataFrame({
            "t": grid, "prompt_throughput": prompt / interval, "gen_throughput": gen / interval,
            "running": running, "waiting": waiting, "kv_cache_pct": kv * 100.0, "replica": rep,
        }))  # fmt: skip
    ts = pd.concat(frames, ignore_index=True)
    if not by_replica:
        ts = ts.groupby("t", as_index=False, sort=True).agg(
            prompt_throughput=("prompt_throughput", "sum"), gen_throughput=("gen_throughput", "sum"),
            running=("running", "sum"), waiting=("waiting", "sum"), kv_cache_pct=("kv_cache_pct", "mean"),
        )  # fmt: skip
    ts["running"] = ts["running"].astype(np.int64)
    ts["waiting"] = ts["waiting"].astype(np.int64)
    return ts[cols].reset_index(drop=True)


Chunks = Callable[[], Iterator[dict[str, np.ndarray]]]
_CHUNK = 1 << 18


def _replicas(result: SimResult) -> Iterator[tuple[Any, Chunks]]:
    """Each replica (in order) with its steps sorted by start (stable), as chunks of the stored columns:
    straight from a replica's step store when its steps are in start order already (one engine's are),
    else from the sorted rows of the narrow columns."""
    table = result.__dict__["_steps"]
    if isinstance(table, StepTable):
        reps = [rep for rep, _ in table.parts]
        if reps == sorted(set(reps)) and all(_in_order(store) for _, store in table.parts):
            for rep, store in table.parts:
                if len(store):
                    yield rep, lambda store=store: (
                        {c: store.column(c, i, i + _CHUNK) for c in _SERIES_STEP_COLUMNS[1:]}
                        for i in range(0, len(store), _CHUNK))  # fmt: skip
            return
    steps = pd.DataFrame(result.step_columns(_SERIES_STEP_COLUMNS), copy=False)
    for rep, s in steps.groupby("replica", sort=True):
        s = s.sort_values("start", kind="stable")
        part = {c: s[c].to_numpy() for c in _SERIES_STEP_COLUMNS[1:]}
        yield rep, lambda part=part: iter([part])


def _in_order(store: StepStore) -> bool:
    last = -math.inf
    for i in range(0, len(store), _CHUNK):
        start = store.column("start", i, i + _CHUNK)
        if start[0] < last or (np.diff(start) < 0).any() or np.isnan(start).any():
            return False
        last = float(start[-1])
    return True


def _at(chunks: Chunks, j: np.ndarray) -> dict[str, np.ndarray]:
    """The running, waiting, kv_usage, num_finished and end (float) of steps ``j`` (rows in start order;
    ``j`` sorted, as the ticks' latest steps are)."""
    names = ("num_running", "num_waiting", "kv_usage", "num_finished")
    out = {c: np.zeros(len(j)) for c in (*names, "end")}
    offset = 0
    for c in chunks():
        m = len(c["start"])
        lo, hi = np.searchsorted(j, [offset, offset + m], side="left")  # j is sorted: these rows' slice
        jj = j[lo:hi] - offset
        for name in names:
            out[name][lo:hi] = c[name][jj].astype(np.float64)
        out["end"][lo:hi] = c["start"][jj].astype(np.float64) + c["duration"][jj].astype(np.float64)
        offset += m
    return out
