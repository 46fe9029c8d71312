"""Reading trace files row by row with errors that point at ``file:line: field``.

Line numbers are 1-based and count the header as line 1, so they match what an editor shows. CSVs are
parsed by pandas (C engine) with every cell as a string and blank lines kept, which keeps DataFrame row
``i`` on file line ``i + 2``, plus the line breaks of any quoted multi-line cell above it (``_row_lines``).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import int_digits
from workloads.gen.lengths import MAX_LEN

MAX_REPORTED = 20  # skip reasons kept in LoadedTrace.errors (same cap as workloads.tracefmt.jsonl)
_EXTRA_COLS = 8  # spare columns so a row with a few too many fields is reported, not a parser crash
# What reading a trace file can raise besides a parse error: bytes that are not UTF-8, an unreadable path,
# a truncated or corrupt .gz (EOFError, gzip.BadGzipFile is an OSError, zlib.error is neither).
READ_ERRORS = (UnicodeDecodeError, OSError, EOFError, zlib.error)


def open_text(path: Path, newline: str | None = None) -> IO[str]:
    """Text handle on ``path``; ``.gz`` files are decompressed; a UTF-8 BOM is dropped."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline=newline)
    return open(path, encoding="utf-8-sig", newline=newline)


def cannot_read(path: Path, e: BaseException) -> TraceFormatError:
    """The one-line error for a file that cannot be read (``e`` one of READ_ERRORS)."""
    why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "cannot read"
    return TraceFormatError(f"{path}: {why}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def as_path(path: Any, what: str = "trace file") -> Path:
    """``path`` (a str or an os.PathLike) as a Path; anything else (None, a number, bytes, an open file) or
    a path holding a NUL byte is a ConfigError naming it, not a TypeError from pathlib."""
    if isinstance(path, str | os.PathLike) and not isinstance(path, bytes):
        try:
            p = Path(path)
        except TypeError:  # an os.PathLike whose __fspath__ gives bytes
            p = None
        if p is not None and "\x00" not in str(p):
            return p
    got = repr(path) if isinstance(path, str | bytes | int | float | None) else type(path).__name__
    raise ConfigError(f"path: expected the path of a {what} (a str or an os.PathLike, without NUL bytes), got "
                      f"{got[:80]}")


def is_text(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (JSON's ``\\ud800`` escape decodes to a lone surrogate, which does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_file(path: Path) -> None:
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory; expected a trace file")
    if path.exists() and not path.is_file():
        raise TraceFormatError(f"{path}: not a regular file (a device or a pipe); expected a trace file")
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
        lines = _row_lines(df)
        cells = {c: df[c].str.strip() for c in df.columns}
        blank = np.logical_and.reduce([(cells[c] == "").to_numpy() for c in df.columns]) if len(df) else []
        keep = ~np.asarray(blank, dtype=bool)  # blank lines are no rows, but they still count as lines
        self.lines = lines[keep]
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
        big = ok & ~neg & (np.where(ok, num, 0) > MAX_LEN)  # the bound on every token count
        self.errors.flag(big, self.lines, lambda i: f"{col}: {raw.iat[i]!r} is too large; allowed 0 <= value <= {MAX_LEN}")
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


def _row_lines(df: pd.DataFrame) -> np.ndarray:
    """The file line each row of the body starts on: row i on line i + 2, unless a quoted cell above it
    spans several lines (``"374\\n"``), which moves every later row down by its line breaks."""
    lines = np.arange(len(df), dtype=np.int64) + 2
    if not len(df) or not any("\n" in "".join(df[c].to_numpy()) for c in df.columns):  # the usual case: one pass
        return lines
    breaks = np.zeros(len(df), dtype=np.int64)
    for c in df.columns:
        breaks += df[c].str.count("\n").to_numpy(dtype=np.int64)
    lines[1:] += np.cumsum(breaks)[:-1]
    return lines


def _read_header(path: Path) -> list[str]:
    try:
        with open_text(path) as f:
            for line in f:
                if line.strip():
                    return [h.strip() for h in next(csv.reader([line]))]
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
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
    if _first_row_too_long(path, len(names)):
        # pandas would take the surplus fields as an index (slowly: minutes for 2,000,000 of them)
        return _read_folded(path, names)
    try:
        df = pd.read_csv(path, engine="c", **kw)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=names)
    except pd.errors.ParserError:
        pass  # a row with more fields than even the spare columns: re-read, truncating and marking it
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    else:
        if isinstance(df.index, pd.RangeIndex):
            return df
        # the first row had more fields than the names after all: pandas made the surplus an index
    return _read_folded(path, names)


def _first_row_too_long(path: Path, width: int) -> bool:
    """Whether the first non-blank row after the header has more than ``width`` fields."""
    try:
        with open_text(path, newline="") as f:
            reader = csv.reader(f)
            next(reader, None)  # the header line (read_csv's skiprows=1)
            for fields in reader:
                if fields:
                    return len(fields) > width
    except (csv.Error, *READ_ERRORS):
        pass  # read_csv reports it
    return False


def _read_folded(path: Path, names: list[str]) -> pd.DataFrame:
    """The body as read_csv(skiprows=1) reads it, every cell a string, with each row longer than ``names``
    folded: cut to the names, its last cell recording ``"\x00<field count>"`` (so line numbers stay
    aligned and the row is reported). One linear pass of the csv module: pandas' python engine with an
    ``on_bad_lines`` callable took minutes over a row of 2,000,000 fields."""
    width = len(names)
    rows: list[list[str]] = []
    try:
        with open_text(path, newline="") as f:
            reader = csv.reader(f)
            try:
                next(reader, None)  # the header line
                for fields in reader:
                    n = len(fields)
                    if n > width:
                        fields = [*fields[: width - 1], f"\x00{n}"]
                    elif n < width:
                        fields.extend([""] * (width - n))
                    rows.append(fields)
            except csv.Error as e:
                raise TraceFormatError(f"{path}:{reader.line_num}: {e}") from None
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    return pd.DataFrame(rows, columns=names, dtype=str) if rows else pd.DataFrame(columns=names)


def iter_json_lines(path: Path, errors: RowErrors) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; bad JSON or a non-object is a row error."""
    try:
        with open_text(path) as f:
            lines = list(enumerate(f, start=1))
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    if not any(line.strip() for _, line in lines):
        raise TraceFormatError(f"{path}: empty file")
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            obj = loads_row(line)
        except json.JSONDecodeError as e:
            errors.row(lineno, f"invalid JSON: {e.msg} at column {e.colno}")
            continue
        except DuplicateKey as e:
            errors.row(lineno, str(e))
            continue
        except (RecursionError, ValueError) as e:  # nesting past the decoder's stack; an int of > 4300 digits
            errors.row(lineno, json_error(e))
            continue
        if not isinstance(obj, dict):
            errors.row(lineno, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield lineno, obj


class DuplicateKey(ValueError):
    """A JSON object that names a key twice (``json.loads`` would keep the last value without a word)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"field {key!r} given twice in one object")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def loads_row(line: str) -> Any:
    """``json.loads(line)``, refusing an object that repeats a key (DuplicateKey). Each key in the text has
    its own ':', so a line with no more colons than its object has keys repeats none: only the others
    (nested objects, colons inside strings) are decoded a second time, with a hook that checks."""
    obj = json.loads(line)
    if isinstance(obj, dict) and line.count(":") > len(obj):
        return json.loads(line, object_pairs_hook=_unique_pairs)
    if isinstance(obj, list) and ":" in line:
        return json.loads(line, object_pairs_hook=_unique_pairs)
    return obj


def json_error(e: BaseException) -> str:
    """Why a JSON text did not decode, in one line (RecursionError or a ValueError other than JSONDecodeError)."""
    if isinstance(e, RecursionError):
        return "invalid JSON: nested too deeply to read (allowed: well under 1000 levels of [ ] and { })"
    return f"invalid JSON: {str(e).splitlines()[0].split(';')[0]}"  # "Exceeds the limit (4300 digits) ..."


class FieldError(Exception):
    """A bad value in a JSON row; the loader turns it into ``file:line: field: why``."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")


def get_int(
    obj: dict[str, Any], key: str, *, required: bool = True, lo: int = 0, hi: int | None = MAX_LEN
) -> int | None:
    """``obj[key]`` as an int in ``[lo, hi]`` (default: a token count, at most MAX_LEN)."""
    if key not in obj or obj[key] is None:
        if required:
            raise FieldError(key, "missing")
        return None
    v = raw = obj[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise FieldError(key, f"{v!r} is not an integer")
    if v < lo:
        raise FieldError(key, f"{v} must be >= {lo}")
    if hi is not None and v > hi:
        raise FieldError(key, f"got {raw!r}; allowed {lo} <= value <= {hi}")
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


ID_BOUND = 1 << 63  # token ids: what an int64 holds (a tokenizer's vocabulary is far below)
HASH_ID_BOUND = 1 << 64  # hash ids: a 64-bit hash, signed or unsigned (xxh3-64's intdigest reaches 2**64 - 1)


def id_range_text(key: str) -> tuple[int, int, str]:
    """The ids ``key`` may hold: [lo, hi) and how a refusal says it."""
    if key.startswith("hash"):
        return -ID_BOUND, HASH_ID_BOUND, "a 64-bit hash, -2**63 <= id < 2**64"
    return -ID_BOUND, ID_BOUND, "an id within int64 (|id| < 2**63)"


def get_int_list(obj: dict[str, Any], key: str) -> tuple[int, ...] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        raise FieldError(key, f"expected a list of integers, got {type(v).__name__}")
    lo, hi, allowed = id_range_text(key)
    if not all(type(x) is int and lo <= x < hi for x in v):  # fast path; the slow one names the element
        v = list(v)
        for i, x in enumerate(v):
            if isinstance(x, float) and x.is_integer():  # integral floats (12.0) are integers, as for lengths
                v[i] = x = int(x)
            if isinstance(x, bool) or not isinstance(x, int):
                raise FieldError(key, f"element {i}: {x!r} is not an integer")
            if not lo <= x < hi:
                raise FieldError(key, f"element {i}: an integer of {int_digits(x)} digits; allowed: {allowed}")
    return tuple(v)
