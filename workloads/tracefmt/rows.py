"""Reading trace files row by row with errors that point at ``file:line: field``.

Line numbers are 1-based and count the header as line 1, so they match what an editor shows. CSVs are
parsed by pandas (C engine) with every cell as a string and blank lines kept, which keeps DataFrame row
``i`` on file line ``i + 2``; the formats handled here have no quoted multi-line cells, so the mapping holds.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError

MAX_REPORTED = 20  # skip reasons kept in LoadedTrace.errors (same cap as workloads.tracefmt.jsonl)
_EXTRA_COLS = 8  # spare columns so a row with a few too many fields is reported, not a parser crash


def open_text(path: Path) -> IO[str]:
    """Text handle on ``path``; ``.gz`` files are decompressed; a UTF-8 BOM is dropped."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def check_file(path: Path) -> None:
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory; expected a trace file")
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such trace file")


def norm_col(name: str) -> str:
    """Column key that ignores case, spaces and underscores ('Session ID' == 'SessionID' == 'session_id')."""
    return re.sub(r"[\s_]+", "", name).lower()


class RowErrors:
    """Malformed rows of one file: raise on the earliest one, or (``skip``) drop and count them all."""

    def __init__(self, path: Path, skip: bool, n: int = 0) -> None:
        self.path = path
        self.skip = skip
        self.bad = np.zeros(n, dtype=bool)
        self._first: list[tuple[int, str]] = []  # (line, message) of the earliest flagged rows
        self.count = 0  # rows skipped by the row-by-row (JSON) path

    # ---- vectorised (CSV) ---------------------------------------------------------------------------
    def flag(self, mask: np.ndarray, lines: np.ndarray, message: Callable[[int], str]) -> None:
        """Mark rows ``mask``; ``message(i)`` describes row i (called for the first few only)."""
        new = np.flatnonzero(mask & ~self.bad)
        if not len(new):
            return
        self.bad[new] = True
        for i in new[:MAX_REPORTED]:
            self._first.append((int(lines[i]), f"{self.path}:{int(lines[i])}: {message(int(i))}"))
        self._first.sort()
        del self._first[MAX_REPORTED:]

    def raise_first(self) -> None:
        """Without ``skip``, raise the error of the earliest flagged line (whatever column found it)."""
        if self._first and not self.skip:
            raise TraceFormatError(self._first[0][1])

    # ---- row by row (JSON) --------------------------------------------------------------------------
    def row(self, line: int | str, message: str) -> None:
        """One bad row (a line number, or a place such as "entry 3"): raise, or count it and keep why."""
        msg = f"{self.path}:{line}: {message}" if isinstance(line, int) else f"{self.path}: {line}: {message}"
        if not self.skip:
            raise TraceFormatError(msg)
        self.count += 1
        if len(self._first) < MAX_REPORTED:
            self._first.append((len(self._first), msg))

    @property
    def num_skipped(self) -> int:
        return int(self.bad.sum()) + self.count

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(m for _, m in self._first)


