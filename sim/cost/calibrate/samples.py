"""The one table every microbenchmark source is turned into, so the fitter reads a single format.

A *sample* is one timed operator call on one GPU: ``op`` says which term of the cost model it measures,
the shape columns say what it computed (per GPU, i.e. after tensor-parallel splitting), ``time_s`` how long
it took. Columns that do not apply to an op are NaN. The same table, written as CSV with a ``meta.json``
beside it, is what ``servesim calibrate`` produces (``samples.csv``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.core.errors import TraceFormatError

# Operators and the cost-model term each one calibrates (sim/cost/costmodel.py).
OPS: dict[str, str] = {
    "gemm": "linear layers and LM head: smooth roofline (eta_compute, eta_bandwidth, roofline_p, t0_gemm_s)",
    "attn_decode": "decode attention per layer (attn_t0_s, eta_kv, attn_per_seq_s, attn_ctx_pad_tokens)",
    "attn_prefill": "prefill attention per layer (eta_fa, prefill_kv_floor, prefill_kv_sat_tokens)",
    "attn_mixed": "one prefill chunk plus decodes in one kernel (mixed_decode_gqa_reread)",
    "elementwise_layer": "norms, RoPE, SiLU·mul of one layer (eta_elementwise, layer_fixed_s)",
    "elementwise_step": "embedding + final norm, once per step (eta_elementwise, step_elementwise_fixed_s)",
    "sampler": "sampler vs sequences (sampler_t0_s, sampler_bytes_per_elem)",
    "copy": "device memory copy (diagnostic: achievable bandwidth)",
    "allreduce": "tensor-parallel all-reduce (allreduce_latency_s, allreduce_bw_eff)",
    "step_overhead": "CPU cost of one scheduling step (step_overhead_s, per_seq_overhead_s)",
}

# Shape columns (all per GPU). m: tokens (GEMM rows, elementwise tokens) or sequences (sampler, overhead).
SHAPE_COLUMNS = (
    "m",
    "k",
    "n",
    "n_decode",
    "kv_decode",
    "chunk",
    "kv_prefill",
    "nh",
    "nkv",
    "hd",
    "hidden",
    "inter",
    "vocab",
    "nbytes",
    "tp",
    "w_bytes",
    "a_bytes",
    "kv_bytes",
)
COLUMNS = ("op", "name", "file", "time_s", *SHAPE_COLUMNS)

# Upper bounds of the shape columns: a real kernel's dimensions, with room to spare, so that a typo (1e20 rows)
# is refused rather than fitted, and no product of shapes overflows a float (1e300 made the fit's residuals
# infinite). Counts (tokens, sequences, context, heads, widths, vocabulary): the 1e9 bound on every token count
# (workloads/gen/lengths.py MAX_LEN); real profiles reach 131,072 tokens of context and a 152,064 vocabulary.
MAX_COUNT = 1e9
MAX_NBYTES = 1e13  # a copied or all-reduced buffer lives in one GPU's memory (at most a few hundred GB)
MAX_TP = 1024  # GPUs in one all-reduce: far past the 72 of the largest NVLink domain
MAX_ELEM_BYTES = 8.0  # bytes per element: fp4 0.5 ... fp64 8
_PER_ELEMENT = ("w_bytes", "a_bytes", "kv_bytes")  # > 0 where given: a 0-byte element moves nothing
_UPPER = {c: MAX_COUNT for c in SHAPE_COLUMNS} | {"nbytes": MAX_NBYTES, "tp": MAX_TP} | dict.fromkeys(_PER_ELEMENT, MAX_ELEM_BYTES)

# Shape columns each operator's model (sim/cost/calibrate/opmodel.py) reads as the size of the kernel, with no
# default that means anything: without one (read as 0) or at 0 a sample measures nothing the model describes (a
# 0x0x0 GEMM, an all-reduce on no GPUs), and fitting it bends the group's terms. Each must be given and > 0.
# Optional: kv_prefill (0: no earlier context), kv_decode of a decode (checked >= 0), step_overhead's m (0
# sequences: the bare loop), the byte widths (default 2). allreduce's tp is also an integer >= 2 (below).
REQUIRED: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "k", "n"),
    "attn_decode": ("n_decode", "nh", "nkv", "hd"),
    "attn_prefill": ("chunk", "nh", "nkv", "hd"),
    "attn_mixed": ("n_decode", "chunk", "nh", "nkv", "hd"),
    "elementwise_layer": ("m", "hidden", "inter", "nh", "nkv", "hd"),
    "elementwise_step": ("m", "hidden"),
    "sampler": ("m", "vocab"),
    "copy": ("nbytes",),
    "allreduce": ("nbytes", "tp"),
}


def make_frame(rows: Iterable[dict[str, Any]] | pd.DataFrame, file: str = "", source: str = "") -> pd.DataFrame:
    """Rows (dicts or a frame with a subset of COLUMNS) -> a frame with exactly COLUMNS, checked. ``file``: the
    label of rows without one; ``source``: the path the messages name (default ``file``)."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = "" if c in ("name", "file") else np.nan
    df = df[list(COLUMNS)].copy()
    for c in ("name", "file"):
        df[c] = ["" if v is None or (isinstance(v, float) and v != v) else str(v) for v in df[c]]
    if file:
        df["file"] = [f or file for f in df["file"]]
    raw = {c: df[c].copy() for c in ("time_s", *SHAPE_COLUMNS)}  # as given, for the messages

    def where(i: int) -> str:  # the file a message names: the path read, else the row's own label
        name = source or file or df["file"].iloc[i]
        return f"{name}: " if name else ""

    for c in ("time_s", *SHAPE_COLUMNS):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    bad_op = ~df["op"].isin(list(OPS))
    if bad_op.any():
        i = int(np.flatnonzero(bad_op.to_numpy())[0])
        raise TraceFormatError(f"{where(i)}sample row {i}: op {_given(df['op'], i)}; allowed: one of {', '.join(OPS)}")
    t = df["time_s"].to_numpy()
    bad = ~(np.isfinite(t) & (t > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceFormatError(f"{where(i)}sample row {i} ({df['op'].iloc[i]}): time_s {_given(raw['time_s'], i)}; "
                               "allowed: a number of seconds > 0")
    for c in SHAPE_COLUMNS:  # a shape is a count: empty where the operator has none, else a number >= 0
        v = df[c].to_numpy()
        text = raw[c].to_numpy()
        given = np.array([not _blank(x) for x in text], dtype=bool)
        per_elem = c in _PER_ELEMENT
        with np.errstate(invalid="ignore"):
            bad = given & ~(np.isfinite(v) & ((v > 0) if per_elem else (v >= 0)) & (v <= _UPPER[c]))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceFormatError(f"{where(i)}sample row {i} ({df['op'].iloc[i]}): {c} {_given(raw[c], i)}; allowed: "
                                   f"a number {'>' if per_elem else '>='} 0 and <= {_UPPER[c]:g}, or empty where the "
                                   "operator has no such dimension")
    _check_required(df, where)
    return df.reset_index(drop=True)


def _check_required(df: pd.DataFrame, where: Callable[[int], str]) -> None:
    """Every row has the sizes its operator's model needs (REQUIRED), > 0; an all-reduce's tp is a GPU count >= 2."""
    ops = df["op"].to_numpy()
    for op, cols in REQUIRED.items():
        sel = ops == op
        if not sel.any():
            continue
        for c in cols:
            v = df[c].to_numpy()
            bad = sel & ~(v > 0)  # NaN (missing) and 0 alike
            if op == "allreduce" and c == "tp":
                bad |= sel & ~((v >= 2) & (v == np.round(v)))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                got = "missing" if np.isnan(v[i]) else f"{v[i]:g}"
                need = ("an integer >= 2 (GPUs in the all-reduce)" if (op, c) == ("allreduce", "tp") else
                        f"a number > 0 ({op} samples need {', '.join(cols)})")
                raise TraceFormatError(f"{where(i)}sample row {i} ({op}): {c} {got}; allowed: {need}")


_NA_TEXT = frozenset({"", "nan", "na", "n/a", "<na>", "none", "null", "-"})  # what a table says for "no value"


def _blank(x: Any) -> bool:
    """No value in a shape column: missing, a NaN of any kind, or text that says so."""
    if isinstance(x, str):
        return x.strip().lower() in _NA_TEXT
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _given(col: pd.Series, i: int) -> str:
    """Row ``i``'s value as the file gave it (text as text, numbers as numbers, not numpy's repr)."""
    x = col.iloc[i]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and float(f"{x:g}") == x:  # short where exact: 1e+14, not 100000000000000.0
        return f"{x:g}"
    return f"{x!r}"


@dataclass
class Microbench:
    """Samples measured on one GPU, with where they came from."""

    gpu: str  # catalogue name when known, else what the source called it
    samples: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)  # versions, device, source files, notes

    def select(self, ops: Iterable[str] | None) -> Microbench:
        if ops is None:
            return self
        ops = list(ops)
        for op in ops:
            if op not in OPS:
                raise TraceFormatError(f"unknown operator {op!r}; known: {', '.join(OPS)}")
        return Microbench(self.gpu, self.samples[self.samples.op.isin(ops)].reset_index(drop=True), self.meta)

    def save(self, directory: str | Path) -> Path:
        """Write ``samples.csv`` and ``meta.json`` into ``directory`` (created)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.samples.to_csv(d / "samples.csv", index=False)
        (d / "meta.json").write_text(json.dumps({"gpu": self.gpu, **self.meta}, indent=2, default=str) + "\n")
        return d / "samples.csv"


def merge(benches: Iterable[Microbench]) -> Microbench:
    """Concatenate sources measured on the same GPU; metadata is kept per source file."""
    bl = list(benches)
    if not bl:
        raise TraceFormatError("no microbenchmark data to merge")
    gpus = sorted({b.gpu for b in bl})
    if len(gpus) > 1:
        raise TraceFormatError(f"microbenchmarks from different GPUs cannot be fitted together: {gpus}")
    frames = [b.samples for b in bl if len(b.samples)]
    samples = pd.concat(frames, ignore_index=True) if frames else make_frame([])
    meta = {"sources": [b.meta for b in bl]}
    return Microbench(gpus[0], samples, meta)


def load_samples_csv(path: str | Path) -> Microbench:
    """A ``samples.csv`` written by ``servesim calibrate`` (``meta.json`` beside it, optional)."""
    p = Path(path)
    text = read_text(p)
    check_widths(p, text)
    try:
        df = pd.read_csv(io.StringIO(text), index_col=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise TraceFormatError(f"{p}: cannot read samples CSV ({str(e).strip()})") from None
    missing = [c for c in ("op", "time_s") if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{p}: missing column(s) {missing}")
    meta: dict[str, Any] = {}
    mp = p.parent / "meta.json"
    if mp.is_file():
        try:
            meta = json.loads(read_text(mp, "JSON"))
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{mp}: invalid JSON ({e})") from None
        if not isinstance(meta, dict):
            raise TraceFormatError(f"{mp}: expected a JSON object (gpu, versions, ...), got a {type(meta).__name__}")
    gpu = str(meta.pop("gpu", "unknown"))
    meta.setdefault("format", "servesim-samples")
    meta["path"] = str(p)
    return Microbench(gpu, make_frame(df, file=p.name, source=str(p)), meta)  # rows without a file label get the file name


def not_utf8(path: Path, data: bytes, start: int, kind: str = "CSV") -> TraceFormatError:
    """The one-line refusal of a file that is not UTF-8 text (``start``: the offset of the first bad byte)."""
    why = f"byte {data[start]:#04x} at offset {start}" if start < len(data) else f"a character cut at offset {start}"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        why = "it starts with a UTF-16 byte-order mark, as Excel's 'Unicode Text' export writes"
    hint = " (Excel: save as 'CSV UTF-8')" if kind == "CSV" else ""
    return TraceFormatError(f"{path}: not UTF-8 text ({why}); allowed: a UTF-8 {kind} file{hint}")


def read_text(path: Path, kind: str = "CSV") -> str:
    """A file's text; bytes that are not UTF-8 are refused naming the file (a UTF-8 byte-order mark is dropped),
    as the trace loaders do, instead of a UnicodeDecodeError from deep inside pandas."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise not_utf8(path, data, e.start, kind) from None


def check_widths(path: Path, text: str) -> None:
    """No row has more fields than the header: pandas would shift the row (its first fields read as the index)
    and report a wrong column. Empty trailing fields (a comma at the end of each line) are not fields."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, [])
        i = 0
        for row in reader:
            if not row:
                continue  # a blank line is no row (pandas skips it too)
            found = len(row)
            while found > len(header) and not row[found - 1].strip():
                found -= 1
            if found > len(header):
                raise TraceFormatError(f"{path}:{reader.line_num}: sample row {i}: expected {len(header)} fields "
                                       f"(the header's), found {found}")
            i += 1
    except csv.Error as e:
        raise TraceFormatError(f"{path}:{reader.line_num}: cannot read CSV ({e})") from None
