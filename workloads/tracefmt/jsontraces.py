"""JSON traces: Mooncake JSONL, vLLM-bench JSONL, ShareGPT JSON, and vLLM's synthetic "random" dataset."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import MAX_REQUESTS
from sim.core.spec import MAX_ARRIVAL_S
from workloads.gen.lengths import MAX_LEN
from workloads.tracefmt.core import (
    Arrivals,
    Columns,
    LoadedTrace,
    TraceOptions,
    check_flag,
    finish,
    option_number,
    show,
    streams,
)
from workloads.tracefmt.rows import (
    READ_ERRORS,
    FieldError,
    RowErrors,
    as_path,
    cannot_read,
    check_file,
    get_int,
    get_int_list,
    get_number,
    is_text,
    iter_json_lines,
    json_error,
    open_text,
)

MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces (data/README.md)
TOKENS_PER_WORD = 1.3  # rough English words→tokens ratio for ShareGPT text when no tokenizer is at hand


def _spread_ties(ms: np.ndarray) -> np.ndarray:
    """Spread requests sharing a timestamp evenly over [t, next distinct t): the k-th of m gets t + k·Δ/m.

    The last group has no next timestamp; it is spread over the median gap between distinct timestamps
    (1 ms, the trace's resolution, when there is only one).
    """
    uniq, counts = np.unique(ms, return_counts=True)
    gaps = np.diff(uniq)
    last = float(np.median(gaps)) if len(gaps) else 1.0
    width = np.append(gaps, last).astype(float)
    order = np.argsort(ms, kind="stable")
    group = np.repeat(np.arange(len(uniq)), counts)  # group of each position in sorted order
    rank = np.arange(len(ms)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = np.empty(len(ms))
    out[order] = uniq[group] + rank * width[group] / counts[group]
    return out


def _time_raw(ms: list[float], t_ms: np.ndarray, i: int) -> str:
    """Row i's time as the file writes it, and where spread_ties moved it (so a time past the clock is
    blamed on the option that put it there, not on the file)."""
    if t_ms[i] == ms[i]:
        return f"{ms[i]:g} ms"
    return f"{ms[i]:g} ms, moved by spread_ties to {t_ms[i]:g} ms (spread_ties = false keeps it)"


def load_mooncake(
    path: str | Path, spread_ties: bool = False, *, skip_bad_rows: bool = False, **options: Any
) -> LoadedTrace:
    """Mooncake trace (kvcache-ai/Mooncake FAST25-release): JSONL ``timestamp`` (ms), ``input_length``,
    ``output_length``, ``hash_ids`` (one id per 512-token prompt block; equal ids = same content, and
    an id stands for its whole prefix).

    Many requests share a millisecond timestamp. They are kept in file order at that time unless
    ``spread_ties``, which spreads each group evenly up to the next distinct timestamp (see
    :func:`_spread_ties`); that smooths the bursts the trace records, so it is off by default.
    Times stay as recorded (the published traces start at 0), converted to seconds.
    """
    path = as_path(path)
    opts = TraceOptions.from_kwargs(options, "mooncake", ("spread_ties", "skip_bad_rows"))
    spread_ties = check_flag("spread_ties", spread_ties)
    errors = RowErrors(path, check_flag("skip_bad_rows", skip_bad_rows))
    check_file(path)
    ms: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hashes: list[tuple[int, ...] | None] = []
    ids: list[str] = []
    lines: list[int] = []
    n = miscount = 0
    for lineno, obj in iter_json_lines(path, errors):
        n += 1
        try:
            t = obj.get("timestamp")
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
                raise FieldError("timestamp", "missing" if t is None else f"{t!r} is not a number >= 0 (ms)")
            p = get_int(obj, "input_length", lo=1)
            o = get_int(obj, "output_length")
            h = get_int_list(obj, "hash_ids")
        except FieldError as e:
            errors.row(lineno, str(e))
            continue
        if h is not None and len(h) != -(-p // MOONCAKE_BLOCK):  # type: ignore[operator]
            miscount += 1  # one id per 512-token block, the last one partial: said below, used as given
        ms.append(float(t))
        prompt.append(p)  # type: ignore[arg-type]
        output.append(o)  # type: ignore[arg-type]
        hashes.append(h)
        ids.append(str(n - 1))
        lines.append(lineno)
    if not ms:
        raise TraceFormatError(f"{path}: no usable rows ({errors.num_skipped} skipped)")
    t_ms = np.asarray(ms)
    notes: list[str] = []
    if spread_ties:
        tied = len(t_ms) - len(np.unique(t_ms))
        t_ms = _spread_ties(t_ms)
        notes.append(f"spread {tied} requests that shared a timestamp over the gap to the next one")
    if miscount:
        notes.append(f"{miscount} rows whose hash_ids count is not one per {MOONCAKE_BLOCK}-token block of "
                     "input_length: their ids are used as given")
    out = np.asarray(output, dtype=np.int64)
    if (out == 0).any():
        notes.append(f"{int((out == 0).sum())} rows with output_length 0 raised to 1 (counted as clipped)")
    cols = Columns(
        fmt="mooncake",
        source=path,
        num_rows=n,
        prompt=np.asarray(prompt, dtype=np.int64),
        output=np.maximum(out, 1),
        times=t_ms / 1000.0,
        fixed=out == 0,
        ids=ids,
        hash_ids=hashes,
        hash_block_size=MOONCAKE_BLOCK,
        num_skipped=errors.num_skipped,
        notes=notes,
        errors=errors.messages,
        lines=np.asarray(lines),
        time_field="timestamp",
        time_raw=lambda i: _time_raw(ms, t_ms, i),
    )
    return finish(cols, opts)


def load_vllm_bench(
    path: str | Path,
    arrival: str = "poisson",
    rate: float | None = None,
    burstiness: float = 1.0,
    tokens_per_word: float = TOKENS_PER_WORD,
    *,
    skip_bad_rows: bool = False,
    **options: Any,
) -> LoadedTrace:
    """Requests as a vLLM benchmark sends them, in one of two files:

    * JSONL (LLMServingSim's workload files): ``input_toks``, ``output_toks``, ``arrival_time_ns``
      (offset from the benchmark start; kept as is), optional ``input_tok_ids`` (→ ``token_ids``, so
      prefix sharing is real). Given ``rate``, the recorded times are replaced by drawn ones.
    * ShareGPT JSON (``vllm bench serve --dataset-name sharegpt``): a list of ``{"conversations":
      [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``. The first human turn is
      the prompt and the first gpt turn after it the output; conversations without such a pair are
      dropped, as vLLM does. No tokenizer is used: lengths are ``round(tokens_per_word × words)``
      (words = whitespace-split), a rough approximation; an entry's own ``prompt_len`` and
      ``output_len`` (pre-tokenized counts) are used instead when present. Needs ``rate``.
    """
    path = as_path(path)
    own = ("arrival", "rate", "burstiness", "tokens_per_word", "skip_bad_rows")
    opts = TraceOptions.from_kwargs(options, "vllm-bench", own)
    skip_bad_rows = check_flag("skip_bad_rows", skip_bad_rows)
    arrivals = Arrivals(arrival, rate, burstiness)  # checked whether or not the file's times make them unused
    per_word = option_number("tokens_per_word", tokens_per_word, f"a finite number > 0 (default {TOKENS_PER_WORD})")
    if not per_word > 0:
        raise ConfigError(f"trace option tokens_per_word: got {show(tokens_per_word)}; allowed a finite number > 0 "
                          f"(default {TOKENS_PER_WORD})")
    check_file(path)
    if _starts_with_bracket(path):
        cols = _sharegpt(path, arrivals, per_word, skip_bad_rows)
    else:
        cols = _bench_jsonl(path, arrivals, skip_bad_rows)
        drawn = [f"{k} = {v!r}" for k, v, d in (("arrival", arrival, "poisson"), ("burstiness", burstiness, 1.0))
                 if v != d]  # fmt: skip
        if drawn and cols.times is not None:  # said, not silently dropped
            cols.notes.append(f"{', '.join(drawn)} not used: the file's recorded arrival_time_ns are kept "
                              "(give rate to draw arrivals instead)")
        if per_word != TOKENS_PER_WORD:
            cols.notes.append(f"tokens_per_word = {per_word:g} not used: it applies to ShareGPT text only")
    return finish(cols, opts)


def _starts_with_bracket(path: Path) -> bool:
    try:
        with open_text(path) as f:
            head = f.read(4096).lstrip()
    except UnicodeDecodeError:
        return False  # not UTF-8 (or a multi-byte character cut at 4096): the row reader names the line
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    return head.startswith("[")


def _bench_jsonl(path: Path, arrivals: Arrivals, skip: bool) -> Columns:
    errors = RowErrors(path, skip)
    times: list[float | None] = []
    prompt: list[int] = []
    output: list[int] = []
    toks: list[tuple[int, ...] | None] = []
    ids: list[str] = []
    lines: list[int] = []
    raw_ns: list[int | None] = []
    unread = False  # an arrival_time (servesim's name, not this format's arrival_time_ns) was seen
    n = 0
    for lineno, obj in iter_json_lines(path, errors):
        n += 1
        try:
            p = get_int(obj, "input_toks", lo=1)
            o = get_int(obj, "output_toks")
            t = get_int(obj, "arrival_time_ns", required=False, hi=None)
            if "arrival_time" in obj:  # not read, but checked: a time is never taken without a look
                get_number(obj, "arrival_time")
                unread = True
            if t is not None and t > 1e300:  # t / 1e9 would overflow a float; far past the clock anyway
                raise FieldError("arrival_time_ns", f"got an integer of {len(str(t))} digits; allowed at most "
                                 f"{MAX_ARRIVAL_S * 1e9:g} ns (the simulated clock's {MAX_ARRIVAL_S:g} s)")
            tid = get_int_list(obj, "input_tok_ids")
            if tid is not None and len(tid) != p:
                raise FieldError("input_tok_ids", f"{len(tid)} ids for input_toks {p}")
            if tid and min(tid) < 0:  # as servesim JSONL's token_ids: a vocabulary index
                raise FieldError("input_tok_ids", f"got {min(tid)}; allowed token ids >= 0")
            if times and (t is None) != (times[0] is None):
                raise FieldError(
                    "arrival_time_ns", "missing" if t is None else "given here but not on the first row"
                )
        except FieldError as e:
            errors.row(lineno, str(e))
            continue
        times.append(None if t is None else t / 1e9)
        prompt.append(p)  # type: ignore[arg-type]
        output.append(o)  # type: ignore[arg-type]
        toks.append(tid)
        ids.append(str(n - 1))
        lines.append(lineno)
        raw_ns.append(t)
    if not prompt:
        raise TraceFormatError(f"{path}: no usable rows ({errors.num_skipped} skipped)")
    notes: list[str] = []
    recorded = times[0] is not None
    if unread and not recorded and arrivals.rate is None:
        raise ConfigError(f"{path}: field 'arrival_time' is not read: vllm-bench JSONL records its send times as "
                          "arrival_time_ns (integer ns from the start); give rate= (requests/s) to draw arrivals, "
                          "or write the times as arrival_time_ns")
    unused = "; field 'arrival_time' not read (vllm-bench JSONL's times are arrival_time_ns)" if unread else ""
    if recorded and arrivals.rate is not None:
        notes.append("recorded arrival_time_ns replaced by drawn arrivals (rate given)" + unused)
    elif unread:
        notes.append(unused[2:] + (": arrival_time_ns used" if recorded else ": replaced by the drawn arrivals"))
    out = np.asarray(output, dtype=np.int64)
    if (out == 0).any():
        notes.append(f"{int((out == 0).sum())} rows with output_toks 0 raised to 1 (counted as clipped)")
    return Columns(
        fmt="vllm-bench",
        source=path,
        num_rows=n,
        prompt=np.asarray(prompt, dtype=np.int64),
        output=np.maximum(out, 1),
        fixed=out == 0,
        times=np.asarray(times, dtype=float) if recorded and arrivals.rate is None else None,
        ids=ids,
        token_ids=toks if any(x is not None for x in toks) else None,
        arrivals=arrivals,
        num_skipped=errors.num_skipped,
        notes=notes,
        errors=errors.messages,
        lines=np.asarray(lines),
        time_field="arrival_time_ns",
        time_raw=lambda i: f"{raw_ns[i]}",
    )


_HUMAN = ("human", "user")
_GPT = ("gpt", "assistant", "chatgpt", "model")


def _words_to_tokens(text: str, per_word: float, what: str) -> int:
    words = len(text.split())
    x = per_word * words + 0.5
    if x >= MAX_LEN + 1:  # checked as a float: past 1e308 it is inf, which has no int
        raise FieldError("conversations", f"{what}: {words} words x tokens_per_word {per_word:g} = "
                         f"{per_word * words:.3g} tokens; allowed at most {MAX_LEN} (lower tokens_per_word)")
    return int(math.floor(x))  # round half up


def _sharegpt(path: Path, arrivals: Arrivals, per_word: float, skip: bool) -> Columns:
    try:
        with open_text(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    except READ_ERRORS as e:
        raise cannot_read(path, e) from None
    except (RecursionError, ValueError) as e:  # nesting past the decoder's stack; an int of > 4300 digits
        raise TraceFormatError(f"{path}: {json_error(e)}") from None
    if not isinstance(data, list):
        raise TraceFormatError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    if not data:
        raise TraceFormatError(f"{path}: empty list")
    _rows_in_a_list(path, data[0])
    errors = RowErrors(path, skip)
    prompt: list[int] = []
    output: list[int] = []
    ids: list[str] = []
    no_pair = not_text = 0
    for i, entry in enumerate(data):
        where = f"entry {i}"
        try:
            if not isinstance(entry, dict):
                raise FieldError("(entry)", f"expected an object, got {type(entry).__name__}")
            if entry.get("prompt_len") is not None or entry.get("output_len") is not None:
                p, o = get_int(entry, "prompt_len"), get_int(entry, "output_len")
            else:
                conv = entry.get("conversations")
                if not isinstance(conv, list):
                    raise FieldError("conversations", "missing" if conv is None else "expected a list")
                pair = _first_pair(conv)
                if pair is None:
                    no_pair += 1
                    continue
                p, o = (_words_to_tokens(x, per_word, w) for x, w in zip(pair, ("prompt", "output"), strict=True))
        except FieldError as e:
            errors.row(where, str(e))
            continue
        prompt.append(p)  # type: ignore[arg-type]
        output.append(o)  # type: ignore[arg-type]
        rid = entry.get("id")
        if isinstance(rid, str) and not is_text(rid):  # "\ud800": valid JSON, no UTF-8 output can hold it
            not_text += 1
            rid = None
        ids.append(rid if isinstance(rid, str) else str(i))
    if not prompt:
        raise TraceFormatError(f"{path}: no conversation with a human turn followed by a gpt turn")
    notes = [f"lengths: pre-tokenized or ≈ {per_word:g} tokens per whitespace word (no tokenizer)"]
    if no_pair:
        notes.append(f"{no_pair} conversations without a human→gpt pair dropped (as vllm bench does)")
    if not_text:
        notes.append(f"{not_text} conversation ids that are not valid Unicode text (a lone surrogate) replaced by "
                     "the entry's position")
    if len(set(ids)) != len(ids):
        ids = [str(i) for i in range(len(ids))]
    p_arr, o_arr = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    fixed = (p_arr == 0) | (o_arr == 0)
    if fixed.any():
        notes.append(f"{int(fixed.sum())} empty turns raised to 1 token (counted as clipped)")
    return Columns(
        fmt="sharegpt",
        source=path,
        num_rows=len(data),
        prompt=np.maximum(p_arr, 1),
        output=np.maximum(o_arr, 1),
        fixed=fixed,
        times=None,
        ids=ids,
        arrivals=arrivals,
        num_skipped=errors.num_skipped,
        notes=notes,
        errors=errors.messages,
    )


# A field a JSONL trace row has and a ShareGPT entry never does -> the format whose rows those are.
_ROW_FIELDS = {"arrival_time": "servesim JSONL", "input_toks": "vllm-bench JSONL", "input_length": "Mooncake JSONL"}


def _rows_in_a_list(path: Path, first: Any) -> None:
    """A JSONL trace's rows wrapped in one JSON list would be read as ShareGPT (the only list format), their
    times dropped: refused, saying what the file is and how it should be written."""
    if not isinstance(first, dict) or "conversations" in first:
        return
    key = next((k for k in _ROW_FIELDS if k in first), None)
    if key is not None:
        kind = _ROW_FIELDS[key]
        raise TraceFormatError(f"{path}: a JSON list of {kind} rows (entry 0 has {key!r}, no 'conversations'); "
                               f"{kind} is one JSON object per line, not a list: write each row on its own line "
                               "(a JSON list is read as ShareGPT conversations)")


def _first_pair(conv: list[Any]) -> tuple[str, str] | None:
    """(first human text, first gpt text after it), or None."""
    human: str | None = None
    for turn in conv:
        if not isinstance(turn, dict):
            raise FieldError("conversations", f"turn {turn!r} is not an object")
        role, text = turn.get("from"), turn.get("value")
        if not isinstance(text, str):
            raise FieldError("conversations", f"turn from {role!r}: value is not a string")
        if human is None and role in _HUMAN:
            human = text
        elif human is not None and role in _GPT:
            return human, text
    return None


def vllm_random(
    num_prompts: int,
    input_len: int = 1024,
    output_len: int = 128,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    *,
    arrival: str = "poisson",
    rate: float | None = None,
    burstiness: float = 1.0,
    **options: Any,
) -> LoadedTrace:
    """vLLM bench's "random" dataset (defaults as ``vllm bench serve``: 1024 in, 128 out, ratio 0).

    Each length is drawn uniformly from ``[floor(L·(1−r)), ceil(L·(1+r))]`` (output at least 1), as
    vLLM's ``RandomDataset`` does with ``range_ratio`` r in [0, 1); the prompt is ``prefix_len`` tokens
    shared by every request (vLLM draws one random prefix) followed by the random part. vLLM also
    subtracts the tokenizer's special tokens from the input length; with no tokenizer that is not done.
    Lengths use the ``seed`` option's "prompt"/"output" streams, arrivals its "arrivals" stream.
    """
    opts = TraceOptions.from_kwargs(options, "random", ())
    checked = []
    for name, v, lo in (
        ("num_prompts", num_prompts, 1),
        ("input_len", input_len, 1),
        ("output_len", output_len, 1),
        ("prefix_len", prefix_len, 0),
    ):
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer) or v < lo:
            raise ConfigError(f"random dataset: {name} must be an integer >= {lo}, got {show(v)}")
        hi = MAX_REQUESTS if name == "num_prompts" else MAX_LEN  # a trace is listed whole: at most MAX_REQUESTS
        if v > hi:
            raise ConfigError(f"random dataset: {name}: got {v}; allowed {lo} <= value <= {hi}")
        checked.append(int(v))
    num_prompts, input_len, output_len, prefix_len = checked
    what = "a number in [0, 1)"
    r = option_number("range_ratio", range_ratio, what)
    if not 0.0 <= r < 1.0:
        raise ConfigError(f"random dataset: range_ratio must be in [0, 1), got {show(range_ratio)}")
    range_ratio = r
    arrivals = Arrivals(arrival, rate, burstiness)
    rngs = streams(opts.seed)
    lo_in, hi_in = math.floor(input_len * (1 - range_ratio)), math.ceil(input_len * (1 + range_ratio))
    lo_out = max(math.floor(output_len * (1 - range_ratio)), 1)
    hi_out = math.ceil(output_len * (1 + range_ratio))
    if hi_in + prefix_len > MAX_LEN or hi_out > MAX_LEN:
        raise ConfigError(f"random dataset: input_len {input_len} + prefix_len {prefix_len} / output_len {output_len} "
                          f"with range_ratio {range_ratio:g} draw up to {max(hi_in + prefix_len, hi_out)} tokens; "
                          f"allowed at most {MAX_LEN}")
    body = rngs["prompt"].integers(lo_in, hi_in + 1, size=num_prompts)
    out = rngs["output"].integers(lo_out, hi_out + 1, size=num_prompts)
    ids = [str(i) for i in range(num_prompts)]
    segs: list[Any] = []
    for rid, b in zip(ids, body, strict=True):
        parts = ((("random-prefix", opts.seed), prefix_len),) if prefix_len else ()
        if b > 0:
            parts = (*parts, (("u", rid), int(b)))
        segs.append(parts)
    prompt = body + prefix_len
    if (prompt < 1).any():
        raise ConfigError("random dataset: input_len and range_ratio give empty prompts; raise input_len")
    cols = Columns(
        fmt="random",
        source=None,
        num_rows=num_prompts,
        prompt=prompt.astype(np.int64),
        output=out.astype(np.int64),
        times=None,
        ids=ids,
        segments=segs if prefix_len else None,
        arrivals=arrivals,
        notes=[f"random: input {lo_in}..{hi_in} (+{prefix_len} shared), output {lo_out}..{hi_out}"],
    )
    return finish(cols, opts)
