"""Inter-token gaps, kept as what they cannot be derived from: the step rows already hold the rest.

A fast-forwarded decode run of k steps has, after each row's first gap, one gap per later step: the
step's end minus the previous step's end, counted once per row in that step (its ``num_decode_tokens``).
Those are the run's steps in the step store, so only the run's first gaps and where its steps lie
(first step, k) are kept; ``blocks`` rebuilds the sample (value, weight) in the recorder's order — the
single gaps, then each run's first gaps and step gaps — value for value, a block at a time, so a
million-request run (~4·10^7 gaps) never needs the whole sample in memory to summarise it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

from sim.engine.step_store import StepStore, float_bytes

RUNS_PER_BLOCK = 1 << 12  # decode runs rebuilt at once (~2·10^5 gaps)
FLUSH = 1 << 10  # gaps buffered in a list before they go into the typed arrays (few: see step_store.FLUSH)


class GapStore:
    """One recorder's gaps: single gaps (weight 1), each run's first gaps (weight 1) and its steps.

    New gaps go to plain lists (``single_buf``: the compiled token stamping appends there, a pointer
    each, where ``array.append`` parses every float) that move into the typed arrays FLUSH at a time."""

    def __init__(self) -> None:
        self.single = array("d")
        self.single_buf: list[float] = []
        self.first = array("d")  # the runs' first gaps, run after run
        self.first_buf: list[float] = []
        self.run_first = array("q")  # per run: how many first gaps it has
        self.run_step = array("q")  # per run: its first step's row in the step store
        self.run_len = array("q")  # per run: its steps

    def add_run(self, first_gaps: list[float], step: int, k: int) -> None:
        buf = self.first_buf
        buf.extend(first_gaps)
        if len(buf) >= FLUSH:
            self.flush()
        self.run_first.append(len(first_gaps))
        self.run_step.append(step)
        self.run_len.append(k)

    def flush(self) -> None:
        """Move the buffered gaps into the typed arrays (readers call this first)."""
        if self.single_buf:
            self.single.frombytes(float_bytes(self.single_buf))
            self.single_buf = []
        if self.first_buf:
            self.first.frombytes(float_bytes(self.first_buf))
            self.first_buf = []

    def __len__(self) -> int:
        self.flush()
        return len(self.single) + len(self.first) + int(np.frombuffer(self.run_len, dtype=np.int64).sum()) - len(
            self.run_len
        )

    def blocks(self, steps: StepStore, rows: int = 1 << 18) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(values float64, weights int64) in the sample's order, in blocks (``rows`` single gaps, or
        RUNS_PER_BLOCK runs' gaps, at a time)."""
        self.flush()
        single = np.frombuffer(self.single, dtype=np.float64)
        for i in range(0, len(single), rows):
            v = single[i : i + rows]
            yield v, np.ones(len(v), dtype=np.int64)
        first = np.frombuffer(self.first, dtype=np.float64)
        n_first = np.frombuffer(self.run_first, dtype=np.int64)
        run_step = np.frombuffer(self.run_step, dtype=np.int64)
        run_len = np.frombuffer(self.run_len, dtype=np.int64)
        first_end = np.cumsum(n_first)
        if len(run_len) and len(steps) < run_step[-1] + run_len[-1]:
            raise RuntimeError("GapStore.blocks: the decode runs' steps are no longer in the step store")
        for r0 in range(0, len(run_len), RUNS_PER_BLOCK):
            r1 = min(r0 + RUNS_PER_BLOCK, len(run_len))
            yield _runs_block(steps, first[first_end[r0] - n_first[r0] : first_end[r1 - 1]], n_first[r0:r1],
                              run_step[r0:r1], run_len[r0:r1])  # fmt: skip


def _runs_block(steps: StepStore, first: np.ndarray, n_first: np.ndarray, run_step: np.ndarray,
                run_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Runs' gaps in order: each run's first gaps, then its steps after the first (end − previous end,
    weighted by the step's decode rows), as Recorder.on_decode_run computed them."""
    lo, hi = int(run_step[0]), int(run_step[-1] + run_len[-1])
    start, duration = steps.column("start", lo, hi), steps.column("duration", lo, hi)
    ends = start + duration
    # a run's steps after its first: +1 where they begin, -1 past the run's end (runs do not overlap)
    marks = np.bincount(run_step - lo + 1, minlength=hi - lo + 1) - np.bincount(run_step - lo + run_len,
                                                                               minlength=hi - lo + 1)  # fmt: skip
    tail = np.cumsum(marks[:-1]) > 0
    step_gaps = (ends[1:] - ends[:-1])[tail[1:]]
    step_rows = steps.column("num_decode_tokens", lo, hi)[tail].astype(np.int64)
    lengths = np.empty(2 * len(run_len), dtype=np.int64)
    lengths[0::2], lengths[1::2] = n_first, run_len - 1
    is_first = np.repeat(np.tile(np.array([True, False]), len(run_len)), lengths)
    values = np.empty(len(is_first), dtype=np.float64)
    weights = np.ones(len(is_first), dtype=np.int64)
    values[is_first] = first
    values[~is_first] = step_gaps
    weights[~is_first] = step_rows
    return values, weights


class GapTable:
    """The gaps of one or more recorders (GapStore, its StepStore), in turn: the result's ITL sample,
    rebuilt a block at a time or whole (``arrays``)."""

    def __init__(self, parts: list[tuple[GapStore, StepStore]]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(g) for g, _ in self.parts)

    def blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for gaps, steps in self.parts:
            yield from gaps.blocks(steps)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole sample: values float64, weights int64."""
        blocks = list(self.blocks())
        if not blocks:
            return np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64)
        return np.concatenate([v for v, _ in blocks]), np.concatenate([w for _, w in blocks])
