"""Token-length distributions for prompts and outputs, plus the small config-reading helpers they share.

A config is a dict (a TOML table) such as ``{"dist": "lognormal", "mean": 1000, "std": 400, "max": 8192}``;
a bare integer means a fixed length. Every distribution is rounded to integers and clipped to
``[min, max]`` (``min`` defaults to 1, since a request needs at least one token).

* ``fixed``: ``value``.
* ``uniform``: ``low``..``high``, both inclusive.
* ``normal``: ``mean``, ``std``; rounded to the nearest integer, then clipped.
* ``lognormal``: either the mean and std *of the length* (``mean``, ``std``; converted with
  ``σ² = ln(1 + std²/mean²)``, ``μ = ln(mean) − σ²/2``) or the parameters of the underlying normal
  (``mu``, ``sigma``), never both.
* ``empirical``: resample with replacement from ``values`` (a list of integer token counts), or from
  column ``column`` of the CSV file ``csv`` (relative paths resolve against ``base_dir``).

A setting whose every length would be clipped to the same bound (all of it outside ``[min, max]``; for
``normal`` and ``lognormal``: 6 sigma either side) is refused: it is a fixed length in disguise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError

# ---- config-reading helpers (shared with synthetic.py) -----------------------------------------------


def check_keys(cfg: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Reject unknown keys, naming the key and listing the allowed ones (catches typos in TOML)."""
    allowed = sorted(allowed)
    for key in cfg:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}")


def read_float(
    cfg: Mapping[str, Any],
    key: str,
    where: str,
    *,
    default: float | None = None,
    lo: float | None = None,
    lo_open: bool = False,
    allow_inf: bool = False,
    hi: float | None = None,
) -> float:
    """A number from ``cfg[key]`` (ints accepted, bools and NaN not), checked against a lower bound."""
    if key not in cfg:
        if default is None:
            raise ConfigError(f"{where}.{key}: required")
        return default
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ConfigError(f"{where}.{key}: expected a number, got {v!r}")
    try:
        v = float(v)
    except OverflowError:  # an integer past any float (a TOML integer of hundreds of digits)
        from sim.core.fields import int_digits

        raise ConfigError(f"{where}.{key}: got an integer of {int_digits(int(v))} digits; allowed a finite number") from None
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ConfigError(f"{where}.{key}: expected a finite number, got {v}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ConfigError(f"{where}.{key}: must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where}.{key}: too large, got {v:g}; allowed at most {hi:g}")
    return v


THINK_DISTS = ("fixed", "exponential")


def check_think_dist(cfg: Mapping[str, Any], where: str) -> None:
    """``think_dist`` names one of THINK_DISTS (checked first: a misspelt name is named as such); it shapes
    the think time around ``think_time``, so given without it (a think time of 0) it would do nothing:
    refused, naming both. An explicit ``think_time = 0`` with it is a choice (the low end of a sweep)."""
    if "think_dist" not in cfg:
        return
    dist = cfg["think_dist"]
    if not isinstance(dist, str) or dist not in THINK_DISTS:
        raise ConfigError(f"{where}.think_dist: expected 'fixed' or 'exponential', got {dist!r}")
    if "think_time" not in cfg:
        raise ConfigError(f"{where}.think_dist = {cfg['think_dist']!r} without think_time: the think time is 0, "
                          "which no distribution shapes; allowed: give think_time (mean seconds), or drop think_dist")


def read_int(
    cfg: Mapping[str, Any],
    key: str,
    where: str,
    *,
    default: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
) -> int:
    """An integer from ``cfg[key]``; integral floats (``4.0``) are accepted, ``4.5`` and bools are not."""
    if key not in cfg:
        if default is None:
            raise ConfigError(f"{where}.{key}: required")
        return default
    v = cfg[key]
    if isinstance(v, float | np.floating) and float(v).is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise ConfigError(f"{where}.{key}: expected an integer, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ConfigError(f"{where}.{key}: must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where}.{key}: too large, got {cfg[key]!r}; allowed at most {hi}")
    return v


# ---- distributions -----------------------------------------------------------------------------------

# The one bound on a token count, wherever it comes from: a length setting, an empirical list or CSV, a
# trace row (workloads.tracefmt imports it). No model's context comes near 10**9 tokens, a float64 holds
# every count up to it exactly, and sums over millions of requests stay far inside the int64 arrays the
# workloads and loaders build; a count past it is a typo or a corrupt file, refused with this bound (not
# wrapped past int64, nor clipped without a word).
MAX_LEN = 10**9

