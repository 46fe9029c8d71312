"""servesim's own request trace: JSON Lines, one request per line (``.gz`` is read and written gzipped).

Fields of a row (anything else is an error unless ``extra="ignore"``):

=================  ========  ==================================================================
``arrival_time``   required  seconds from the start of the run, finite, >= 0
``output_len``     required  integer, 1 <= value <= MAX_LEN (10**9, workloads.gen.lengths)
``prompt_len``     see note  integer, 1 <= value <= MAX_LEN; may be omitted when ``token_ids`` is
                             given, else must equal ``len(token_ids)``
``request_id``     optional  string of Unicode text (no lone surrogate such as ``"\\ud800"``); missing
                             ids become ``r<i>`` (i = position in arrival order; ``r<i>_<k>``, the
                             smallest k >= 1 free, when the file itself names a request ``r<i>``)
``priority``       optional  integer, |value| <= MAX_PRIORITY (default 0; lower is served first, as
                             in vLLM)
``session_id``     optional  string or null
``token_ids``      optional  list of ints: the literal prompt
``hash_ids``       optional  list of ints, one per ``hash_block_size`` tokens (Mooncake style);
``hash_block_size``          required with ``hash_ids``, integer >= 1
``segments``       optional  list of ``[key, length]``; equal keys mean equal tokens (JSON lists
                             in keys come back as tuples, so ``["sys", 3]`` is ``("sys", 3)``)
``output_key``     optional  content key of the generated tokens (same list→tuple rule)
=================  ========  ==================================================================

At most one of ``token_ids``, ``hash_ids``, ``segments``. Integral floats (``12.0``) are accepted for
integers (segment lengths included). A UTF-8 byte-order mark at the start of the file is dropped.
``load_jsonl`` returns a :class:`LoadedTrace`: the specs sorted by arrival time (stable, so equal times
keep file order) plus how many rows were skipped (``skip_bad_rows=True``) or clipped to
``max_model_len`` (see :func:`workloads.gen.lengths.clip_to_context`).
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import MAX_PRIORITY, int_digits
from sim.core.request import RequestSpec
from workloads.gen.lengths import MAX_LEN, clip_to_context
from workloads.tracefmt.rows import READ_ERRORS, DuplicateKey, as_path, id_range_text, is_text, loads_row

FIELDS = (
    "arrival_time",
    "prompt_len",
    "output_len",
    "request_id",
    "priority",
    "session_id",
    "token_ids",
    "hash_ids",
    "hash_block_size",
    "segments",
    "output_key",
)
MAX_REPORTED = 20  # skipped-row messages kept in LoadedTrace.errors


@dataclass(frozen=True)
class LoadedTrace(Sequence[RequestSpec]):
    """Specs in arrival order plus what loading did to the file; indexes and iterates like the spec list."""

    specs: list[RequestSpec]
    num_skipped: int = 0
    num_clipped: int = 0
    errors: tuple[str, ...] = field(default=(), repr=False)  # first MAX_REPORTED skip reasons
    num_late: int = 0  # rows that come before the row above them in time (sorted by arrival, and said so)

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i):  # type: ignore[override]
        return self.specs[i]

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.specs)


class _RowError(Exception):
    def __init__(self, fld: str, msg: str) -> None:
        super().__init__(msg)
        self.field = fld


def _open(path: Path, mode: str) -> IO[str]:
    """Text handle; read: a leading UTF-8 BOM is dropped, as every other trace format's reader does."""
    enc = "utf-8-sig" if mode == "r" else "utf-8"
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding=enc)
    return open(path, mode, encoding=enc)


def _int(row: dict, key: str, lo: int | None, hi: int | None = None) -> int:
    v = raw = row[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _RowError(key, f"expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise _RowError(key, f"must be >= {lo}, got {v}")
    if hi is not None and (v > hi or (lo is None and v < -hi)):
        raise _RowError(key, f"got {raw!r}; allowed {-hi if lo is None else lo} <= value <= {hi}")
    return v


def _int_list(row: dict, key: str) -> tuple[int, ...]:
    v = row[key]
    if not isinstance(v, list):
        raise _RowError(key, f"expected a list of integers, got {type(v).__name__}")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, float) and x.is_integer():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int):
            raise _RowError(key, f"element {i}: expected an integer, got {x!r}")
        lo, hi, allowed = id_range_text(key)
        if not lo <= x < hi:
            raise _RowError(key, f"element {i}: an integer of {int_digits(x)} digits; allowed: {allowed}")
        out.append(x)
    return tuple(out)


