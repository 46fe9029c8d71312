"""The recorder: flat per-step rows, inter-token gaps and an optional step trace, kept cheap.

Rows are appended to typed arrays (one append per field per step); a fast-forwarded decode run adds
its k rows at once from arrays. Nothing here knows SimPy or scheduling rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mypy_extensions import mypyc_attr

from sim.core.policy import StepPlan
from sim.core.request import Request
from sim.engine.fastforward import DecodeRun
from sim.engine.gaps import FLUSH as GAP_FLUSH
from sim.engine.gaps import GapStore, GapTable
from sim.engine.rowpass import stamp_run, stamp_tokens
from sim.engine.runcalc import finishes_per_step
from sim.engine.step_store import COUNT_COLUMNS, StepStore

if TYPE_CHECKING:  # pandas (and the pyarrow it loads: ~0.3 s) only where a frame is built
    import pandas as pd

STEP_COLUMNS = ("start", "duration", *COUNT_COLUMNS[:COUNT_COLUMNS.index("num_finished") + 1], "kv_usage",
                *COUNT_COLUMNS[COUNT_COLUMNS.index("num_finished") + 1 :])  # fmt: skip
FRAME_COLUMNS = ("step", "replica", *STEP_COLUMNS, "num_scheduled_tokens")  # steps_frame's, in order


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py); observers subclass it (tests)
class Recorder:
    def __init__(self, replica: int = 0, trace: bool = False) -> None:
        self.replica = replica
        # Typed arrays, not lists or one numpy array per chunk: a few bytes a value and nothing for the
        # garbage collector to walk (a run of an hour has ~10^5 steps and ~10^6 token gaps).
        self.steps = StepStore()
        # single gaps, and decode runs' first gaps with where their steps lie (sim/engine/gaps.py)
        self.gaps = GapStore()
        self.trace: list[dict[str, Any]] | None = [] if trace else None
        self.num_preemptions = 0
        self.num_swapped_blocks = 0  # CPU-resident KV blocks: swap-outs minus swap-ins so far

    def set_usable_blocks(self, usable_blocks: int) -> None:
        """The KV pool size the engine reports ``kv_usage`` against (``1 - free / usable``): the step
        store then derives that column instead of storing it. Only before the first step."""
        if not len(self.steps):
            self.steps = StepStore(usable_blocks)

    # ---- tokens ----------------------------------------------------------------------------------
    def on_tokens(self, sampled: list[Request], now: float) -> None:
        """First-token and inter-token times of the rows that sampled in a step ending at ``now``."""
        buf = self.gaps.single_buf
        stamp_tokens(sampled, now, buf)
        if len(buf) >= GAP_FLUSH:
            self.gaps.flush()

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
        b = plan.batch
        n_pre = len(plan.preempted)
        self.num_swapped_blocks += b.swap_out_blocks - b.swap_in_blocks
        self.steps.append(start, duration, (
            b.num_prefill_tokens, b.num_decode, num_running, num_waiting, n_pre, len(finished), num_free_blocks,
            num_cached_free, b.swap_out_blocks, b.swap_in_blocks, self.num_swapped_blocks), kv_usage)  # fmt: skip
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
        starts: list[float],
        durations: list[float],
        rows: list[int],
        num_waiting: int,
        usable_blocks: int,
        finished: list[Request],
        last_token_before: list[float],
        num_running: list[int] | None = None,
        first: StepPlan | None = None,
    ) -> None:
        """k decode steps with ``rows[j]`` rows in step j: step rows from lists, gaps as (value, weight).

        The free-block columns come from ``run`` (set when the run was applied). ``num_running``: the
        running count each step was scheduled with, when it is not the rows it computes (async
        scheduling: a row whose last token is in flight still runs, unscheduled). ``first``: the plan of
        step 0 when it is not all decodes (async: the batch in flight when the run began may finish
        prompts; those rows' first tokens land with it, ``last_token_before`` NaN for them)."""
        if run.free_blocks is None or run.cached_free is None:
            raise RuntimeError("on_decode_run: the run was not applied (run.free_blocks/cached_free unset)")
        k, first_step = len(starts), len(self.steps)
        free_blocks = run.free_blocks[:k]
        running = rows if num_running is None else num_running
        prefill: list[int] | int = 0
        decode = rows
        if first is not None:
            prefill = [0] * k
            prefill[0] = first.batch.num_prefill_tokens
            decode = [first.batch.num_decode, *rows[1:k]]
        self.steps.extend(starts, durations, (
            prefill, decode, running, num_waiting, 0, finishes_per_step(run.finish_step, k), free_blocks,
            run.cached_free[:k], 0, 0, self.num_swapped_blocks), usable_blocks)  # fmt: skip
        # Each row's first gap runs from its previous token (a row new in step 0 gets its first token
        # instead); later gaps are the step times, one per row still running in that step: np.diff of the
        # run's stored ends weighted by num_decode_tokens, rebuilt from the step store (gaps.py).
        self.gaps.add_run(stamp_run(run.requests, run.finish_step, starts, durations, last_token_before,
                                    first is not None), first_step, k)
        if self.trace is not None:
            ids = [r.request_id for r in run.requests]
            fin_list = [f if f < k else k for f in run.finish_step]
            running_list = running
            row_of = {id(r): i for i, r in enumerate(run.requests)}
            done_at: dict[int, list[str]] = {}
            for r in finished:
                done_at.setdefault(fin_list[row_of[id(r)]] - 1, []).append(r.request_id)
            # A row is in step j while its last step is later (fin > j): the list changes only where rows
            # leave, so consecutive steps share one list (the records are output, never changed).
            leaves = set(fin_list)
            scheduled = [[rid, 1] for rid in ids]
            first_scheduled = None if first is None else [[r.request_id, m] for r, m in first.scheduled]
            starts_l, durations_l, free_l = starts, durations, free_blocks
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

    def on_run_columns(self, starts: list[float], durations: list[float], prefill: list[int] | int,
                       decode: list[int], running: list[int], finished: list[int], free_blocks: list[int],
                       cached_free: list[int], usable_blocks: int, first_gaps: list[float],
                       waiting: list[int] | int = 0) -> None:
        """A decode run that went on through admissions (sim/engine/chain.py), its k steps given
        as columns (``prefill``: the prompt tokens a step's admissions brought; ``finished``: rows done
        with each step) and its rows' first gaps; the tokens were stamped by the caller. ``waiting``:
        requests waiting after each step's schedule (nothing, but maybe after its last). Later gaps are
        the steps', weighted by their decode rows, as for any run."""
        k, first_step = len(starts), len(self.steps)
        self.steps.extend(starts, durations, (
            prefill, decode, running, waiting, 0, finished, free_blocks, cached_free, 0, 0, self.num_swapped_blocks),
            usable_blocks)  # fmt: skip
        self.gaps.add_run(first_gaps, first_step, k)

    # ---- output ----------------------------------------------------------------------------------
    def steps_frame(self, release: bool = False) -> pd.DataFrame:
        """The step table, int64 / float64 columns (sim/engine/step_store.py keeps them narrower), each
        its own block (no consolidated copy); ``release``: the store is emptied as the frame is built, so
        the run's last reader never holds the steps twice (a million-request run has ~10^7 steps)."""
        import pandas as pd

        df = pd.DataFrame(self.steps.columns(release=release), copy=False)
        df.insert(0, "replica", self.replica)
        df.insert(0, "step", np.arange(len(df), dtype=np.int64))
        df["num_scheduled_tokens"] = df["num_prefill_tokens"] + df["num_decode_tokens"]
        return df

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap with its weight: the single gaps, then the decode runs' in run order."""
        return GapTable([(self.gaps, self.steps)]).arrays()


class StepTable:
    """The step table of one or more recorders (their rows in turn), kept in the step stores' narrow
    columns until a reader needs the int64 / float64 frame: a million-request run has ~2·10^7 steps,
    ~30 bytes each stored but ~136 in the frame. ``columns`` gives the values a reader computes with;
    ``frame(lo, hi)`` is rows [lo, hi) of ``whole()`` exactly (dtypes included), so a writer can go a
    slice at a time."""

    def __init__(self, recorders: list[Recorder]) -> None:
        self.parts = [(r.replica, r.steps) for r in recorders]
        self.offsets = np.cumsum([0, *(len(s) for _, s in self.parts)])
        self.recorders: list[Recorder] | None = list(recorders)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _pieces(self, lo: int, hi: int) -> list[tuple[int, StepStore, int, int]]:
        """(replica, store, lo, hi) of each part that rows [lo, hi) of the table cover."""
        out = []
        for (replica, store), a, b in zip(self.parts, self.offsets[:-1], self.offsets[1:], strict=True):
            if a < hi and lo < b:
                out.append((replica, store, int(max(lo, a) - a), int(min(hi, b) - a)))
        return out

    def columns(self, names: list[str] | tuple[str, ...], lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """Rows [lo, hi) of the named columns (FRAME_COLUMNS), each with the frame's values in the store's
        dtype (int16 counts stay int16): a view of the store where one part covers them."""
        hi = len(self) if hi is None else hi
        pieces = self._pieces(lo, hi)
        out: dict[str, np.ndarray] = {}
        for name in names:
            got = []
            for replica, store, a, b in pieces:
                if name == "step":
                    got.append(np.arange(a, b, dtype=np.int64))
                elif name == "replica":
                    got.append(np.full(b - a, replica, dtype=np.int64))
                elif name == "num_scheduled_tokens":
                    got.append(store.column("num_prefill_tokens", a, b).astype(np.int64)
                               + store.column("num_decode_tokens", a, b))  # fmt: skip
                else:
                    got.append(store.column(name, a, b))
            if len(got) == 1:
                out[name] = got[0]
            elif got:
                out[name] = np.concatenate([g.astype(np.result_type(*got), copy=False) for g in got])
            else:
                out[name] = np.zeros(0, dtype=np.float64 if name in ("start", "duration", "kv_usage") else np.int64)
        return out

    def frame(self, lo: int = 0, hi: int | None = None) -> pd.DataFrame:
        """Rows [lo, hi) of ``whole()``, its columns and dtypes (index from 0)."""
        import pandas as pd

        return pd.DataFrame(self.arrays(lo, hi), copy=False)

    def arrays(self, lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """Rows [lo, hi) of ``frame()``'s columns as arrays of its dtypes, without the frame (a writer
        that hands them to Arrow spares pandas' consolidation copy)."""
        cols = self.columns(FRAME_COLUMNS, lo, hi)
        return {c: v.astype(np.float64 if c in ("start", "duration", "kv_usage") else np.int64)
                for c, v in cols.items()}  # fmt: skip

    def whole(self) -> pd.DataFrame:
        """The whole frame (Recorder.steps_frame, parts concatenated); the stores are emptied as it is
        built, so the steps are never held twice, and this table is empty after."""
        if self.recorders is None:
            raise RuntimeError("StepTable.whole: the frame was built already")
        import pandas as pd

        frames = [r.steps_frame(release=True) for r in self.recorders]
        self.recorders, self.parts, self.offsets = None, [], np.zeros(1, dtype=np.int64)
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