DISTS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("mean", "std", "mu", "sigma"),
    "empirical": ("values", "csv", "column"),
}
_COMMON = ("dist", "min", "max")


@dataclass(frozen=True)
class LengthDist:
    """A validated length distribution; ``sample(n, rng)`` returns int64 lengths in ``[min_len, max_len]``.

    Empirical ``values`` is an ndarray kept out of ``==``/``hash`` (``source`` says where it came from).
    """

    dist: str
    value: int | None = None
    low: int | None = None
    high: int | None = None
    mean: float | None = None
    std: float | None = None
    mu: float | None = None
    sigma: float | None = None
    values: np.ndarray | None = field(default=None, compare=False, repr=False)
    source: str | None = None
    min_len: int = 1
    max_len: int | None = None

    def __post_init__(self) -> None:
        d = self.dist
        if d not in DISTS:
            raise ConfigError(f"length dist {d!r} is not one of {', '.join(DISTS)}")
        if self.min_len < 1:
            raise ConfigError(f"length {d}: min must be >= 1, got {self.min_len}")
        if self.max_len is not None and self.max_len < self.min_len:
            raise ConfigError(f"length {d}: max ({self.max_len}) must be >= min ({self.min_len})")
        if d == "fixed":
            if self.value is None or self.value < 1:
                raise ConfigError(f"length fixed: value must be an integer >= 1, got {self.value}")
            self._check_reaches_range(self.value, self.value, "value")  # min/max would replace the one value
        elif d == "uniform":
            if self.low is None or self.high is None:
                raise ConfigError("length uniform: low and high are required")
            if not 1 <= self.low <= self.high:
                raise ConfigError(
                    f"length uniform: need 1 <= low <= high, got low={self.low} high={self.high}"
                )
            self._check_reaches_range(self.low, self.high, "low..high")
        elif d == "normal":
            if self.mean is None or self.std is None:
                raise ConfigError("length normal: mean and std are required")
            if self.std < 0:
                raise ConfigError(f"length normal: std must be >= 0, got {self.std}")
            self._check_draws_reach(self.mean - 6 * self.std, self.mean + 6 * self.std,
                                    f"mean={self.mean:g} std={self.std:g}", "mean - 6*std", "mean + 6*std")
        elif d == "lognormal":
            by_moments = self.mean is not None or self.std is not None
            by_params = self.mu is not None or self.sigma is not None
            if by_moments == by_params:
                raise ConfigError("length lognormal: give either mean and std, or mu and sigma (not both)")
            if by_moments:
                if self.mean is None or self.std is None:
                    raise ConfigError("length lognormal: mean and std must be given together")
                if self.mean <= 0 or self.std < 0:
                    raise ConfigError(
                        f"length lognormal: need mean > 0 and std >= 0, got mean={self.mean} std={self.std}"
                    )
            else:
                if self.mu is None or self.sigma is None:
                    raise ConfigError("length lognormal: mu and sigma must be given together")
                if self.sigma < 0:
                    raise ConfigError(f"length lognormal: sigma must be >= 0, got {self.sigma}")
            self._check_lognormal_range()
        elif d == "empirical":
            if self.values is None or len(self.values) == 0:
                raise ConfigError(f"length empirical: no values ({self.source or 'values'})")
            arr = np.asarray(self.values)
            if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
                raise ConfigError(
                    f"length empirical: values must be finite numbers ({self.source or 'values'})"
                )
            if np.abs(arr).max() > MAX_LEN:  # would wrap past int64 (or stand for no real request)
                raise ConfigError(f"length empirical: got {float(arr[np.abs(arr).argmax()]):g}; allowed values with "
                                  f"|value| <= {MAX_LEN} ({self.source or 'values'})")
            # Freeze a private copy so a caller's later edit cannot change a "frozen" config.
            arr = np.array(np.rint(arr), dtype=np.int64)
            arr.setflags(write=False)
            object.__setattr__(self, "values", arr)
            where = "" if self.source in (None, "values") else f" of {self.source}"
            self._check_reaches_range(int(arr.min()), int(arr.max()), f"values{where}")

    def _check_reaches_range(self, lo: int, hi: int, what: str) -> None:
        """Refuse lengths (``what``, from lo to hi) that all lie outside [min, max]: every one would be clipped
        to the same bound, a fixed length in disguise (or another length than the fixed one given)."""
        top = self.max_len
        if hi < self.min_len or (top is not None and lo > top):
            bounds = f"min {self.min_len}" if top is None else f"[min, max] = [{self.min_len}, {top}]"
            span = str(lo) if lo == hi else f"[{lo}, {hi}]"
            raise ConfigError(f"length {self.dist}: {what} {span} is outside {bounds}, so every length would be "
                              f"clipped to {self.min_len if hi < self.min_len else top}; allowed: lengths that "
                              "reach it")

    def _check_lognormal_range(self) -> None:
        """Refuse a lognormal whose draws all round below ``min`` (as a normal with mean < 1 is refused):
        every length would be clipped to min, a fixed length in disguise; likewise one whose draws all lie
        past MAX_LEN. "All" is 6 sigma from the median, so a heavy-tailed setting that reaches the range
        now and then still passes."""
        try:
            mu, sigma = self.lognormal_params()
        except (OverflowError, ValueError):
            mu = sigma = math.inf
        given = (f"mean={self.mean:g} std={self.std:g}" if self.mu is None
                 else f"mu={self.mu:g} sigma={self.sigma:g}")
        if not (math.isfinite(mu) and math.isfinite(sigma)):
            raise ConfigError(f"length lognormal: {given} gives no usable distribution (mu={mu:g}, sigma={sigma:g}); "
                              "allowed: std/mean small enough for finite mu and sigma")
        top = mu + 6 * sigma  # log of the length 6 sigma above the median
        if top < math.log(self.min_len - 0.5):
            raise ConfigError(f"length lognormal: {given} puts every draw below {self.min_len - 0.5:g} tokens "
                              f"(median {math.exp(mu):.3g}), so every length would be clipped to min "
                              f"({self.min_len}); allowed: settings where exp(mu + 6*sigma) >= "
                              f"{self.min_len - 0.5:g}")
        if mu - 6 * sigma > math.log(MAX_LEN):
            raise ConfigError(f"length lognormal: {given} puts every draw above {MAX_LEN} tokens (median "
                              f"{math.exp(min(mu, 700)):.3g}); allowed: settings where exp(mu - 6*sigma) <= {MAX_LEN}")
        if self.max_len is not None and mu - 6 * sigma > math.log(self.max_len + 0.5):
            self._check_draws_reach(math.exp(mu - 6 * sigma), math.exp(min(top, 700)), given, "exp(mu - 6*sigma)",
                                    "exp(mu + 6*sigma)")

    def _check_draws_reach(self, lo: float, hi: float, given: str, lo_name: str, hi_name: str) -> None:
        """Refuse a continuous distribution whose draws (from ``lo`` to ``hi``: 6 sigma either side) all round
        below ``min`` or above ``max``: every length would be clipped to that bound, a fixed length in
        disguise (as _check_reaches_range refuses for the discrete ones)."""
        floor, top = self.min_len - 0.5, None if self.max_len is None else self.max_len + 0.5
        if hi < floor:
            raise ConfigError(f"length {self.dist}: {given} puts every draw below {floor:g} tokens, so every length "
                              f"would be clipped to min ({self.min_len}); allowed: settings where {hi_name} >= "
                              f"{floor:g}, or a lower min")
        if top is not None and lo > top:
            raise ConfigError(f"length {self.dist}: {given} puts every draw above {top:g} tokens, so every length "
                              f"would be clipped to max ({self.max_len}); allowed: settings where {lo_name} <= "
                              f"{top:g}, or a higher max")

    def lognormal_params(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal."""
        if self.mu is not None and self.sigma is not None:
            return self.mu, self.sigma
        assert self.mean is not None and self.std is not None
        s2 = math.log1p((self.std / self.mean) ** 2)
        return math.log(self.mean) - s2 / 2, math.sqrt(s2)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` lengths (int64), rounded and clipped to ``[min_len, max_len]``."""
        d = self.dist
        if d == "fixed":
            x = np.full(n, self.value, dtype=np.int64)
        elif d == "uniform":
            x = rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        elif d == "normal":
            x = np.rint(rng.normal(self.mean, self.std, size=n))
        elif d == "lognormal":
            mu, sigma = self.lognormal_params()
            x = np.rint(rng.lognormal(mu, sigma, size=n))
        else:
            assert self.values is not None
            x = self.values[rng.integers(0, len(self.values), size=n)]
        hi = MAX_LEN if self.max_len is None else self.max_len  # a heavy tail past MAX_LEN never wraps int64
        return np.clip(x, self.min_len, hi).astype(np.int64)

    # ---- parsing -------------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: Any, where: str = "length", base_dir: str | Path | None = None) -> LengthDist:
        """Parse ``{"dist": ..., ...}`` or a bare integer (fixed); errors name ``where.key``."""
        if isinstance(cfg, int | np.integer) and not isinstance(cfg, bool):
            cfg = {"dist": "fixed", "value": int(cfg)}
        if not isinstance(cfg, Mapping):
            raise ConfigError(f'{where}: expected a table like {{dist = "fixed", value = 128}}, got {cfg!r}')
        dist = cfg.get("dist")
        if not isinstance(dist, str) or dist not in DISTS:
            raise ConfigError(f"{where}.dist: expected one of {', '.join(DISTS)}, got {dist!r}")
        check_keys(cfg, (*_COMMON, *DISTS[dist]), where)
        kw: dict[str, Any] = {"dist": dist, "min_len": read_int(cfg, "min", where, default=1, lo=1, hi=MAX_LEN)}
        if "max" in cfg:
            kw["max_len"] = read_int(cfg, "max", where, lo=kw["min_len"], hi=MAX_LEN)
        if dist == "fixed":
            kw["value"] = read_int(cfg, "value", where, lo=1, hi=MAX_LEN)
        elif dist == "uniform":
            missing = [k for k in ("low", "high") if k not in cfg]
            if missing:  # min/max look like the range, but they only clip the drawn lengths
                got = [f"{k} = {cfg[k]!r}" for k in ("min", "max") if k in cfg]
                hint = f"; got {', '.join(got)}, which only clip the drawn lengths" if got else ""
                raise ConfigError(f"{where}.{missing[0]}: required: uniform draws from low..high (both inclusive; "
                                  f"min and max are clip bounds){hint}; allowed: {{dist = 'uniform', low = ..., "
                                  "high = ...}")
            kw["low"] = read_int(cfg, "low", where, lo=1, hi=MAX_LEN)
            kw["high"] = read_int(cfg, "high", where, lo=kw["low"], hi=MAX_LEN)
        elif dist == "normal":
            kw["mean"] = read_float(cfg, "mean", where, lo=1.0, hi=MAX_LEN)  # below 1 every draw clips to min
            kw["std"] = read_float(cfg, "std", where, lo=0.0, hi=MAX_LEN)
        elif dist == "lognormal":
            if "mean" in cfg or "std" in cfg:
                if "mu" in cfg or "sigma" in cfg:
                    raise ConfigError(f"{where}: lognormal takes mean/std or mu/sigma, not both")
                kw["mean"] = read_float(cfg, "mean", where, lo=0.0, lo_open=True, hi=MAX_LEN)
                kw["std"] = read_float(cfg, "std", where, lo=0.0, hi=MAX_LEN)
            else:
                kw["mu"] = read_float(cfg, "mu", where, lo=-50.0, hi=50.0)
                kw["sigma"] = read_float(cfg, "sigma", where, lo=0.0, hi=50.0)
        else:
            kw["values"], kw["source"] = _empirical_values(cfg, where, base_dir)
        try:
            return cls(**kw)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


def _empirical_values(
    cfg: Mapping[str, Any], where: str, base_dir: str | Path | None
) -> tuple[np.ndarray, str]:
    if ("values" in cfg) == ("csv" in cfg):
        raise ConfigError(f"{where}: empirical needs exactly one of 'values' (a list) or 'csv' (+ 'column')")
    if "values" in cfg:
        if "column" in cfg:
            raise ConfigError(f"{where}.column: only used with 'csv'")
        vals = cfg["values"]
        if isinstance(vals, str | bytes | Mapping) or not isinstance(vals, Iterable):
            raise ConfigError(f"{where}.values: expected a list of numbers, got {vals!r}")
        vals = list(vals)
        for i, v in enumerate(vals):
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float | np.integer | np.floating)
                or not math.isfinite(v)
            ):
                raise ConfigError(f"{where}.values[{i}]: expected a finite number, got {v!r}")
            if v > MAX_LEN:  # before rint: a Python int past int64 has no rint, a float past it wraps
                raise ConfigError(f"{where}.values[{i}]: got {v!r}; allowed 1 <= value <= {MAX_LEN} tokens")
            # a listed length is meant as given (a CSV column's 0s are clipped to min); v < 0 first: a
            # huge negative int has no rint
            if v < 0 or np.rint(v) < 1:
                raise ConfigError(f"{where}.values[{i}]: expected a length >= 1 token, got {v!r}")
            if not float(v).is_integer():  # a token count (as fixed's value): not rounded without a word
                raise ConfigError(f"{where}.values[{i}]: expected an integer (a token count), got {v!r}")
        return np.asarray(vals, dtype=float), "values"
    if "column" not in cfg:
        raise ConfigError(f"{where}.column: required with 'csv'")
    if not isinstance(cfg["csv"], str | Path) or not str(cfg["csv"]).strip():
        raise ConfigError(f"{where}.csv: expected the path of a CSV file, got {cfg['csv']!r}")
    path = Path(str(cfg["csv"]))
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    column = str(cfg["column"])
    return load_csv_column(path, column, where), f"{path}:{column}"


