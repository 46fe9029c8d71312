"""The recorder's per-step columns, stored compactly while the run goes.

A million-request run has ~2·10^7 steps, so the bytes per step decide the run's memory. Times stay
8-byte floats; counts start as 1-byte integers and widen (int8 → int16 → int32 → int64, one copy of the column)
the first time a value does not fit; a column that has only ever been 0 (the swap counts outside swap
preemption, the cached blocks without prefix caching) holds nothing until its first non-zero value; and
``kv_usage`` is not stored while it is the KV manager's ``1 - num_free_blocks / usable_blocks``; and a
step's ``start`` is stored only where it is not the previous step's end (the first step, a step after
the engine idled) and every CHECKPOINT steps: a busy engine's steps follow each other, start = previous
start + previous duration, and those starts are rebuilt by the same float additions in order. The frame
(``columns``) is what a plain int64 / float64 store would give, value for value.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.core.errors import ResultsIntegrityError
from sim.engine.runcalc import buffered_columns, column_bounds, start_breaks

COUNT_COLUMNS = (
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_running",
    "num_waiting",
    "num_preempted",
    "num_finished",
    "num_free_blocks",
    "num_cached_blocks",  # free blocks that still hold reusable (prefix-cached) KV
    # swap preemption (vLLM V0): blocks copied in this step, and blocks held on the CPU after it
    "num_swap_out_blocks",
    "num_swap_in_blocks",
    "num_swapped_blocks",
)
FREE = COUNT_COLUMNS.index("num_free_blocks")
CHECKPOINT_MASK = (1 << 16) - 1  # a start is stored every 2^16 steps: a slice is rebuilt from that far back
DENSE = 64  # more stored starts than one per DENSE steps (an often idle engine): store every start
# Buffered steps before they go into the typed columns. Few: the buffer's boxed values are then freed
# while they are still in cache, and the allocator hands their memory out again warm. At 1 << 13 a
# store held of the order of 1 MB of them (a 16-replica cluster 16 times that), each gone cold before
# it was read and freed (bench/README.md, session 22: with 1 << 9 and the compiled run loop, ~7 %
# quicker on the baseline and on 16 replicas in alternating pairs).
FLUSH = 1 << 9
_WIDER = {"b": "h", "h": "i", "i": "q"}
_DTYPE = {"b": np.int8, "h": np.int16, "i": np.int32, "q": np.int64}
_RANGE = {c: (-(1 << (8 * array(c).itemsize - 1)), (1 << (8 * array(c).itemsize - 1)) - 1) for c in "bhiq"}
_INT64 = _RANGE["q"]
assert [array(c).itemsize for c in "bhiq"] == [1, 2, 4, 8]


class StepStore:
    """Columns of the step table (sim/engine/recorder.py STEP_COLUMNS order), appended a step or a
    decode run at a time. ``usable_blocks``: the KV pool's size that ``kv_usage`` is derived from
    (None: stored as given).

    Appends go to a buffer of plain lists (a step's counts tuple as given, a run's lists as given) that
    goes into the typed columns FLUSH steps at a time (transposed in compiled code, packed by ``struct``):
    ``array.append`` / ``extend`` parse every value with ``PyArg_Parse`` (~170 instructions, 6 % of a
    run's), a list append is one pointer.
    A value that is not an integer, or does not fit in int64, is refused by column name when the buffer
    is flushed (at the latest when the store is read)."""

    def __init__(self, usable_blocks: int | None = None) -> None:
        # starts: (step, start) where a step does not begin at the previous end, or every start (dense)
        self.start_at, self.start_value = array("q"), array("d")
        self.start: array | None = None
        self.end = float("nan")  # the last step's end: start + duration, float64
        self.duration = array("d")
        # None: every value so far was 0 (nothing stored)
        self.counts: list[array | None] = [None] * len(COUNT_COLUMNS)
        self.counts[FREE] = array("b")
        self.usable_blocks = usable_blocks if usable_blocks else None
        self.kv_usage: array | None = None if self.usable_blocks else array("d")
        self.stored = 0  # steps in the typed columns; the rest are in the buffer
        # The buffer, in step order: a step's counts tuple, or (k, counts) of a run of k steps.
        self._pending: list[Any] = []
        self._dur: list[float] = []  # durations of the buffered steps
        self._st: list[float] = []  # their starts, while every start is stored (dense)
        self._kv: list[float] = []  # their kv_usage, while that column is stored
        self._held: np.ndarray | None = None  # every step's start, while a reader holds them (hold_starts)

    def __len__(self) -> int:
        return self.stored + len(self._dur)

    # ---- appending ------------------------------------------------------------------------------
    def append(self, start: float, duration: float, counts: Sequence[int], kv_usage: float) -> None:
        """One step: ``counts`` in COUNT_COLUMNS order (kept as given until the buffer is flushed)."""
        n = self.stored + len(self._dur)
        # Before this step joins the buffer: the steps before it get their derived values, and its own
        # kv_usage is buffered with it (after it, a flush would leave the value behind, unflushed).
        if self.kv_usage is None and kv_usage != 1.0 - counts[FREE] / self.usable_blocks:  # type: ignore[operator]
            self._store_kv_usage(n)
        if self.start is not None:
            self._st.append(start)
        elif start != self.end or not n & CHECKPOINT_MASK:
            self._store_start(n, start)
        self.end = float(start) + float(duration)
        self._dur.append(duration)
        self._pending.append(counts)
        if self.kv_usage is not None:
            self._kv.append(kv_usage)
        if len(self._dur) >= FLUSH:
            self.flush()

    def _store_start(self, n: int, start: float) -> None:
        """Step ``n`` does not begin where the previous one ended (or is a checkpoint): keep its start;
        once they are dense, keep every start from now on."""
        self.start_at.append(n)
        self.start_value.append(start)
        if len(self.start_at) * DENSE > n + CHECKPOINT_MASK + 1:
            self.flush()
            plain = array("d", self.starts(0, n).tobytes())
            plain.append(start)
            self.start, self.start_at, self.start_value = plain, array("q"), array("d")

    def _fit(self, i: int, lo: int, hi: int) -> None:
        """Widen column ``i`` until [lo, hi] fits its type."""
        a = self.counts[i]
        assert a is not None
        code: str = a.typecode
        while not _RANGE[code][0] <= lo <= hi <= _RANGE[code][1]:
            if code == "q":
                raise ResultsIntegrityError(f"step column {COUNT_COLUMNS[i]}: value {hi if hi > 0 else lo} "
                                            "does not fit in int64")  # fmt: skip
            code = _WIDER[code]
        if code != a.typecode:
            wide = np.frombuffer(a, dtype=_DTYPE[a.typecode]).astype(_DTYPE[code])
            self.counts[i] = array(code, wide.tobytes())

    def _store_kv_usage(self, n: int) -> None:
        """From step ``n`` on, kv_usage is not the derived value: store the derived one for steps < n
        (called before step n is buffered, so the flush leaves nothing behind)."""
        self.flush()
        assert self.stored == n
        col = self.counts[FREE]
        assert col is not None and self.usable_blocks
        free = np.frombuffer(col, dtype=_DTYPE[col.typecode])[:n]
        self.kv_usage = array("d", (1.0 - free / self.usable_blocks).tobytes())
        self._kv = []

    def extend(self, starts: Sequence[float], durations: Sequence[float], counts: Sequence[Sequence[int] | int],
               usable_blocks: int) -> None:  # fmt: skip
        """k steps at once: ``counts`` in COUNT_COLUMNS order, each k integers (a list, or an integer
        array) or one int for all k; their ``kv_usage`` is ``1 - num_free_blocks / usable_blocks``,
        computed only when the store keeps that column (it is derived otherwise). The lists are kept
        as given until the buffer is flushed (the caller does not touch them again)."""
        st = _floats(starts)
        du = _floats(durations)
        k = len(st)
        if not k:
            return
        n = self.stored + len(self._dur)
        if self.kv_usage is None and usable_blocks != self.usable_blocks:
            self._store_kv_usage(n)  # before the run is buffered (append's comment)
        self._extend_starts(n, st, du)
        self._dur.extend(du)
        self._pending.append((k, counts))
        if self.kv_usage is not None:
            free = counts[FREE]
            if isinstance(free, np.ndarray):
                free = free.tolist()
            if isinstance(free, (int, np.integer)):
                self._kv.extend([1.0 - free / usable_blocks] * k)
            else:
                self._kv.extend([1.0 - f / usable_blocks for f in free])
        if len(self._dur) >= FLUSH:
            self.flush()

    def _extend_starts(self, n: int, st: list[float], du: list[float]) -> None:
        if self.start is not None:
            self._st.extend(st)
        else:
            at = start_breaks(self.end, st, du, n, CHECKPOINT_MASK)
            if at:
                self.start_at.extend([j + n for j in at])
                self.start_value.extend([st[j] for j in at])
                if len(self.start_at) * DENSE > n + len(st) + CHECKPOINT_MASK:
                    self.flush()
                    self.start = array("d", self.starts(0, n).tobytes())
                    self._st.extend(st)
                    self.start_at, self.start_value = array("q"), array("d")
        self.end = float(st[-1] + du[-1])

    # ---- the buffer into the typed columns ------------------------------------------------------
    def flush(self) -> None:
        """Move the buffered steps into the typed columns (every reader calls this first). A column of
        Python ints is bounded in one compiled pass (runcalc.column_bounds): one value throughout (the
        zero swap counts, a run's waiting queue) is repeated by ``array``, the others packed straight
        into the column's width; anything else goes through int64, which names a bad value."""
        if not self._dur:
            return
        m = len(self._dur)
        bounds = column_bounds(self._pending, len(COUNT_COLUMNS))
        const = [b is not None and b[0] == b[1] for b in bounds]
        cols: list = buffered_columns(self._pending, len(COUNT_COLUMNS), const)
        for i, b in enumerate(bounds):  # the counts first: a bad one is refused before anything moves
            n = len(cols[i]) if b is None or not const[i] else b[2]
            if n != m:
                raise ResultsIntegrityError(f"step column {COUNT_COLUMNS[i]}: {n} values for {m} steps")
            if b is None or not _INT64[0] <= b[0] <= b[1] <= _INT64[1]:
                v = cols[i] = _as_int64(COUNT_COLUMNS[i], [b[0]] * m if const[i] and b is not None else cols[i])
                bounds[i] = (int(v.min()), int(v.max()), m)
        for i, b in enumerate(bounds):
            assert b is not None
            lo, hi, _ = b
            a = self.counts[i]
            if a is None:
                if lo == hi == 0:
                    continue
                a = self.counts[i] = array("b", bytes(self.stored))
            low, high = _RANGE[a.typecode]
            if not low <= lo <= hi <= high:
                self._fit(i, lo, hi)
                a = self.counts[i]
                assert a is not None
            v = cols[i]
            if isinstance(v, np.ndarray):
                a.frombytes(v.astype(_DTYPE[a.typecode]).tobytes())
            elif const[i]:
                a.extend(array(a.typecode, (lo,)) * m)
            else:
                a.frombytes(struct.pack(f"{m}{a.typecode}", *v))
        self.duration.frombytes(float_bytes(self._dur))
        if self._st:
            assert self.start is not None
            self.start.frombytes(float_bytes(self._st))
        if self.kv_usage is not None and self._kv:
            self.kv_usage.frombytes(float_bytes(self._kv))
        self.stored += m
        self._pending, self._dur, self._st, self._kv = [], [], [], []

    # ---- reading --------------------------------------------------------------------------------
    def end_time(self) -> float | None:
        """When the last step ended (None with no steps): the engine's steps follow one another, so it is
        the last one's end, which appending keeps."""
        return self.end if len(self) else None

    def hold_starts(self) -> None:
        """Rebuild every step's start once and keep them (8 bytes a step) until ``drop_starts``: for a
        reader that goes over the steps many times (the output writers: the step table, the time series,
        the report's gap passes each rebuilt them). A store that keeps every start needs none."""
        self._held = None
        if self.start is None:  # every start stored: they are read in place already
            held = self.starts(0, len(self))
            held.flags.writeable = False  # handed out as views (column), like the store's own columns
            self._held = held

    def drop_starts(self) -> None:
        self._held = None

    def _held_starts(self) -> np.ndarray | None:
        """The held starts while they are every step's (a step appended since is not among them)."""
        held = self._held
        return held if held is not None and len(held) == len(self.duration) else None

    def starts(self, lo: int, hi: int) -> np.ndarray:
        """The starts of steps [lo, hi), float64: from the last stored start at or before lo, each the
        previous start plus the previous duration (np.cumsum adds in order, as the engine's clock did)."""
        self.flush()
        hi = min(hi, len(self.duration))
        held = self._held_starts()
        if held is not None:
            return held[lo:hi] if hi > lo else np.zeros(0, dtype=np.float64)
        if self.start is not None:
            return np.frombuffer(self.start, dtype=np.float64)[lo:hi]
        if hi <= lo:
            return np.zeros(0, dtype=np.float64)
        at = np.frombuffer(self.start_at, dtype=np.int64)
        value = np.frombuffer(self.start_value, dtype=np.float64)
        a0 = int(np.searchsorted(at, lo, side="right")) - 1  # step 0 is always stored
        a1 = int(np.searchsorted(at, hi, side="left"))
        base = int(at[a0])
        d = np.frombuffer(self.duration, dtype=np.float64)
        out = np.empty(hi - base, dtype=np.float64)
        bounds = [*(at[a0:a1] - base).tolist(), hi - base]
        for i in range(a1 - a0):
            s, e = bounds[i], bounds[i + 1]
            out[s] = value[a0 + i]
            if e - s > 1:
                out[s + 1 : e] = d[base + s : base + e - 1]
                np.cumsum(out[s:e], out=out[s:e])
        return out[lo - base :]

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows [lo, hi) of one column as stored (no copy: a view of the store; a never-set count column
        is int8 zeros, a derived ``kv_usage`` computed as ``columns`` computes it), read-only."""
        self.flush()
        n = len(self.duration)
        hi = n if hi is None else hi
        if name == "start":
            return self.starts(lo, hi)
        if name == "duration":
            return np.frombuffer(self.duration, dtype=np.float64)[lo:hi]
        if name == "kv_usage":
            if self.kv_usage is not None:
                return np.frombuffer(self.kv_usage, dtype=np.float64)[lo:hi]
            free = self.column("num_free_blocks", lo, hi).astype(np.int64)
            return 1.0 - free / self.usable_blocks  # type: ignore[operator]
        a = self.counts[COUNT_COLUMNS.index(name)]
        if a is None:
            return np.zeros(max(0, min(hi, n) - lo), dtype=np.int8)
        return np.frombuffer(a, dtype=_DTYPE[a.typecode])[lo:hi]

    def columns(self, release: bool = False) -> dict[str, np.ndarray]:
        """Every column as int64 / float64 (STEP_COLUMNS order: start, duration, the counts with kv_usage
        after num_finished). ``release``: the store is emptied as it goes, so the frame and the store are
        never both held whole; float columns then become the frame's without a copy."""
        self.flush()
        n = len(self.duration)
        st = self.starts(0, n)  # a view of the store where every start is stored, or of the held starts
        held = self._held_starts() is not None
        out: dict[str, np.ndarray] = {"start": st.copy() if held or (self.start is not None and not release) else st}
        d = self.duration
        out["duration"] = np.frombuffer(d, dtype=np.float64) if release else np.array(d, dtype=np.float64)
        if release:
            self.start_at, self.start_value, self.start = array("q"), array("d"), None
            self.end, self.duration, self.stored = float("nan"), array("d"), 0
        counts: dict[str, np.ndarray] = {}
        for i, name in enumerate(COUNT_COLUMNS):
            a = self.counts[i]
            if a is None:
                counts[name] = np.zeros(n, dtype=np.int64)
                continue
            counts[name] = np.frombuffer(a, dtype=_DTYPE[a.typecode]).astype(np.int64)
            if release and i != FREE:
                self.counts[i] = None
        if self.kv_usage is not None:
            kv = np.frombuffer(self.kv_usage, dtype=np.float64)
            kv = kv if release else kv.copy()
        else:
            kv = 1.0 - counts["num_free_blocks"] / self.usable_blocks  # type: ignore[operator]
        if release:
            self.kv_usage = None if self.usable_blocks else array("d")
            self.counts[FREE] = array("b")
        for name in COUNT_COLUMNS:
            out[name] = counts[name]
            if name == "num_finished":
                out["kv_usage"] = kv
        return out


def _floats(values: Sequence[float]) -> list[float]:
    """A run's starts or durations as a list (numpy arrays as float64, then Python floats)."""
    if isinstance(values, list):
        return values
    if isinstance(values, np.ndarray):
        return np.asarray(values, dtype=np.float64).tolist()
    return list(values)


def _as_int64(name: str, vals: list) -> np.ndarray:
    """A column's buffered values as int64 (packed by ``struct`` in C, ~15 ns a value against numpy's
    ~30 for a list of ints), or one line naming the column and the bad value."""
    try:
        return np.frombuffer(struct.pack(f"{len(vals)}q", *vals), dtype=np.int64)
    except struct.error:
        pass
    bad = next((x for x in vals if isinstance(x, float) or not isinstance(x, (int, np.integer))), None)
    if bad is not None:
        bad = bad.item() if isinstance(bad, np.generic) else bad
        raise TypeError(f"step column {name}: integer values expected, got {bad!r}")
    big = max(vals, key=lambda x: abs(int(x)))  # a value past int64
    raise ResultsIntegrityError(f"step column {name}: value {big} does not fit in int64")


def float_bytes(vals: list) -> bytes:
    """float64 bytes of a list of numbers (``struct`` in C)."""
    return struct.pack(f"{len(vals)}d", *vals)
