"""The loaded-trace type and the options every trace format shares, applied in one place.

Every loader parses its file into :class:`Columns` (file order, lengths as arrays) and hands them to
:func:`finish`, which applies, in this order:

1. sort by arrival (stable: equal times keep file order);
2. ``start``/``end``: keep arrivals in ``[start, end)`` seconds of the trace as loaded, then subtract
   ``start`` so the window begins at t = 0 (a gap before the first kept request is kept: it is real);
3. ``sample``: a float in (0, 1] keeps ``round(f·n)`` rows, an int keeps that many (at most n), chosen
   uniformly without replacement from the seed's "sample" stream, arrival order kept;
4. ``limit``: the first N remaining;
5. formats without times (token-count CSVs, ShareGPT) draw arrivals now, for the rows kept, so sampling
   does not thin the requested rate; the window then applies to the drawn times;
6. ``time_scale`` multiplies every time (0.5 = twice as fast); ``rate_scale`` k is ``time_scale`` 1/k;
7. ``max_prompt_len``/``max_output_len`` cap each length; ``max_model_len`` fits prompt + output
   into the context as :func:`workloads.gen.lengths.clip_to_context` does (prompt ≤ L−1, then
   output ≤ L−prompt). Literal token ids, hash ids and segments are cut to the new prompt length.

Requests whose hash ids start the same then share their block hashes (sim.core.hash_prefixes).

``num_clipped`` counts the kept requests whose lengths differ from the file's: the caps above, plus
lengths a loader had to raise to 1 (a 0-token output in Azure, a failed BurstGPT row kept on request).

Every token count a loader reads is at most ``workloads.gen.lengths.MAX_LEN`` (a row past it is a bad
row), and every arrival, after the options, at most ``sim.core.spec.MAX_ARRIVAL_S``: one past it is
refused naming its cause, the file's line (its own time) or the option (``time_scale``, ``rate_scale``,
``rate``) that put it there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError, TraceFormatError
from sim.core.fields import int_digits
from sim.core.hash_prefixes import share_hash_id_prefixes
from sim.core.request import RequestSpec, Segment
from sim.core.spec import MAX_ARRIVAL_S
from workloads.gen.arrivals import ARRIVAL_KINDS, check_burstiness, check_rate, check_span
from workloads.gen.lengths import MAX_LEN, clip_to_context
from workloads.tracefmt.jsonl import LoadedTrace as _JsonlTrace


@dataclass(frozen=True)
class LoadedTrace(_JsonlTrace):
    """Specs sorted by arrival plus what loading did; a drop-in for ``workloads.tracefmt.jsonl.LoadedTrace``.

    ``num_rows``: data rows in the file; ``num_skipped``: malformed rows dropped (``skip_bad_rows``);
    ``num_failed``: BurstGPT failures (0 response tokens) seen; ``num_clipped``: see module doc.
    ``cuts``: ``(option, value, requests it changed)`` for each of ``max_prompt_len``, ``max_output_len``,
    ``max_model_len`` given, so a caller can name what cut them (a run names the engine's max_model_len).
    """

    source: Path | None = None
    format: str = ""
    num_rows: int = 0
    num_failed: int = 0
    notes: tuple[str, ...] = ()
    cuts: tuple[tuple[str, int, int], ...] = ()


def show(v: Any) -> str:
    """A value as one short line (the repr of a numpy array or a DataFrame spans several)."""
    text = " ".join(repr(v).split()) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def option_number(name: str, v: Any, what: str = "a finite number") -> float:
    """A numeric trace option as a float: an int, a float or a numpy scalar (not a bool, a string or an
    int too large for a float); NaN and infinities are refused too. ``what``: what is allowed, for the message."""
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
        raise ConfigError(f"trace option {name}: expected {what}, got {show(v)}")
    try:
        f = float(v)
    except OverflowError:  # an int beyond ~1.8e308 (a TOML integer of 400 digits)
        raise ConfigError(f"trace option {name}: got an integer of {int_digits(int(v))} digits; allowed {what}") from None
    if not math.isfinite(f):
        raise ConfigError(f"trace option {name}: expected {what}, got {show(v)}")
    return f


def option_int(name: str, v: Any, lo: int) -> int:
    """An integer trace option >= ``lo``: an int, a numpy integer or an integral float (``5.0``), as the
    JSONL rows and ``[workload] num_requests`` take them; not a bool."""
    if isinstance(v, float | np.floating) and not isinstance(v, np.bool_) and float(v).is_integer():
        v = int(v)
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer) or v < lo:
        raise ConfigError(f"trace option {name}: expected an integer >= {lo}, got {show(v)}")
    return int(v)


def option_seed(name: str, v: Any) -> int:
    """A seed: an integer >= 0 (numpy's SeedSequence takes non-negative integers only), a numpy integer
    too; not a bool, a float or a string."""
    if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
        raise ConfigError(f"trace option {name}: expected an integer, got {show(v)}")
    if v < 0:
        raise ConfigError(f"trace option {name}: got {v}; allowed an integer >= 0")
    return int(v)


# A million times faster at most (time_scale >= 1 / MAX_RATE_SCALE): past that a recorded gap falls below the
# clock's resolution. TraceOptions bounds time_scale by it; rate_scale only where a user gives it (the trace
# stats flag): the sizing search replays a trace at rate_scale 1e12, its offline point (sim/app/sizing.py).
MAX_RATE_SCALE = 1e6


def seed_unused(notes: tuple[str, ...] | list[str], seed: int) -> bool:
    """True when nothing in a loaded trace was drawn from ``seed``: every draw it makes (``sample``, drawn or
    redrawn arrivals) says so in a note ending "seed N)"."""
    return not any(f"seed {seed})" in n for n in notes)


@dataclass(frozen=True)
class TraceOptions:
    """The options every loader accepts (see the module doc for what each does and in which order)."""

    start: float | None = None
    end: float | None = None
    time_scale: float | None = None
    rate_scale: float | None = None
    sample: float | int | None = None
    seed: int = 0
    max_prompt_len: int | None = None
    max_output_len: int | None = None
    max_model_len: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end", "time_scale", "rate_scale"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, option_number(name, v))
        if self.start is not None and self.start < 0:
            raise ConfigError(f"trace option start: must be >= 0 seconds, got {self.start}")
        if self.end is not None and self.end <= (self.start or 0.0):
            raise ConfigError(f"trace option end: must be > start ({self.start or 0.0}), got {self.end}")
        if self.time_scale is not None and self.rate_scale is not None:
            raise ConfigError(
                "trace options: give time_scale or rate_scale, not both (rate_scale k = time_scale 1/k)"
            )
        for name in ("time_scale", "rate_scale"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"trace option {name}: must be > 0, got {v}")
        # time_scale: a million times faster at most, past that a recorded gap falls below the clock's resolution
        # (1e-300 made every gap 0, and the trace's CV 0); slower is bounded by the last arrival (finish).
        # rate_scale is not bounded here: a sizing search raises it far (sim/app/sizing.py)
        if self.time_scale is not None and self.time_scale < 1 / MAX_RATE_SCALE:
            raise ConfigError(f"trace option time_scale: got {self.time_scale:g}; allowed time_scale >= "
                              f"{1 / MAX_RATE_SCALE:g}")
        if self.rate_scale is not None and math.isinf(self.scale):  # 1 / rate_scale overflows
            raise ConfigError(f"trace option rate_scale: got {self.rate_scale!r}; allowed a rate_scale whose inverse "
                              "(the time scale) is a finite number")
        s = self.sample
        if s is not None:
            if isinstance(s, np.integer | np.floating) and not isinstance(s, np.bool_):  # numpy scalars as numbers
                s = s.item()
                object.__setattr__(self, "sample", s)
            if isinstance(s, bool) or not isinstance(s, int | float):
                raise ConfigError(f"trace option sample: expected a fraction or a count, got {show(s)}")
            if isinstance(s, float) and not 0.0 < s <= 1.0:
                raise ConfigError(
                    f"trace option sample: a fraction must be in (0, 1] (an int is a count), got {s}"
                )
            if isinstance(s, int) and s < 1:
                raise ConfigError(f"trace option sample: a count must be >= 1, got {s}")
        object.__setattr__(self, "seed", option_seed("seed", self.seed))
        for name, lo in (("max_prompt_len", 1), ("max_output_len", 1), ("max_model_len", 2), ("limit", 1)):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, option_int(name, v, lo))

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], fmt: str, own: tuple[str, ...] = ()) -> TraceOptions:
        """Options from keyword arguments; an unknown name is a ConfigError listing the valid ones."""
        names = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in names:
                valid = ", ".join(sorted((*names, *own)))
                raise ConfigError(f"trace option {key!r} does not apply to format {fmt!r}; valid: {valid}")
        return cls(**kwargs)

    @property
    def scale(self) -> float:
        if self.rate_scale is not None:
            return 1.0 / self.rate_scale
        return 1.0 if self.time_scale is None else float(self.time_scale)


def check_flag(name: str, value: Any) -> bool:
    """A loader's true/false option (``skip_bad_rows``, ``spread_ties``, ``include_failed``): a real bool,
    not any truthy value (the string "no" would otherwise switch it on)."""
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"trace option {name}: expected true or false, got {value!r}")
    return bool(value)


@dataclass(frozen=True)
class Arrivals:
    """An arrival process for traces without times; drawn by workloads.gen.arrivals.make_arrivals."""

    kind: str = "poisson"
    rate: float | None = None
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        """Checked when a loader is called (before the file is read), whether or not the file's own times
        make them unused: an option is never taken without a look."""
        if not isinstance(self.kind, str) or self.kind not in ARRIVAL_KINDS:
            raise ConfigError(f"trace option arrival: expected one of {', '.join(ARRIVAL_KINDS)}, got {show(self.kind)}")
        if self.rate is not None:
            object.__setattr__(self, "rate", check_rate(self.rate, "trace option rate"))
        b = check_burstiness(self.burstiness, "trace option burstiness")
        if b != 1.0 and self.kind != "gamma":
            raise ConfigError(f"trace option burstiness: {b:g} only applies to arrival = 'gamma', not "
                              f"{self.kind!r}; allowed: burstiness = 1 or arrival = 'gamma'")
        object.__setattr__(self, "burstiness", b)

    def draw(self, n: int, rng: np.random.Generator, fmt: str) -> np.ndarray:
        if self.rate is None:
            raise ConfigError(
                f"format {fmt!r} has no arrival times: give rate= (requests/s; inf = all at t=0) "
                f"and optionally arrival= (poisson, gamma, constant)"
            )
        from workloads.gen.arrivals import make_arrivals  # lazy: only formats without times need it

        times = np.asarray(make_arrivals(self.kind, self.rate, n, rng, self.burstiness), dtype=float)
        if times.shape != (n,):
            raise ConfigError(f"arrival process {self.kind!r} returned {times.shape} times for {n} requests")
        return times


@dataclass
class Columns:
    """Parsed rows in file order, before the shared options. Per-row lists are None when unused."""

    fmt: str
    source: Path | None
    num_rows: int
    prompt: np.ndarray
    output: np.ndarray
    times: np.ndarray | None  # seconds; None = draw from ``arrivals`` after selection
    fixed: np.ndarray | None = None  # rows whose lengths the loader raised (count as clipped)
    ids: list[str] | None = None
    session: list[str | None] | None = None
    token_ids: list[tuple[int, ...] | None] | None = None
    hash_ids: list[tuple[int, ...] | None] | None = None
    hash_block_size: int = 512
    segments: list[tuple[Segment, ...] | None] | None = None
    templates: list[RequestSpec] | None = None  # generic JSONL: priority, output_key etc. copied
    arrivals: Arrivals | None = None
    num_skipped: int = 0
    num_failed: int = 0
    notes: list[str] = field(default_factory=list)
    errors: tuple[str, ...] = ()
    # where each row's time came from, to name it when it lands beyond the clock (MAX_ARRIVAL_S)
    lines: np.ndarray | None = None  # file line of each row
    time_field: str = ""  # the column or field the times are read from
    time_raw: Callable[[int], str] | None = None  # row i's time as the file writes it
    time_zero: str = "t = 0"  # what the loaded times count from


def streams(seed: int) -> dict[str, np.random.Generator]:
    """Independent generators for the option pipeline and synthetic datasets, all from one seed."""
    names = ("sample", "arrivals", "prompt", "output")
    seeds = np.random.SeedSequence(seed).spawn(len(names))
    return {n: np.random.default_rng(s) for n, s in zip(names, seeds, strict=True)}


def finish(cols: Columns, opts: TraceOptions) -> LoadedTrace:
    """Apply the shared options to parsed rows and build the specs (see the module doc for the order)."""
    rngs = streams(opts.seed)
    notes = list(cols.notes)
    n = len(cols.prompt)
    start = 0.0 if opts.start is None else float(opts.start)
    end = math.inf if opts.end is None else float(opts.end)
    windowed = opts.start is not None or opts.end is not None

    def window(order: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = (t >= start) & (t < end)
        if windowed:
            notes.append(f"window [{start:g}, {end:g}) s kept {int(keep.sum())} of {len(t)} requests")
        return order[keep], t[keep] - start

    order = np.arange(n)
    t: np.ndarray | None = None
    if cols.times is not None:
        order = np.argsort(cols.times, kind="stable")
        late = int((np.diff(cols.times) < 0).sum())
        if late:  # said, not silently reordered: the file may be a concatenation or mislabelled
            notes.append(f"{late} rows come before the row above them in time: requests sorted by arrival")
        order, t = window(order, cols.times[order])
    sel = np.arange(len(order))
    if opts.sample is not None:
        k = round(opts.sample * len(sel)) if isinstance(opts.sample, float) else min(opts.sample, len(sel))
        sel = np.sort(rngs["sample"].choice(len(sel), size=k, replace=False))
        notes.append(f"sampled {k} of {len(order)} requests (seed {opts.seed})")
    if opts.limit is not None:
        sel = sel[: opts.limit]
    order = order[sel]
    if t is None:
        if cols.arrivals is None:
            raise TraceFormatError(f"{cols.source}: format {cols.fmt!r} gave no arrival times")
        if not windowed:  # the last drawn arrival is at n / rate (vLLM's rescale; constant gaps alike)
            _check_rate_span(cols.arrivals.rate, len(order))
        t = cols.arrivals.draw(len(order), rngs["arrivals"], cols.fmt)
        a = cols.arrivals
        notes.append(
            f"arrivals drawn: {a.kind} at {a.rate:g} req/s (burstiness {a.burstiness:g}, seed {opts.seed})"
        )
        order, t = window(order, t)
    else:
        t = t[sel]
    if len(t) and not float(t.max()) * opts.scale <= MAX_ARRIVAL_S:  # (Python floats: no overflow warning)
        _beyond_the_clock(cols, opts, order, t)
    if opts.scale != 1.0:
        t = t * opts.scale
        notes.append(f"times scaled by {opts.scale:g}")

    prompt, output = cols.prompt[order], cols.output[order]
    p, o = prompt.copy(), output.copy()
    cuts: list[tuple[str, int, int]] = []  # what each cap changed, for a caller to name it (LoadedTrace.cuts)
    # every length is <= MAX_LEN, so a cap past it changes nothing (and would not fit numpy's int64)
    if opts.max_prompt_len is not None:
        p = np.minimum(p, min(opts.max_prompt_len, MAX_LEN))
        cuts.append(("max_prompt_len", opts.max_prompt_len, int((p != prompt).sum())))
    if opts.max_output_len is not None:
        o = np.minimum(o, min(opts.max_output_len, MAX_LEN))
        cuts.append(("max_output_len", opts.max_output_len, int((o != output).sum())))
    if opts.max_model_len is not None:
        p, o, fit = clip_to_context(p, o, min(opts.max_model_len, 2 * MAX_LEN + 1))
        cuts.append(("max_model_len", opts.max_model_len, int(fit.sum())))
    changed = (p != prompt) | (o != output)
    if cols.fixed is not None:
        changed |= cols.fixed[order]

    specs = [
        _spec(cols, int(i), float(ti), int(pi), int(oi)) for i, ti, pi, oi in zip(order, t, p, o, strict=True)
    ]
    if not specs:  # an empty file is refused when read; this is a window, a sample or skipped rows
        why = "; ".join([*notes, f"{cols.num_skipped} bad rows skipped" if cols.num_skipped else ""]).strip("; ")
        raise TraceFormatError(f"{cols.source}: no requests left of {cols.num_rows} rows"
                               + (f" ({why})" if why else "") + "; expected at least one")
    specs = share_hash_id_prefixes(specs)  # each distinct KV block of the trace hashed once (no result changes)
    return LoadedTrace(
        specs=specs,
        num_skipped=cols.num_skipped,
        num_clipped=int(changed.sum()),
        errors=cols.errors,
        source=cols.source,
        format=cols.fmt,
        num_rows=cols.num_rows,
        num_failed=cols.num_failed,
        notes=tuple(notes),
        cuts=tuple(cuts),
    )


def _check_rate_span(rate: Any, n: int) -> None:
    """Refuse a ``rate`` whose ``n`` drawn arrivals end past the clock, before drawing them (a subnormal
    rate would draw inf/NaN times and numpy warnings). A rate that is no positive number is left to
    the arrival process, which names it."""
    if not isinstance(rate, bool) and isinstance(rate, int | float) and rate > 0:
        check_span(n, rate, "trace option rate")


def _beyond_the_clock(cols: Columns, opts: TraceOptions, order: np.ndarray, t_trace: np.ndarray) -> None:
    """Raise for an arrival past MAX_ARRIVAL_S once scaled, naming what put it there: ``time_scale`` or
    ``rate_scale`` when the trace's own times fit, else the row (file and line) whose time is that far,
    or the ``rate`` that drew it. ``t_trace``: the kept times, before the scale."""
    last = float(t_trace.max())
    if last <= MAX_ARRIVAL_S:  # the scale did it
        if opts.rate_scale is not None:
            name, value, allowed = "rate_scale", opts.rate_scale, f"rate_scale >= {last / MAX_ARRIVAL_S:.3g}"
        else:
            name, value, allowed = "time_scale", opts.time_scale, f"time_scale <= {MAX_ARRIVAL_S / last:.3g}"
        raise ConfigError(f"trace option {name}: {value:g} moves the trace's last arrival from {last:.6g} s to "
                          f"{last * opts.scale:.3g} s, beyond the simulated clock's {MAX_ARRIVAL_S:g} s; allowed: "
                          f"{allowed}")
    j = int(np.argmax(t_trace))
    if cols.times is None:  # drawn arrivals (a window kept the check before drawing from running)
        a = cols.arrivals
        rate = a.rate if a is not None else None
        raise ConfigError(f"trace option rate: {rate!r} req/s draws an arrival at {float(t_trace[j]):.3g} s, beyond "
                          f"the simulated clock's {MAX_ARRIVAL_S:g} s; allowed: a higher rate")
    row = int(order[j])
    where = f"{cols.source}:{int(cols.lines[row])}" if cols.lines is not None else f"{cols.source}: row {row}"
    fld = f"field {cols.time_field!r}: " if cols.time_field else ""
    raw = f"got {cols.time_raw(row)}, " if cols.time_raw is not None else ""
    raise TraceFormatError(f"{where}: {fld}{raw}an arrival {float(t_trace[j]):.6g} s after {cols.time_zero}, beyond "
                           f"the simulated clock's {MAX_ARRIVAL_S:g} s; allowed: arrivals within {MAX_ARRIVAL_S:g} s "
                           "of it (or start=/end= to cut a window)")


def _spec(cols: Columns, i: int, t: float, p: int, o: int) -> RequestSpec:
    if cols.templates is not None:
        tpl = cols.templates[i]
        kw: dict[str, Any] = {
            f: getattr(tpl, f) for f in ("request_id", "priority", "session_id", "output_key")
        }
        token_ids, hash_ids, hbs, segments = tpl.token_ids, tpl.hash_ids, tpl.hash_block_size, tpl.segments
    else:
        kw = {
            "request_id": cols.ids[i] if cols.ids is not None else str(i),
            "session_id": cols.session[i] if cols.session is not None else None,
        }
        token_ids = cols.token_ids[i] if cols.token_ids is not None else None
        hash_ids = cols.hash_ids[i] if cols.hash_ids is not None else None
        segments = cols.segments[i] if cols.segments is not None else None
        hbs = cols.hash_block_size
    if token_ids is not None and len(token_ids) != p:
        token_ids = token_ids[:p]
    if hash_ids is not None and len(hash_ids) > -(-p // hbs):
        hash_ids = hash_ids[: -(-p // hbs)]  # keep the ids that still cover a prompt token
    if segments is not None and sum(n for _, n in segments) != p:
        segments = cut_segments(segments, p)
    return RequestSpec(
        arrival_time=t,
        prompt_len=p,
        output_len=o,
        token_ids=token_ids,
        hash_ids=hash_ids,
        hash_block_size=hbs,
        segments=segments,
        **kw,
    )


def cut_segments(segments: tuple[tuple[Hashable, int], ...], n: int) -> tuple[tuple[Hashable, int], ...]:
    """The first ``n`` tokens of a segment list."""
    out: list[tuple[Hashable, int]] = []
    left = n
    for key, length in segments:
        if left <= 0:
            break
        out.append((key, min(length, left)))
        left -= length
    return tuple(out)
