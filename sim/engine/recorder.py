"""The recorder: flat per-step rows, inter-token gaps and an optional step trace, kept cheap.

Rows are appended to typed arrays (one append per field per step); a fast-forwarded decode run adds
its k rows at once from arrays. Nothing here knows SimPy or scheduling rules.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from sim.core.policy import StepPlan
from sim.core.request import Request
from sim.engine.fastforward import DecodeRun

STEP_COLUMNS = (
    "start",
    "duration",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_running",
    "num_waiting",
    "num_preempted",
    "num_finished",
    "kv_usage",
    "num_free_blocks",
    "num_cached_blocks",  # free blocks that still hold reusable (prefix-cached) KV
    # swap preemption (vLLM V0): blocks copied in this step, and blocks held on the CPU after it
    "num_swap_out_blocks",
    "num_swap_in_blocks",
    "num_swapped_blocks",
)


FLOAT_COLUMNS = frozenset({"start", "duration", "kv_usage"})


class Recorder:
    def __init__(self, replica: int = 0, trace: bool = False) -> None:
        self.replica = replica
        # Typed arrays, not lists: 8 bytes a value instead of a pointer plus an object, and nothing for
        # the garbage collector to walk (a run of an hour has ~10^5 steps and ~10^6 token gaps).
        self.cols: dict[str, array] = {c: array("d" if c in FLOAT_COLUMNS else "q") for c in STEP_COLUMNS}
        self.itl_single = array("d")
        self.itl_chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self.trace: list[dict[str, Any]] | None = [] if trace else None
        self.num_preemptions = 0
        self.num_swapped_blocks = 0  # CPU-resident KV blocks: swap-outs minus swap-ins so far

    # ---- tokens ----------------------------------------------------------------------------------
    def on_tokens(self, sampled: list[Request], now: float) -> None:
        """First-token and inter-token times of the rows that sampled in a step ending at ``now``."""
        gaps = self.itl_single
        for req in sampled:
            last = req.last_token_time
            if last is None:
                req.first_token_time = now
            else:
                gaps.append(now - last)
            req.last_token_time = now

    # ---- steps -----------------------------------------------------------------------------------
    def on_step(
        self,
        plan: StepPlan,
        start: float,
        duration: float,
        num_running: int,
        num_waiting: int,
        kv_usage: float,
        num_free_blocks: int,
        finished: list[Request],
        num_cached_free: int = 0,
    ) -> None:
        c = self.cols
        b = plan.batch
        n_pre = len(plan.preempted)
        c["start"].append(start)
        c["duration"].append(duration)
        c["num_prefill_tokens"].append(b.num_prefill_tokens)
        c["num_decode_tokens"].append(b.num_decode)
        c["num_running"].append(num_running)
        c["num_waiting"].append(num_waiting)
        c["num_preempted"].append(n_pre)
        c["num_finished"].append(len(finished))
        c["kv_usage"].append(kv_usage)
        c["num_free_blocks"].append(num_free_blocks)
        c["num_cached_blocks"].append(num_cached_free)
        self.num_swapped_blocks += b.swap_out_blocks - b.swap_in_blocks
        c["num_swap_out_blocks"].append(b.swap_out_blocks)
        c["num_swap_in_blocks"].append(b.swap_in_blocks)
        c["num_swapped_blocks"].append(self.num_swapped_blocks)
        self.num_preemptions += n_pre
        if self.trace is not None:
            self.trace.append(
                {
                    "time": start,
                    "duration": duration,
                    "scheduled": [[r.request_id, n] for r, n in plan.scheduled],
                    "preempted": [r.request_id for r in plan.preempted],
                    "finished": [r.request_id for r in finished],
                    "num_running": num_running,
                    "num_waiting": num_waiting,
                    "num_free_blocks": num_free_blocks,
                    "kv_usage": kv_usage,
                }
            )

    def on_decode_run(
        self,
        run: DecodeRun,
        starts: np.ndarray,
        durations: np.ndarray,
        rows: np.ndarray,
        num_waiting: int,
        usable_blocks: int,
        finished: list[Request],
        last_token_before: np.ndarray,
        num_running: np.ndarray | None = None,
        first: StepPlan | None = None,
    ) -> None:
        """k decode steps with ``rows[j]`` rows in step j: step rows from arrays, gaps as (value, weight).

        The free-block columns come from ``run`` (set when the run was applied). ``num_running``: the
        running count each step was scheduled with, when it is not the rows it computes (async
        scheduling: a row whose last token is in flight still runs, unscheduled). ``first``: the plan of
        step 0 when it is not all decodes (async: the batch in flight when the run began may finish
        prompts; those rows' first tokens land with it, ``last_token_before`` NaN for them)."""
        if run.free_blocks is None or run.cached_free is None:
            raise RuntimeError("on_decode_run: the run was not applied (run.free_blocks/cached_free unset)")
        k = len(starts)
        c = self.cols
        free_blocks = run.free_blocks[:k]
        fin = np.minimum(run.finish_step, k)  # step of each row's last token in this run
        per_step_finished = np.bincount(fin[run.finish_step <= k], minlength=k + 1)[1:]
        rows_list = rows.tolist()
        running_list = rows_list if num_running is None else num_running.tolist()
        c["start"].extend(starts.tolist())
        c["duration"].extend(durations.tolist())
        if first is None:
            c["num_prefill_tokens"].extend([0] * k)
            c["num_decode_tokens"].extend(rows_list)
        else:
            c["num_prefill_tokens"].append(first.batch.num_prefill_tokens)
            c["num_prefill_tokens"].extend([0] * (k - 1))
            c["num_decode_tokens"].append(first.batch.num_decode)
            c["num_decode_tokens"].extend(rows_list[1:])
        c["num_running"].extend(running_list)
        c["num_waiting"].extend([num_waiting] * k)
        c["num_preempted"].extend([0] * k)
        c["num_finished"].extend(per_step_finished.tolist())
        c["kv_usage"].extend((1.0 - free_blocks / usable_blocks).tolist())
        c["num_free_blocks"].extend(free_blocks.tolist())
        c["num_cached_blocks"].extend(run.cached_free[:k].tolist())
        c["num_swap_out_blocks"].extend([0] * k)
        c["num_swap_in_blocks"].extend([0] * k)
        c["num_swapped_blocks"].extend([self.num_swapped_blocks] * k)
        ends = starts + durations
        # Each row's first gap runs from its previous token; later gaps are the step times, one per row
        # still running in that step.
        gap0 = ends[0] - last_token_before
        if first is not None:
            new = np.isnan(last_token_before)
            t0 = float(ends[0])
            for req, is_new in zip(run.requests, new.tolist(), strict=True):
                if is_new:
                    req.first_token_time = t0
            gap0 = gap0[~new]
        self.itl_chunks.append((gap0, np.ones(len(gap0), dtype=np.int64)))
        if k > 1:
            self.itl_chunks.append((np.diff(ends), rows[1:].astype(np.int64)))
        for req, t in zip(run.requests, ends[fin - 1].tolist(), strict=True):
            req.last_token_time = t
        if self.trace is not None:
            ids = [r.request_id for r in run.requests]
            fin_list = fin.tolist()
            row_of = {id(r): i for i, r in enumerate(run.requests)}
            done_at: dict[int, list[str]] = {}
            for r in finished:
                done_at.setdefault(fin_list[row_of[id(r)]] - 1, []).append(r.request_id)
            # A row is in step j while its last step is later (fin > j): the list changes only where rows
            # leave, so consecutive steps share one list (the records are output, never changed).
            leaves = set(fin_list)
            scheduled = [[rid, 1] for rid in ids]
            first_scheduled = None if first is None else [[r.request_id, m] for r, m in first.scheduled]
            starts_l, durations_l, free_l = starts.tolist(), durations.tolist(), free_blocks.tolist()
            for j in range(k):
                if j and j in leaves:
                    scheduled = [[rid, 1] for rid, f in zip(ids, fin_list, strict=True) if f > j]
                self.trace.append(
                    {
                        "time": starts_l[j],
                        "duration": durations_l[j],
                        "scheduled": first_scheduled if j == 0 and first_scheduled is not None else scheduled,
                        "preempted": [],
                        "finished": done_at.get(j, []),
                        "num_running": running_list[j],
                        "num_waiting": num_waiting,
                        "num_free_blocks": free_l[j],
                        "kv_usage": 1.0 - free_l[j] / usable_blocks,
                    }
                )

    # ---- output ----------------------------------------------------------------------------------
    def steps_frame(self, release: bool = False) -> pd.DataFrame:
        """The step table. Each column is copied out of its typed array (the arrays may still grow) and
        kept as its own block (no consolidated copy); ``release``: each array is emptied once copied, so
        the run's last reader never holds the steps twice (a million-request run has ~10^7 steps)."""
        data = {}
        for k, v in self.cols.items():
            data[k] = np.array(v)
            if release:
                self.cols[k] = array(v.typecode)
        df = pd.DataFrame(data, copy=False)
        df.insert(0, "replica", self.replica)
        df.insert(0, "step", np.arange(len(df), dtype=np.int64))
        df["num_scheduled_tokens"] = df["num_prefill_tokens"] + df["num_decode_tokens"]
        return df

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        values = [np.array(self.itl_single, dtype=np.float64)] + [v for v, _ in self.itl_chunks]
        weights = [np.ones(len(self.itl_single), dtype=np.int64)] + [w for _, w in self.itl_chunks]
        return np.concatenate(values), np.concatenate(weights)


REQUEST_COLUMNS = (
    "request_id",
    "replica",
    "arrival_time",
    "queued_time",
    "scheduled_time",
    "first_token_time",
    "finish_time",
    "prompt_len",
    "output_len",
    "num_output_tokens",
    "num_cached_tokens",
    "num_preemptions",
    "priority",
    "status",
    "finish_reason",
)


def _t(x: float | None) -> float:
    return float("nan") if x is None else x


def requests_frame(rows: list[tuple[Request, int, str]]) -> pd.DataFrame:
    """One row per request: (request, replica, status) with status finished/rejected/in_flight/not_arrived."""
    data = {c: [] for c in REQUEST_COLUMNS}
    for req, replica, status in rows:
        data["request_id"].append(req.request_id)
        data["replica"].append(replica)
        data["arrival_time"].append(req.arrival_time)
        data["queued_time"].append(_t(req.queued_time))
        data["scheduled_time"].append(_t(req.scheduled_time))
        data["first_token_time"].append(_t(req.first_token_time))
        data["finish_time"].append(_t(req.finish_time))
        data["prompt_len"].append(req.prompt_len)
        data["output_len"].append(req.output_len)
        data["num_output_tokens"].append(req.num_output_tokens)
        data["num_cached_tokens"].append(req.num_cached_tokens)
        data["num_preemptions"].append(req.num_preemptions)
        data["priority"].append(req.priority)
        data["status"].append(status)
        data["finish_reason"].append(req.finish_reason)
    df = pd.DataFrame(data)
    for c in ("prompt_len", "output_len", "num_output_tokens", "num_cached_tokens", "num_preemptions"):
        df[c] = df[c].astype(np.int64)
    return df
