"""Result rows of requests as columns: what a run keeps of a request once the engine is done with it.

A Request object (its spec, block hashes and a dozen boxed fields) costs about a kilobyte; the row
the results need costs ~190 bytes (typed arrays, the id string). The engine moves finished and
rejected requests here as it goes (sim/engine/loop.py) and drops the objects; the requests frame is
built from these columns, with the dtypes a frame built from the Python values would have
(``requests_frame``).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from sim.core.request import Request

if TYPE_CHECKING:  # pandas (and the pyarrow it loads: ~0.3 s) only where the frame is built
    import pandas as pd

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
_TIMES = ("arrival_time", "queued_time", "scheduled_time", "first_token_time", "finish_time")
_INTS = ("replica", "prompt_len", "output_len", "num_output_tokens", "num_cached_tokens", "num_preemptions",
         "priority")  # fmt: skip
_CAST = ("prompt_len", "output_len", "num_output_tokens", "num_cached_tokens", "num_preemptions")  # always int64
_NAN = float("nan")
FLUSH = 1 << 13  # rows buffered before they go into the columns


def _all_int(vals: Sequence[object]) -> bool:
    """Whether every value is exactly an int (numpy's or a bool are not: pandas types them otherwise)."""
    return set(map(type, vals)) == {int}


class RequestLog:
    """Rows (request, replica, status) appended one by one; ``keys`` orders them (``sorted``)."""

    def __init__(self) -> None:
        self.keys = array("q")
        self.request_id: list[str] = []
        self.status: list[str] = []
        self.finish_reason: list[str | None] = []
        self.times = {c: array("d") for c in _TIMES}
        # Which time columns have held only ints so far (the clock is the int 0 until the first
        # timeout): pandas makes such a column int64, and so does the frame here.
        self.int_times = dict.fromkeys(_TIMES, True)
        # Typed while every value is an int that fits; a plain list of the values otherwise.
        self.ints: dict[str, array | list] = {c: array("q") for c in _INTS}
        # Rows added since the last flush, one tuple each (key, request_id, status, finish_reason, the
        # _TIMES, the _INTS, in add()'s order): the columns take FLUSH rows at a time in C (zip,
        # array.extend) instead of a dozen appends and checks per request.
        self._rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self.request_id) + len(self._rows)

    @classmethod
    def of(cls, rows: Iterable[tuple[Request, int, str]]) -> RequestLog:
        log = cls()
        for req, replica, status in rows:
            log.add(req, replica, status)
        return log

    def add(self, req: Request, replica: int, status: str, key: int = 0) -> None:
        rows = self._rows
        rows.append((key, req.request_id, status, req.finish_reason, req.arrival_time, req.queued_time,
                     req.scheduled_time, req.first_token_time, req.finish_time, replica, req.prompt_len,
                     req.output_len, req.num_output_tokens, req.num_cached_tokens, req.num_preemptions,
                     req.priority))  # fmt: skip
        if len(rows) >= FLUSH:
            self.flush()

    def flush(self) -> None:
        """Move the buffered rows into the columns (every reader calls it first). The typed columns take
        each column's values packed by ``struct`` in C (~5 ns a value, against ~20 for ``array.extend``);
        a value it refuses (a missing time, an int beyond int64) takes the slower path that handles it."""
        rows = self._rows
        if not rows:
            return
        self._rows = []
        m = len(rows)
        cols = list(zip(*rows))  # noqa: B905  (rows of one length)
        try:
            self.keys.frombytes(struct.pack(f"{m}q", *cols[0]))
        except struct.error:  # array.extend names the bad key
            self.keys.extend(cols[0])
        self.request_id.extend(cols[1])
        self.status.extend(cols[2])
        self.finish_reason.extend(cols[3])
        for c, vals in zip(_TIMES, cols[4:9]):  # noqa: B905
            if self.int_times[c] and not _all_int(vals):  # a missing time (None) is not an int either
                self.int_times[c] = False
            try:
                self.times[c].frombytes(struct.pack(f"{m}d", *vals))
            except struct.error:  # a missing time (NaN in the column), or a bad value (array.extend names it)
                self.times[c].extend(tuple(_NAN if v is None else v for v in vals))
        for c, vals in zip(_INTS, cols[9:]):  # noqa: B905
            col = self.ints[c]
            if type(col) is array:
                if _all_int(vals):
                    try:
                        col.frombytes(struct.pack(f"{m}q", *vals))
                        continue
                    except struct.error:  # beyond int64: the column becomes a list of the values
                        pass
                col = self.ints[c] = col.tolist()
            col.extend(vals)

    def extend(self, other: RequestLog) -> None:
        """Append ``other``'s rows (keys included)."""
        self.flush()
        other.flush()
        self.keys.extend(other.keys)
        self.request_id.extend(other.request_id)
        self.status.extend(other.status)
        self.finish_reason.extend(other.finish_reason)
        for c in _TIMES:
            if len(other):
                self.int_times[c] = self.int_times[c] and other.int_times[c]
            self.times[c].extend(other.times[c])
        for c in _INTS:
            mine, theirs = self.ints[c], other.ints[c]
            if type(mine) is array and type(theirs) is array:
                mine.extend(theirs)
            else:
                self.ints[c] = [*mine, *theirs]

    def sorted(self) -> RequestLog:
        """The rows in key order (stable); this log is left empty."""
        self.flush()
        order = np.argsort(np.frombuffer(self.keys, dtype=np.int64), kind="stable")
        out = RequestLog()
        out.int_times = dict(self.int_times)
        idx = order.tolist()
        out.keys = array("q", np.frombuffer(self.keys, dtype=np.int64)[order].tobytes())
        out.request_id = [self.request_id[i] for i in idx]
        out.status = [self.status[i] for i in idx]
        out.finish_reason = [self.finish_reason[i] for i in idx]
        for c in _TIMES:
            out.times[c] = array("d", np.frombuffer(self.times[c], dtype=np.float64)[order].tobytes())
        for c in _INTS:
            col = self.ints[c]
            out.ints[c] = (array("q", np.frombuffer(col, dtype=np.int64)[order].tobytes()) if type(col) is array
                           else [col[i] for i in idx])  # fmt: skip
        self.__init__()  # type: ignore[misc]
        return out


def requests_frame(parts: Sequence[RequestLog]) -> pd.DataFrame:
    """One row per request, the parts' rows in turn; each column with the dtype pandas gives the Python
    values (str, int64, float64; an int64 time column when every value was an int)."""
    import pandas as pd

    for p in parts:
        p.flush()
    n = sum(len(p) for p in parts)
    if n == 0:
        df = pd.DataFrame({c: [] for c in REQUEST_COLUMNS})
    else:
        data: dict[str, object] = {}
        for c in REQUEST_COLUMNS:
            if c in ("request_id", "status", "finish_reason"):
                data[c] = list(chain.from_iterable(getattr(p, c) for p in parts))
            elif c in _INTS:
                cols = [p.ints[c] for p in parts]
                data[c] = (np.concatenate([np.frombuffer(a, dtype=np.int64) for a in cols])
                           if all(type(a) is array for a in cols) else list(chain.from_iterable(cols)))  # fmt: skip
            else:
                v = np.concatenate([np.frombuffer(p.times[c], dtype=np.float64) for p in parts])
                data[c] = v.astype(np.int64) if all(p.int_times[c] for p in parts if len(p)) else v
        df = pd.DataFrame(data)
    for c in _CAST:
        df[c] = df[c].astype(np.int64)
    return df
