"""Config value helpers shared by the app and the plug-ins: range checks, file reading, size bounds.

Types are checked by the pydantic models of sim/core/typed.py.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sim.core.errors import ConfigError

# The most requests one workload may hold: every request is a row of the results, so this bounds memory.
MAX_REQUESTS = 1_000_000  # the most a run lists whole (rows of the requests table, a trace, sessions)
MAX_GENERATED = 1_000_000_000  # open and closed loops are generated as the clock reaches them
MAX_INT32 = 2**31 - 1  # engine and router counts: int32 is plenty, and int64 sums of them cannot overflow
MAX_PRIORITY = MAX_INT32  # |a request's priority|: vLLM takes any int; int32's range keeps the int64 columns far from overflow


def is_finite(v: int | float) -> bool:
    """``math.isfinite`` that says False for an integer past any float (JSON allows 10**400; isfinite raises)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def int_digits(v: int) -> int:
    """Decimal digits of an int, for a message about one too large for a float (str() stops at 4300 digits)."""
    v = abs(int(v))
    n = int(v.bit_length() * 0.30102999566398120) + 1  # log10(2); one too many at most
    return n - 1 if n > 1 and v < 10 ** (n - 1) else n


def check_range(
    where: str,
    key: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    unit: str = "",
) -> Any:
    """``value`` (None passes) within [lo, hi] (open ends where asked), finite; else the one message
    ``[section] key: out of range, got VALUE; allowed LO <= value <= HI``."""
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        name = f"{where} {key}" if where else key
        raise ConfigError(f"{name}: out of range, got {value}; allowed {allowed_range(lo, hi, lo_open, hi_open, unit)}")
    return value


def allowed_range(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False,
                  unit: str = "") -> str:
    def num(v: float) -> str:  # an int bound in full (2147483647, not 2.14748e+09)
        return str(v) if isinstance(v, int) else f"{v:g}"

    parts = []
    if lo is not None:
        parts.append(f"{num(lo)} {'<' if lo_open else '<='} ")
    parts.append("value")
    if hi is not None:
        parts.append(f" {'<' if hi_open else '<='} {num(hi)}")
    return "".join(parts) + (f" {unit}" if unit else "")


def missing_file(path: Any, what: str) -> str | None:
    """Why ``path`` cannot be read as ``what`` (None: it is a file): not found, or a directory."""
    from pathlib import Path

    p = Path(path)
    try:
        if p.is_file():
            return None
        if p.is_dir():
            return f"{p}: is a directory; expected a {what}"
        if p.exists():  # a device, a pipe, a socket
            return f"{p}: not a regular file; expected a {what}"
    except OSError as exc:  # e.g. a name longer than the file system allows
        return f"{what} {short_path(p)}: {exc.strerror or exc}"
    return f"{what} not found: {p}"


def short_path(p: Any) -> str:
    """A path for a one-line message: quoted, and its middle cut when it is long."""
    s = str(p)
    return repr(s if len(s) <= 120 else s[:60] + "..." + s[-40:])


def read_utf8(path: Any, kind: str = "TOML", error: type[Exception] = ConfigError) -> str:
    """A config file's text; not UTF-8 is an ``error`` naming the file and the byte (TOML and JSON are UTF-8)."""
    from pathlib import Path

    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:  # unreadable (permissions, a name too long, a directory)
        raise error(f"{p}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark (Windows editors) is not text
    except UnicodeDecodeError as exc:
        raise error(
            f"{p}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); allowed: a UTF-8 {kind} file"
        ) from None


def load_toml(path: Any, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; a missing file, bytes that are not UTF-8, a syntax error or nesting deeper than
    the parser can follow are one ConfigError naming the file."""
    import tomllib

    if (why := missing_file(path, what)) is not None:
        raise ConfigError(why)
    try:
        return tomllib.loads(read_utf8(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not readable TOML: arrays or tables nested too deeply") from None


def load_json(path: Any, what: str, error: type[Exception] = ConfigError) -> Any:
    """A JSON file's value; the same failures as load_toml are one ``error`` naming the file."""
    import json

    if (why := missing_file(path, what)) is not None:
        raise error(why)
    try:
        return json.loads(read_utf8(path, "JSON", error))
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{path}: not readable JSON: arrays or objects nested too deeply") from None


def human_int(text: str, where: str) -> int:
    """vLLM's human-readable integers (``--max-model-len 32k``): k/m/g = 1e3.., K/M/G = 2^10..; a sign as
    int() reads it (``-5``: vLLM parses it, and the config then says what the setting allows). ``where``:
    the flag, for the message."""
    m = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([kmgKMG]?)\s*", text)
    if not m:
        raise ConfigError(f"{where} {text!r}: expected an integer (e.g. 64, 32k, 1K)")
    num, unit = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    value = num * scale
    if not value.is_integer():
        raise ConfigError(f"{where} {text!r}: not a whole number")
    return int(value)


def max_model_len(text: str, where: str) -> int:
    """--max-model-len as vLLM reads it: a length (``32k``, ``1K``), or ``auto`` / ``-1``: the longest that
    fits (servesim's -1). ``plan --max-model-len`` takes the same."""
    return -1 if text.strip().lower() in ("auto", "-1") else human_int(text, where)
