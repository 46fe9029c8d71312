"""Steps resampled onto a fixed tick, like vLLM's periodic stats log (the columns of
``data/e2e/*/timeseries.csv``), from a result's stored step columns."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError

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
    # the stored columns (counts maybe narrower than the frame's int64: every use converts to float)
    steps = pd.DataFrame(result.step_columns(_SERIES_STEP_COLUMNS), copy=False)
    if steps.empty:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    req = result.requests
    ends_all = (steps["start"] + steps["duration"]).to_numpy(float)
    t_end = max(float(ends_all.max()), float(np.nanmax(req["finish_time"].to_numpy(float), initial=0.0)))
    n = max(1, int(math.ceil(t_end / interval - 1e-9)))
    grid = interval * np.arange(1, n + 1)
    frames = []
    for rep, s in steps.groupby("replica", sort=True):
        s = s.sort_values("start", kind="stable")
        start = s["start"].to_numpy(float)
        end = start + s["duration"].to_numpy(float)
        k = np.clip(np.ceil(end / interval - 1e-9).astype(np.int64) - 1, 0, n - 1)
        gen = np.bincount(k, weights=s["num_decode_tokens"].to_numpy(float), minlength=n)
        mine = req["replica"] == rep
        ft = req.loc[mine, "first_token_time"].to_numpy(float)
        plen = req.loc[mine, "prompt_len"].to_numpy(float)
        ok = np.isfinite(ft)
        tick = np.clip(np.ceil(ft[ok] / interval - 1e-9).astype(np.int64) - 1, 0, n - 1)
        prompt = np.bincount(tick, weights=plen[ok], minlength=n)
        gen += np.bincount(tick, minlength=n)
        idx = np.searchsorted(start, grid, side="right") - 1
        has = idx >= 0
        j = np.where(has, idx, 0)
        running = np.where(has, s["num_running"].to_numpy(float)[j], 0.0)
        waiting = np.where(has, s["num_waiting"].to_numpy(float)[j], 0.0)
        kv = np.where(has, s["kv_usage"].to_numpy(float)[j], 0.0)
        idle = has & (end[j] <= grid)
        running = np.where(idle, np.maximum(running - s["num_finished"].to_numpy(float)[j], 0.0), running)
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
