"""CSV traces: Azure LLM inference (2023, 2024), BurstGPT, and token-count tables without times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import ConfigError
from workloads.tracefmt.core import Arrivals, Columns, LoadedTrace, TraceOptions, check_flag, finish, show
from workloads.tracefmt.rows import CsvTable, as_path, check_file


def _earliest(tab: CsvTable, rows: np.ndarray, times: np.ndarray) -> str:
    """``time_zero`` of a trace whose times count from its earliest row (``rows``: the kept rows)."""
    return f"the earliest row (line {int(tab.lines[rows[int(np.argmin(times))]])})" if len(rows) else "t = 0"


def _raise_zero(values: np.ndarray, what: str, notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A request needs >= 1 prompt and output token (RequestSpec); raise 0 to 1 and say how often."""
    zero = values == 0
    if zero.any():
        notes.append(f"{int(zero.sum())} rows with {what} 0 raised to 1 (counted as clipped)")
    return np.maximum(values, 1), zero


def load_azure(path: str | Path, *, skip_bad_rows: bool = False, **options: Any) -> LoadedTrace:
    """Azure LLM inference trace, 2023 (Splitwise) or 2024 (DynamoLLM): ``TIMESTAMP, ContextTokens,
    GeneratedTokens``.

    ``TIMESTAMP`` is a wall-clock time: 2023 files have 7 fractional digits and no zone
    ("2023-11-16 18:15:46.6805900", data/README.md), 2024 files a ``+00:00`` offset; both parse to UTC
    at nanosecond resolution. Times become seconds after the earliest row (the first, in the published
    files). A row with 0 generated tokens cannot be simulated (a request produces >= 1 token), so its
    output is raised to 1 and the row counted in ``num_clipped``; the same for 0 context tokens.
    """
    path = as_path(path)
    opts = TraceOptions.from_kwargs(options, "azure", ("skip_bad_rows",))
    skip_bad_rows = check_flag("skip_bad_rows", skip_bad_rows)
    check_file(path)
    tab = CsvTable(path, "azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), skip=skip_bad_rows)
    times = tab.timestamps("TIMESTAMP")
    prompt = tab.ints("ContextTokens")
    output = tab.ints("GeneratedTokens")
    tab.errors.raise_first()
    ok = ~tab.errors.bad
    notes: list[str] = []
    if not ok.all() and ok.any():
        times = times - times[ok].min()  # re-base to the earliest *valid* row
    prompt, zp = _raise_zero(prompt[ok], "ContextTokens", notes)
    output, zo = _raise_zero(output[ok], "GeneratedTokens", notes)
    kept = np.flatnonzero(ok)
    stamps = tab.raw("TIMESTAMP")
    cols = Columns(
        fmt="azure",
        source=path,
        num_rows=tab.n,
        prompt=prompt,
        output=output,
        times=times[ok],
        fixed=zp | zo,
        ids=[str(i) for i in kept],
        num_skipped=tab.errors.num_skipped,
        notes=notes,
        errors=tab.errors.messages,
        lines=tab.lines[kept],
        time_field=tab.columns["TIMESTAMP"],
        time_raw=lambda i: repr(stamps.iat[int(kept[i])]),
        time_zero=_earliest(tab, kept, times[ok]),
    )
    return finish(cols, opts)


def load_burstgpt(
    path: str | Path,
    model: str | None = None,
    include_failed: bool = False,
    *,
    skip_bad_rows: bool = False,
    **options: Any,
) -> LoadedTrace:
    """BurstGPT (HPMLL/BurstGPT): ``Timestamp, Model, Request tokens, Response tokens, Total tokens,
    Log Type`` and, in newer releases, ``Session ID`` (and ``Elapsed time``, unused here).

    ``Timestamp`` is seconds from 0:00 of the first day (BurstGPT README); times become seconds after the
    earliest kept row. Failed requests are logged with ``Response tokens`` 0 (the README's "with fails"
    files): they are excluded by default and counted in ``num_failed``; with ``include_failed`` they stay,
    with output raised to 1 (counted as clipped too). ``model`` keeps rows whose ``Model`` equals it,
    ignoring case (e.g. "ChatGPT", "GPT-4"). ``Session ID`` becomes ``session_id`` when present.
    """
    path = as_path(path)
    opts = TraceOptions.from_kwargs(options, "burstgpt", ("model", "include_failed", "skip_bad_rows"))
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(f"trace option model: expected a model name (a non-empty string, e.g. \"ChatGPT\"), got "
                          f"{show(model)}")
    include_failed = check_flag("include_failed", include_failed)
    skip_bad_rows = check_flag("skip_bad_rows", skip_bad_rows)
    check_file(path)
    tab = CsvTable(
        path,
        "burstgpt",
        ("Timestamp", "Request tokens", "Response tokens"),
        ("Model", "Session ID", "Total tokens"),
        skip=skip_bad_rows,
    )
    stamp = tab.floats("Timestamp", lo=0.0)  # seconds from 0:00 of the first day: never negative
    prompt = tab.ints("Request tokens")
    output = tab.ints("Response tokens")
    tab.errors.raise_first()
    keep = ~tab.errors.bad
    notes: list[str] = []
    if model is not None:
        if not tab.has("Model"):
            raise ConfigError(f"{path}: model={model!r} needs a 'Model' column; this file has none")
        models = tab.raw("Model")
        match = (models.str.lower() == model.lower()).to_numpy()
        if not (match & keep).any():
            found = ", ".join(sorted(set(models[keep]))) or "none"
            raise ConfigError(f"{path}: no rows with Model {model!r}; models in the file: {found}")
        notes.append(f"model {model!r}: {int((match & keep).sum())} of {int(keep.sum())} rows")
        keep &= match
    if tab.has("Total tokens"):  # not used (the two counts are), but a row where it disagrees is said
        total = pd.to_numeric(tab.raw("Total tokens"), errors="coerce").to_numpy(dtype=float)
        off = int((keep & ~np.isnan(total) & ~(total == prompt + output)).sum())  # an empty cell says nothing
        if off:
            notes.append(f"{off} rows whose Total tokens is not Request + Response tokens (those two are used)")
    failed = keep & (output == 0)
    num_failed = int(failed.sum())
    if num_failed:
        verb = "kept with output raised to 1" if include_failed else "excluded"
        notes.append(f"{num_failed} failed rows (Response tokens 0) {verb}")
    if not include_failed:
        keep &= ~failed
    idx = np.flatnonzero(keep)
    times = stamp[idx] - (stamp[idx].min() if len(idx) else 0.0)
    p, zp = _raise_zero(prompt[idx], "Request tokens", notes)
    o = np.maximum(output[idx], 1)
    session = None
    if tab.has("Session ID"):
        raw = tab.raw("Session ID")
        session = [s if s != "" else None for s in raw.iloc[idx]]
    stamps = tab.raw("Timestamp")
    cols = Columns(
        fmt="burstgpt",
        source=path,
        num_rows=tab.n,
        prompt=p,
        output=o,
        times=times,
        fixed=zp | (output[idx] == 0),
        ids=[str(i) for i in idx],
        session=session,
        num_skipped=tab.errors.num_skipped,
        num_failed=num_failed,
        notes=notes,
        errors=tab.errors.messages,
        lines=tab.lines[idx],
        time_field=tab.columns["Timestamp"],
        time_raw=lambda i: repr(stamps.iat[int(idx[i])]),
        time_zero=_earliest(tab, idx, stamp[idx]),
    )
    return finish(cols, opts)


def load_token_counts(
    path: str | Path,
    arrival: str = "poisson",
    rate: float | None = None,
    burstiness: float = 1.0,
    *,
    skip_bad_rows: bool = False,
    **options: Any,
) -> LoadedTrace:
    """(prompt, output) token counts without times, ``num_prefill_tokens, num_decode_tokens`` (the
    ShareGPT / arXiv / BWB "stats" CSVs of sarathi-serve and etalon), replayed with an arrival process.

    Arrivals come from ``workloads.gen.arrivals.make_arrivals(arrival, rate, n, rng, burstiness)`` (vLLM
    bench semantics) with the ``seed`` option's "arrivals" stream, drawn after ``sample``/``limit`` so the
    kept requests arrive at ``rate``. Zero counts are raised to 1 (counted as clipped).
    """
    path = as_path(path)
    own = ("arrival", "rate", "burstiness", "skip_bad_rows")
    opts = TraceOptions.from_kwargs(options, "token-counts", own)
    skip_bad_rows = check_flag("skip_bad_rows", skip_bad_rows)
    arrivals = Arrivals(arrival, rate, burstiness)  # checked before the file is read
    check_file(path)
    tab = CsvTable(path, "token-counts", ("num_prefill_tokens", "num_decode_tokens"), ("arrival_time",),
                   skip=skip_bad_rows)  # fmt: skip
    prompt = tab.ints("num_prefill_tokens")
    output = tab.ints("num_decode_tokens")
    if tab.has("arrival_time"):  # not the format's: checked (never taken without a look), then said unread
        tab.floats("arrival_time", lo=0.0)
    tab.errors.raise_first()
    ok = ~tab.errors.bad
    notes: list[str] = []
    if tab.has("arrival_time"):
        if arrivals.rate is None:
            raise ConfigError(f"{path}: column {tab.columns['arrival_time']!r}: the token-counts format has no "
                              "arrival times, so it is not read; give rate= (requests/s; inf = all at t=0) to "
                              "draw arrivals, or write the trace as servesim JSONL (arrival_time, prompt_len, "
                              "output_len) to keep them")
        notes.append(f"column {tab.columns['arrival_time']!r} not read (the token-counts format has no arrival "
                     "times): replaced by the drawn arrivals")
    p, zp = _raise_zero(prompt[ok], "num_prefill_tokens", notes)
    o, zo = _raise_zero(output[ok], "num_decode_tokens", notes)
    cols = Columns(
        fmt="token-counts",
        source=path,
        num_rows=tab.n,
        prompt=p,
        output=o,
        times=None,
        fixed=zp | zo,
        ids=[str(i) for i in np.flatnonzero(ok)],
        arrivals=arrivals,
        num_skipped=tab.errors.num_skipped,
        notes=notes,
        errors=tab.errors.messages,
    )
    return finish(cols, opts)