def load_csv_column(path: str | Path, column: str, where: str = "length") -> np.ndarray:
    """One numeric column of a CSV file as floats (token counts: 0 <= value <= MAX_LEN; a 0 is later
    clipped to min); a missing file/column, a column named twice, a non-number, a negative or a count past
    MAX_LEN, or a file that cannot be read (not UTF-8, a truncated .gz) is a ConfigError."""
    import zlib

    import pandas as pd  # lazy: pandas is slow to import and only this path needs it

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{where}.csv: {path} is a directory; expected a CSV file")
    if not path.is_file():
        raise ConfigError(f"{where}.csv: no such file {path}")
    unreadable = (ValueError, OSError, EOFError, zlib.error)  # UnicodeDecodeError and pandas' errors included

    def cannot_read(e: BaseException) -> ConfigError:
        why = "is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "cannot be read"
        return ConfigError(f"{where}.csv: {path} {why}: {(str(e).splitlines() or [type(e).__name__])[0]}")

    try:
        # the header as written (read_csv's own header renames a second "len" to "len.1")
        header = [str(h) for h in pd.read_csv(path, header=None, nrows=1, dtype=str).iloc[0].tolist()]
    except unreadable as e:
        raise cannot_read(e) from None
    if column not in header:
        raise ConfigError(
            f"{where}.column: {column!r} not in {path} (columns: {', '.join(map(str, header))})"
        )
    if header.count(column) > 1:
        raise ConfigError(f"{where}.column: {column!r} names {header.count(column)} columns of {path}; "
                          "expected exactly one")
    try:
        col = pd.read_csv(path, usecols=[column])[column]
    except unreadable as e:
        raise cannot_read(e) from None
    num = pd.to_numeric(col, errors="coerce")
    vals = num.to_numpy(dtype=float)
    bad = np.flatnonzero(~np.isfinite(vals))
    if len(bad):
        row = int(bad[0])
        raise ConfigError(
            f"{where}: {path} row {row + 2} column {column!r}: not a finite number: {col.iloc[row]!r}"
        )
    out = np.flatnonzero((vals < 0) | (vals > MAX_LEN))
    if len(out):
        row = int(out[0])
        raise ConfigError(f"{where}: {path} row {row + 2} column {column!r}: got {vals[row]:g}; allowed "
                          f"0 <= value <= {MAX_LEN} tokens")
    frac = np.flatnonzero(vals != np.rint(vals))
    if len(frac):  # token counts: a 1.5 is not rounded without a word
        row = int(frac[0])
        raise ConfigError(f"{where}: {path} row {row + 2} column {column!r}: got {vals[row]:g}; allowed integer "
                          "token counts")
    return vals


def clip_to_context(
    prompt_len: np.ndarray, output_len: np.ndarray, max_model_len: int, min_prompt: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit each request into ``max_model_len`` tokens: prompt ≤ max_model_len − 1 (room for one output
    token, and never below ``min_prompt``), then output ≤ max_model_len − prompt. Returns the clipped
    prompt and output lengths and a boolean mask of the rows that changed. An engine would reject such a
    prompt or stop generating at the context limit; clipping keeps the request in the workload instead.
    """
    if max_model_len < min_prompt + 1:
        raise ConfigError(
            f"max_model_len {max_model_len} leaves no room for a {min_prompt}-token prompt and output"
        )
    p = np.minimum(prompt_len, max_model_len - 1)
    o = np.minimum(output_len, max_model_len - p)
    changed = (p != prompt_len) | (o != output_len)
    return p.astype(np.int64), o.astype(np.int64), changed