class CsvTable:
    """A CSV's cells as stripped strings, with the file line of each row and canonical column names.

    ``required`` columns must be present (else TraceFormatError naming it and listing those found);
    ``optional`` ones are used when present. Names match ignoring case, spaces and underscores.
    """

    def __init__(
        self, path: Path, fmt: str, required: Sequence[str], optional: Sequence[str] = (), skip: bool = False
    ) -> None:
        self.path = path
        header = _read_header(path)
        by_key: dict[str, str] = {}
        for name in header:
            if norm_col(name) in by_key:
                raise TraceFormatError(f"{path}:1: duplicate column {name!r}")
            by_key[norm_col(name)] = name
        for want in required:
            if norm_col(want) not in by_key:
                found = ", ".join(repr(h) for h in header)
                raise TraceFormatError(f"{path}:1: missing column {want!r} ({fmt}); columns found: {found}")
        self.columns = {w: by_key[norm_col(w)] for w in (*required, *optional) if norm_col(w) in by_key}
        extras = [f"\x00extra{i}" for i in range(_EXTRA_COLS)]
        df = _read_body(path, header, extras)
        cells = {c: df[c].str.strip() for c in df.columns}
        blank = np.logical_and.reduce([(cells[c] == "").to_numpy() for c in df.columns]) if len(df) else []
        keep = ~np.asarray(blank, dtype=bool)  # blank lines are no rows, but they still count as lines
        self.lines = (np.arange(len(df)) + 2)[keep]
        self.cells = {c: s[keep].reset_index(drop=True) for c, s in cells.items()}
        self.n = int(keep.sum())
        if self.n == 0:
            raise TraceFormatError(f"{path}: no data rows (only a header)")
        self.errors = RowErrors(path, skip=skip, n=self.n)
        # fields per row beyond the header: spare columns used, or the count a folded row recorded
        found = np.full(self.n, len(header), dtype=np.int64)
        for c in extras:
            found += (self.cells[c] != "").to_numpy()
        marker = self.cells[extras[-1]]
        folded = marker.str.startswith("\x00").to_numpy()
        if folded.any():
            found[folded] = marker[folded].str[1:].astype(int).to_numpy()
        width = len(header)
        self.errors.flag(found > width, self.lines, lambda i: f"expected {width} fields, found {found[i]}")

    def has(self, col: str) -> bool:
        return col in self.columns

    def raw(self, col: str) -> pd.Series:
        return self.cells[self.columns[col]]

    def ints(self, col: str) -> np.ndarray:
        """Column as int64 (>= 0); bad cells are flagged and read as 0. Integral floats ('12.0') pass."""
        raw = self.raw(col)
        num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        ok = np.isfinite(num)
        ok[ok] = num[ok] == np.floor(num[ok])

        def not_int(i: int) -> str:
            v = raw.iat[i]
            return f"{col}: missing value" if v == "" else f"{col}: {v!r} is not an integer"

        self.errors.flag(~ok, self.lines, not_int)
        neg = ok & (np.where(ok, num, 0) < 0)
        self.errors.flag(neg, self.lines, lambda i: f"{col}: {raw.iat[i]!r} must be >= 0")
        big = ok & ~neg & (np.where(ok, num, 0) > 2**53)  # past exact integers: no int64 to cast it to
        self.errors.flag(big, self.lines, lambda i: f"{col}: {raw.iat[i]!r} is too large (at most 2**53)")
        return np.where(ok & ~neg & ~big, num, 0).astype(np.int64)

    def floats(self, col: str, lo: float | None = None) -> np.ndarray:
        """A column of finite numbers (``lo``: and at least that); a bad row is flagged, naming it."""
        raw = self.raw(col)
        num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        ok = np.isfinite(num) if lo is None else np.isfinite(num) & (num >= lo)

        def not_num(i: int) -> str:
            v = raw.iat[i]
            if v == "":
                return f"{col}: missing value"
            return f"{col}: {v!r} is not a number" + ("" if lo is None else f" >= {lo:g}")

        self.errors.flag(~ok, self.lines, not_num)
        return np.where(ok, num, 0.0)

    def timestamps(self, col: str) -> np.ndarray:
        """ISO 8601 timestamps (any fractional digits, optional UTC offset) → seconds since the earliest."""
        raw = self.raw(col)
        ts = pd.to_datetime(raw, format="ISO8601", utc=True, errors="coerce")
        ok = ts.notna().to_numpy()

        def not_ts(i: int) -> str:
            v = raw.iat[i]
            return f"{col}: missing value" if v == "" else f"{col}: {v!r} is not a timestamp"

        self.errors.flag(~ok, self.lines, not_ts)
        if not ok.any():
            return np.zeros(self.n)
        secs = ((ts - ts[ok].min()) / pd.Timedelta(seconds=1)).to_numpy(dtype=float, na_value=0.0)
        return np.where(ok, secs, 0.0)


def _read_header(path: Path) -> list[str]:
    try:
        with open_text(path) as f:
            for line in f:
                if line.strip():
                    return [h.strip() for h in next(csv.reader([line]))]
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise TraceFormatError(f"{path}: cannot read: {e}") from None
    raise TraceFormatError(f"{path}: empty file")


def _read_body(path: Path, header: list[str], extras: list[str]) -> pd.DataFrame:
    names = [*header, *extras]
    kw: dict[str, Any] = dict(
        skiprows=1,
        header=None,
        names=names,
        dtype=str,
        keep_default_na=False,
        na_filter=False,
        skip_blank_lines=False,
        encoding="utf-8-sig",
    )
    try:
        return pd.read_csv(path, engine="c", **kw)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=names)
    except pd.errors.ParserError:
        pass  # a row with more fields than even the spare columns: re-read, truncating and marking it
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not UTF-8 text: {e}") from None
    width = len(names)

    def fold(fields: list[str]) -> list[str]:
        # keep the row (so line numbers stay aligned); the last spare column records its field count
        return [*fields[: width - 1], f"\x00{len(fields)}"]

    # the python engine leaves short rows' missing cells as NaN even with na_filter=False
    return pd.read_csv(path, engine="python", on_bad_lines=fold, **kw).fillna("")


def iter_json_lines(path: Path, errors: RowErrors) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; bad JSON or a non-object is a row error."""
    try:
        with open_text(path) as f:
            lines = list(enumerate(f, start=1))
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise TraceFormatError(f"{path}: cannot read: {e}") from None
    if not any(line.strip() for _, line in lines):
        raise TraceFormatError(f"{path}: empty file")
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            errors.row(lineno, f"invalid JSON: {e.msg} at column {e.colno}")
            continue
        if not isinstance(obj, dict):
            errors.row(lineno, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield lineno, obj


class FieldError(Exception):
    """A bad value in a JSON row; the loader turns it into ``file:line: field: why``."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")


def get_int(obj: dict[str, Any], key: str, *, required: bool = True, lo: int = 0) -> int | None:
    if key not in obj or obj[key] is None:
        if required:
            raise FieldError(key, "missing")
        return None
    v = obj[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise FieldError(key, f"{v!r} is not an integer")
    if v < lo:
        raise FieldError(key, f"{v} must be >= {lo}")
    return v


def get_number(obj: dict[str, Any], key: str, *, required: bool = True) -> float | None:
    if key not in obj or obj[key] is None:
        if required:
            raise FieldError(key, "missing")
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise FieldError(key, f"{v!r} is not a finite number >= 0")
    return float(v)


def get_int_list(obj: dict[str, Any], key: str) -> tuple[int, ...] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        raise FieldError(key, f"expected a list of integers, got {type(v).__name__}")
    if not all(type(x) is int for x in v):  # fast path; the slow one names the element
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int):
                raise FieldError(key, f"element {i}: {x!r} is not an integer")
    return tuple(v)
