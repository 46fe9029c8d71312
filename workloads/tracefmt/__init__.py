"""Real request traces → RequestSpecs: Azure LLM inference (2023/2024), BurstGPT, Mooncake, token-count
CSVs, vLLM-bench JSONL / ShareGPT JSON, ``vllm bench serve --save-detailed`` result JSON, vLLM's "random"
dataset, and servesim's own JSONL.

Every loader returns a :class:`LoadedTrace` (specs sorted by arrival, plus counts of what loading did)
and accepts the same shared options (``start``/``end``, ``time_scale`` or ``rate_scale``, ``sample``
with ``seed``, ``max_prompt_len``/``max_output_len``/``max_model_len``, ``limit``), applied in one place
(:mod:`workloads.tracefmt.core`). A malformed row raises TraceFormatError ``file:line: column: why``
(header = line 1); ``skip_bad_rows=True`` drops such rows and counts them in ``num_skipped``.

``load_trace(path)`` picks the format from the file name's extension and its header or first row.

Modules: ``core`` (the loaded-trace type and the shared options), ``rows`` (CSV/JSONL reading with exact
``file:line: field`` errors), ``csvtraces`` (Azure, BurstGPT, token-count CSVs), ``jsontraces`` (Mooncake,
vLLM-bench JSONL, ShareGPT JSON, vLLM's "random" dataset), ``benchresult`` (a ``vllm bench serve`` result),
``jsonl`` (servesim's own JSONL), ``stats``.
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError, UnknownNameError
from workloads.tracefmt.benchresult import is_bench_result, load_bench_result
from workloads.tracefmt.core import Arrivals, Columns, LoadedTrace, TraceOptions, check_flag, finish, show
from workloads.tracefmt.csvtraces import load_azure, load_burstgpt, load_token_counts
from workloads.tracefmt.jsontraces import load_mooncake, load_vllm_bench, vllm_random
from workloads.tracefmt.rows import (
    READ_ERRORS,
    as_path,
    cannot_read,
    check_file,
    json_error,
    norm_col,
    open_text,
)
from workloads.tracefmt.stats import trace_stats

__all__ = [
    "FORMATS",
    "Arrivals",
    "LoadedTrace",
    "TraceOptions",
    "load_azure",
    "load_bench_result",
    "load_burstgpt",
    "load_mooncake",
    "load_servesim_jsonl",
    "load_token_counts",
    "load_trace",
    "load_vllm_bench",
    "sniff_format",
    "trace_stats",
    "vllm_random",
]


def load_servesim_jsonl(path: str | Path, *, skip_bad_rows: bool = False, **options: Any) -> LoadedTrace:
    """servesim's own JSONL (``arrival_time``, ``prompt_len``, ...), read by workloads.tracefmt.jsonl.load_jsonl;
    the shared options are applied on top, every other field (ids, priority, content) kept as is."""
    path = as_path(path)
    opts = TraceOptions.from_kwargs(options, "jsonl", ("skip_bad_rows",))
    skip_bad_rows = check_flag("skip_bad_rows", skip_bad_rows)
    check_file(path)
    load_jsonl = importlib.import_module("workloads.tracefmt.jsonl").load_jsonl  # lazy: another module's format
    kw = (
        {"skip_bad_rows": skip_bad_rows}
        if "skip_bad_rows" in inspect.signature(load_jsonl).parameters
        else {}
    )
    loaded = load_jsonl(path, **kw)
    specs = list(getattr(loaded, "specs", loaded))
    num_skipped = int(getattr(loaded, "num_skipped", 0))
    cols = Columns(
        fmt="jsonl",
        source=path,
        num_rows=len(specs) + num_skipped,
        prompt=np.array([s.prompt_len for s in specs], dtype=np.int64),
        output=np.array([s.output_len for s in specs], dtype=np.int64),
        times=np.array([s.arrival_time for s in specs], dtype=float),
        templates=specs,
        num_skipped=num_skipped,
        errors=tuple(getattr(loaded, "errors", ())),
    )
    late = int(getattr(loaded, "num_late", 0))
    if late:  # the loader sorted them: said, as for the CSV formats (core.finish)
        cols.notes.append(f"{late} rows come before the row above them in time: requests sorted by arrival")
    return finish(cols, opts)


FORMATS: dict[str, Callable[..., LoadedTrace]] = {
    "azure": load_azure,
    "burstgpt": load_burstgpt,
    "mooncake": load_mooncake,
    "token-counts": load_token_counts,
    "vllm-bench": load_vllm_bench,
    "vllm-bench-result": load_bench_result,  # vllm bench serve --save-result --save-detailed
    "sharegpt": load_vllm_bench,  # the same loader reads the ShareGPT JSON list
    "jsonl": load_servesim_jsonl,
}
_ALIASES = {
    "servesim": "jsonl",
    "sharegpt-stats": "token-counts",
    "tokens": "token-counts",
    "bench": "vllm-bench",
    "vllm-bench-serve": "vllm-bench-result",
}


def _first_line(path: Path) -> str:
    try:
        with open_text(path) as f:
            for line in f:
                if line.strip():
                    return line.strip()
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    raise TraceFormatError(f"{path}: empty file")


def _whole_json_keys(path: Path) -> set[str] | None:
    """The keys of a pretty-printed JSON object (its first line alone does not parse)."""
    try:
        with open_text(path) as f:
            obj = json.load(f)
    except (ValueError, RecursionError, *READ_ERRORS):  # JSONDecodeError is a ValueError
        return None
    return set(obj) if isinstance(obj, dict) else None


def sniff_format(path: str | Path) -> str:
    """The format name of a trace file, from its extension and its header (CSV) or first object (JSON)."""
    path = as_path(path)
    check_file(path)
    name = path.name.lower().removesuffix(".gz")
    head = _first_line(path)
    if head.startswith("["):  # a JSON list: ShareGPT conversations
        return "sharegpt"
    if head.startswith("{"):
        try:
            keys = set(json.loads(head))
        except (json.JSONDecodeError, TypeError):
            keys = _whole_json_keys(path) if name.endswith(".json") else None
            if keys is None:
                raise TraceFormatError(
                    f"{path}:1: first line is not a JSON object; give format= explicitly"
                ) from None
        except (RecursionError, ValueError) as e:  # nesting past the decoder's stack; an int of > 4300 digits
            raise TraceFormatError(f"{path}:1: {json_error(e)}") from None
        if is_bench_result(keys):  # a vllm bench serve result (one object, usually on one line)
            return "vllm-bench-result"
        # servesim's own rows first: they may carry hash_ids too (Mooncake style), but never its timestamp
        if "arrival_time" in keys and ("prompt_len" in keys or "token_ids" in keys):
            return "jsonl"
        if "hash_ids" in keys or {"timestamp", "input_length"} <= keys:
            return "mooncake"
        if "input_toks" in keys:
            return "vllm-bench"
        if "arrival_time" in keys:  # servesim's own, missing its lengths
            missing = [k for k in ("prompt_len", "output_len") if k not in keys]
            raise TraceFormatError(f"{path}:1: servesim JSONL row without {' and '.join(missing)} (prompt_len or "
                                   f"token_ids, and output_len, are required); keys found: {', '.join(sorted(keys))}")
        raise TraceFormatError(f"{path}:1: unrecognised JSON trace; keys found: {', '.join(sorted(keys))}; "
                               "expected servesim JSONL (arrival_time, prompt_len, output_len), Mooncake (timestamp, "
                               "input_length, output_length) or vllm-bench (input_toks), or give the format")
    if name.endswith((".json", ".jsonl")):
        raise TraceFormatError(f"{path}:1: does not start with a JSON object or list: {head[:80]!r}")
    cols = {norm_col(c) for c in next(csv.reader([head]))}
    if {"timestamp", "contexttokens", "generatedtokens"} <= cols:
        return "azure"
    if {"requesttokens", "responsetokens"} <= cols:
        return "burstgpt"
    if {"numprefilltokens", "numdecodetokens"} <= cols:
        return "token-counts"
    raise TraceFormatError(
        f"{path}:1: unrecognised trace header {head[:200]!r}; give format= one of {', '.join(FORMATS)}"
    )


def load_trace(path: str | Path, format: str = "auto", **options: Any) -> LoadedTrace:
    """Load ``path`` as ``format`` (a name in FORMATS, or "auto" to sniff it). ``options``: the shared
    options plus the chosen loader's own (e.g. ``model`` for BurstGPT, ``rate`` for token counts); one
    that does not apply to the format is a ConfigError."""
    if not isinstance(format, str):
        raise ConfigError(f"trace option format: expected a format name (a string), got {show(format)}; known: "
                          f"auto, {', '.join(FORMATS)}")
    path = as_path(path)
    fmt = format.strip().lower()
    fmt = _ALIASES.get(fmt, fmt)
    if fmt == "auto":
        fmt = sniff_format(path)
    if fmt not in FORMATS:
        raise UnknownNameError(f"unknown trace format {format!r}; known: auto, {', '.join(FORMATS)}")
    return FORMATS[fmt](path, **options)