def _key(v: Any, fld: str) -> Hashable:
    """JSON value → hashable content key (lists become tuples, recursively)."""
    try:
        return _key_of(v, fld)
    except RecursionError:  # a list nested nearly as deep as the JSON decoder allows
        raise _RowError(fld, "nested too deeply to use (hundreds of levels of [ ]; allowed: a few)") from None


def _key_of(v: Any, fld: str) -> Hashable:
    if isinstance(v, list):
        return tuple(_key_of(x, fld) for x in v)
    if isinstance(v, dict):
        raise _RowError(fld, "keys must be strings, numbers or lists, not objects")
    return v


def _parse_row(row: Any, extra: str) -> RequestSpec:
    if not isinstance(row, dict):
        raise _RowError("(row)", f"expected a JSON object, got {type(row).__name__}")
    if extra == "error":
        for k in row:
            if k not in FIELDS:
                raise _RowError(k, f"unknown field; allowed: {', '.join(FIELDS)}")
    for k in ("arrival_time", "output_len"):
        if k not in row:
            raise _RowError(k, "missing")
    t = row["arrival_time"]
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise _RowError("arrival_time", f"expected a finite number >= 0 (seconds), got {t!r}")
    kw: dict[str, Any] = {"arrival_time": float(t), "output_len": _int(row, "output_len", 1, MAX_LEN)}
    rid = row.get("request_id")
    if rid is not None and not isinstance(rid, str):
        raise _RowError("request_id", f"expected a string, got {rid!r}")
    if rid and not rid.isascii() and not is_text(rid):  # isascii: a flag CPython keeps, O(1)  # "\ud800" is valid JSON, but no UTF-8 output (parquet, JSON) can hold it
        raise _RowError("request_id", f"{rid!r} is not valid Unicode text (a lone surrogate); allowed: a string "
                        "of Unicode characters")
    kw["request_id"] = rid or ""
    if row.get("priority") is not None:
        kw["priority"] = _int(row, "priority", None, MAX_PRIORITY)
    sid = row.get("session_id")
    if sid is not None and not isinstance(sid, str):
        raise _RowError("session_id", f"expected a string or null, got {sid!r}")
    kw["session_id"] = sid
    content = [k for k in ("token_ids", "hash_ids", "segments") if row.get(k) is not None]
    if len(content) > 1:
        raise _RowError(
            content[1], f"give at most one of token_ids, hash_ids, segments (got {', '.join(content)})"
        )
    if row.get("prompt_len") is not None:
        kw["prompt_len"] = _int(row, "prompt_len", 1, MAX_LEN)
    if row.get("token_ids") is not None:
        toks = _int_list(row, "token_ids")
        if not toks:
            raise _RowError("token_ids", "empty")
        if min(toks) < 0:  # a tokenizer's ids count from 0
            i = next(j for j, x in enumerate(toks) if x < 0)
            raise _RowError("token_ids", f"element {i}: {toks[i]} is not a token id (allowed: integers >= 0)")
        if "prompt_len" in kw and kw["prompt_len"] != len(toks):
            raise _RowError("prompt_len", f"{kw['prompt_len']} does not match {len(toks)} token_ids")
        kw["token_ids"], kw["prompt_len"] = toks, len(toks)
    if "prompt_len" not in kw:
        raise _RowError("prompt_len", "missing (required unless token_ids is given)")
    if row.get("hash_ids") is not None:
        kw["hash_ids"] = _int_list(row, "hash_ids")
        if row.get("hash_block_size") is None:
            raise _RowError("hash_block_size", "missing (required with hash_ids)")
        kw["hash_block_size"] = _int(row, "hash_block_size", 1)
        want = -(-kw["prompt_len"] // kw["hash_block_size"])
        if len(kw["hash_ids"]) != want:
            raise _RowError("hash_ids", f"{len(kw['hash_ids'])} ids for prompt_len {kw['prompt_len']} in blocks of "
                            f"{kw['hash_block_size']}; allowed exactly {want} (one per block, the last partial)")
    elif row.get("hash_block_size") is not None:
        raise _RowError("hash_block_size", "only meaningful with hash_ids")
    if row.get("segments") is not None:
        segs = row["segments"]
        if not isinstance(segs, list) or not segs:
            raise _RowError("segments", "expected a non-empty list of [key, length] pairs")
        out = []
        for i, s in enumerate(segs):
            if isinstance(s, list) and len(s) == 2 and isinstance(s[1], float) and s[1].is_integer():
                s = [s[0], int(s[1])]  # integral floats (12.0) are integers, as everywhere in a row
            if not (
                isinstance(s, list) and len(s) == 2 and isinstance(s[1], int) and not isinstance(s[1], bool)
            ):
                raise _RowError("segments", f"element {i}: expected [key, length], got {s!r}")
            if s[1] < 1:
                raise _RowError("segments", f"element {i}: length must be >= 1, got {s[1]}")
            if s[1] > MAX_LEN:
                raise _RowError("segments", f"element {i}: length {s[1]}; allowed 1 <= length <= {MAX_LEN}")
            out.append((_key(s[0], "segments"), s[1]))
        total = sum(n for _, n in out)
        if total != kw["prompt_len"]:
            raise _RowError("segments", f"lengths add up to {total}, not prompt_len {kw['prompt_len']}")
        kw["segments"] = tuple(out)
    if row.get("output_key") is not None:
        kw["output_key"] = _key(row["output_key"], "output_key")
    return RequestSpec(**kw)


def clip_spec(spec: RequestSpec, max_model_len: int) -> RequestSpec | None:
    """The spec fitted into ``max_model_len`` tokens (its content cut with it), or None when it already fits."""
    p, o, changed = clip_to_context(np.array([spec.prompt_len]), np.array([spec.output_len]), max_model_len)
    if not changed[0]:
        return None
    p_new, o_new = int(p[0]), int(o[0])
    kw: dict[str, Any] = {"prompt_len": p_new, "output_len": o_new}
    if spec.token_ids is not None:
        kw["token_ids"] = spec.token_ids[:p_new]
    if spec.hash_ids is not None:
        kw["hash_ids"] = spec.hash_ids[: -(-p_new // spec.hash_block_size)]
    if spec.segments is not None:
        segs, left = [], p_new
        for key, n in spec.segments:
            if left <= 0:
                break
            segs.append((key, min(n, left)))
            left -= n
        kw["segments"] = tuple(segs)
    return replace(spec, **kw)


def _max_model_len(v: Any) -> int:
    """load_jsonl's ``max_model_len``, as the trace options take it (core.option_int: an integer >= 2, room
    for a 1-token prompt and output); every length is <= MAX_LEN, so a larger context changes nothing."""
    from workloads.tracefmt.core import option_int  # core imports this module

    return min(option_int("max_model_len", v, 2), 2 * MAX_LEN + 1)


def load_jsonl(
    path: str | Path,
    *,
    skip_bad_rows: bool = False,
    max_model_len: int | None = None,
    extra: str = "error",
) -> LoadedTrace:
    """Read a servesim JSONL trace. A bad row raises TraceFormatError ``file:line: field 'x': why``;
    with ``skip_bad_rows`` it is dropped and counted instead (blank lines are always skipped silently).
    ``max_model_len`` clips over-long requests and counts them; ``extra="ignore"`` tolerates unknown fields.
    """
    if extra not in ("error", "ignore"):
        raise ConfigError(f"load_jsonl: extra must be 'error' or 'ignore', got {extra!r}")
    if not isinstance(skip_bad_rows, bool | np.bool_):
        raise ConfigError(f"trace option skip_bad_rows: expected true or false, got {skip_bad_rows!r}")
    if max_model_len is not None:
        max_model_len = _max_model_len(max_model_len)
    path = as_path(path)
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory; expected a trace file")
    if path.exists() and not path.is_file():
        raise TraceFormatError(f"{path}: not a regular file (a device or a pipe); expected a trace file")
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such trace file")
    rows: list[tuple[RequestSpec, int]] = []
    errors: list[str] = []
    num_skipped = num_clipped = 0

    def bad(msg: str) -> None:
        nonlocal num_skipped
        if not skip_bad_rows:
            raise TraceFormatError(msg)
        num_skipped += 1
        if len(errors) < MAX_REPORTED:
            errors.append(msg)

    try:
        with _open(path, "r") as f:
            lines = list(enumerate(f, start=1))
    except READ_ERRORS as e:
        why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "cannot read"
        raise TraceFormatError(f"{path}: {why}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            obj = loads_row(line)
        except json.JSONDecodeError as e:
            bad(f"{path}:{lineno}: field '(json)': invalid JSON: {e.msg} at column {e.colno}")
            continue
        except DuplicateKey as e:
            bad(f"{path}:{lineno}: field '{e.key}': given twice in one row")
            continue
        except RecursionError:
            bad(f"{path}:{lineno}: field '(json)': invalid JSON: nested too deeply to read (allowed: well under "
                "1000 levels of [ ] and { })")
            continue
        except ValueError as e:  # an integer of more than 4300 digits
            bad(f"{path}:{lineno}: field '(json)': invalid JSON: {str(e).splitlines()[0].split(';')[0]}")
            continue
        try:
            spec = _parse_row(obj, extra)
        except _RowError as e:
            bad(f"{path}:{lineno}: field '{e.field}': {e}")
            continue
        except ConfigError as e:  # RequestSpec's own checks
            bad(f"{path}:{lineno}: {e}")
            continue
        if max_model_len is not None:
            clipped = clip_spec(spec, max_model_len)
            if clipped is not None:
                spec, num_clipped = clipped, num_clipped + 1
        rows.append((spec, lineno))

    num_late = sum(1 for a, b in zip(rows, rows[1:], strict=False) if b[0].arrival_time < a[0].arrival_time)
    rows.sort(key=lambda r: r[0].arrival_time)  # stable: ties keep file order
    specs: list[RequestSpec] = []
    seen: dict[str, int] = {}
    # an automatic id never takes a name the file uses (the set only when some row has no id)
    named = {spec.request_id for spec, _ in rows if spec.request_id} if any(not s.request_id for s, _ in rows) else set()
    for i, (spec, lineno) in enumerate(rows):
        if not spec.request_id:
            spec = replace(spec, request_id=_free_id(f"r{i}", named))
        if spec.request_id in seen:
            bad(
                f"{path}:{lineno}: field 'request_id': duplicate {spec.request_id!r} (first on line {seen[spec.request_id]})"
            )
            continue
        seen[spec.request_id] = lineno
        specs.append(spec)
    return LoadedTrace(specs, num_skipped, num_clipped, tuple(errors), num_late)


def _free_id(rid: str, named: set[str]) -> str:
    """``rid`` (``r<i>``), or ``r<i>_<k>`` with the smallest k >= 1 that no row of the file names."""
    k = 0
    out = rid
    while out in named:
        k += 1
        out = f"{rid}_{k}"
    return out


def _jsonable_key(key: Hashable, rid: str) -> Any:
    if isinstance(key, tuple):
        return [_jsonable_key(k, rid) for k in key]
    if key is None or isinstance(key, str | int | float | bool):
        return key
    if isinstance(key, np.integer | np.floating):
        return key.item()
    raise TraceFormatError(f"request {rid}: content key {key!r} cannot be written as JSON")


def spec_to_row(spec: RequestSpec) -> dict[str, Any]:
    """The JSON object for one spec; defaults (priority 0, no session, no content) are left out."""
    row: dict[str, Any] = {
        "request_id": spec.request_id,
        "arrival_time": spec.arrival_time,
        "prompt_len": spec.prompt_len,
        "output_len": spec.output_len,
    }
    if spec.priority != 0:
        row["priority"] = spec.priority
    if spec.session_id is not None:
        row["session_id"] = spec.session_id
    if spec.token_ids is not None:
        row["token_ids"] = [int(t) for t in spec.token_ids]
    elif spec.hash_ids is not None:
        row["hash_ids"] = [int(h) for h in spec.hash_ids]
        row["hash_block_size"] = spec.hash_block_size
    elif spec.segments is not None:
        row["segments"] = [[_jsonable_key(k, spec.request_id), int(n)] for k, n in spec.segments]
    if spec.output_key is not None:
        row["output_key"] = _jsonable_key(spec.output_key, spec.request_id)
    return row


def save_jsonl(specs: Iterable[RequestSpec], path: str | Path) -> int:
    """Write specs (in the given order) as JSONL; returns the number of rows written. Everything is checked
    before the file is opened: an element that is no RequestSpec, or a path that cannot be written, is a
    ConfigError naming it (no partial file)."""
    path = as_path(path, "JSONL file to write")
    try:
        specs = list(specs)
    except TypeError:
        raise ConfigError(f"save_jsonl: specs: expected an iterable of RequestSpec, got {type(specs).__name__}") from None
    for i, spec in enumerate(specs):
        if not isinstance(spec, RequestSpec):
            raise ConfigError(f"save_jsonl: specs[{i}]: expected a RequestSpec, got {type(spec).__name__}")
    lines = [json.dumps(spec_to_row(spec), separators=(",", ":")) + "\n" for spec in specs]
    if path.is_dir():
        raise ConfigError(f"save_jsonl: {path}: is a directory; expected the path of a JSONL file to write")
    if not path.parent.is_dir():
        raise ConfigError(f"save_jsonl: {path}: no such directory {str(path.parent)!r}; create it first")
    try:
        with _open(path, "w") as f:
            f.writelines(lines)
    except OSError as e:
        raise ConfigError(f"save_jsonl: {path}: cannot write: {e.strerror or type(e).__name__}") from None
    return len(lines)
