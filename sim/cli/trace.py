"""``servesim trace stats FILE``: load a request trace with the shared options and summarise it.

Errors (a bad row, a missing column, an option that does not fit the format) propagate as
ServesimError; the main CLI prints them as one line.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sim.app.config import BLOCK_SIZES
from sim.core.errors import ConfigError
from workloads.tracefmt import FORMATS, LoadedTrace, load_trace, trace_stats
from workloads.tracefmt.core import MAX_RATE_SCALE, option_number, option_seed, seed_unused

# CLI flag (dest) → load_trace keyword; passed only when given, so each format sees only what applies.
_OPTION_DESTS = (
    "start",
    "end",
    "time_scale",
    "rate_scale",
    "sample",
    "seed",
    "limit",
    "max_prompt_len",
    "max_output_len",
    "max_model_len",
    "model",
    "arrival",
    "rate",
    "burstiness",
)
_FLAG_DESTS = ("skip_bad_rows", "include_failed", "spread_ties")


def _sample(text: str) -> float | int:
    """'0.1' is a fraction, '100' a count (as the loaders' ``sample`` option)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.1) or a count (100), got {text!r}"
        ) from None


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trace`` (with its ``stats`` subcommand) on the main CLI's subparsers."""
    trace = subparsers.add_parser(
        "trace", help="inspect request traces", description="Inspect request traces."
    )
    sub = trace.add_subparsers(dest="trace_command", metavar="{stats}")
    sub.required = True
    p = sub.add_parser("stats", help="load a trace and summarise it", description=__doc__)
    p.add_argument(
        "file",
        help="trace file (Azure/BurstGPT/token-count CSV, Mooncake/vLLM-bench/servesim JSONL, ShareGPT JSON)",
    )
    p.add_argument("--format", default="auto", help=f"auto (sniff) or one of: {', '.join(FORMATS)}")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--skip-bad-rows", action="store_true", help="drop malformed rows and count them")
    g = p.add_argument_group("shared options")
    g.add_argument("--start", type=float, help="window start, seconds from the trace start")
    g.add_argument("--end", type=float, help="window end (exclusive), seconds from the trace start")
    g.add_argument("--time-scale", type=float, help="multiply times (0.5 = twice as fast)")
    g.add_argument("--rate-scale", type=float, help="multiply the rate (= time scale 1/x)")
    g.add_argument("--sample", type=_sample, help="keep a fraction (0.1) or a count (100) of requests")
    g.add_argument("--seed", type=int, help="seed for --sample and drawn arrivals (default 0)")
    g.add_argument("--limit", type=int, help="keep the first N requests")
    g.add_argument("--max-prompt-len", type=int, help="clip prompts to this many tokens")
    g.add_argument("--max-output-len", type=int, help="clip outputs to this many tokens")
    g.add_argument("--max-model-len", type=int, help="fit prompt + output into this context")
    f = p.add_argument_group("format options")
    f.add_argument("--model", help="BurstGPT: keep rows of this Model (e.g. ChatGPT, GPT-4)")
    f.add_argument(
        "--include-failed", action="store_true", help="BurstGPT: keep failed rows (0 response tokens)"
    )
    f.add_argument("--spread-ties", action="store_true", help="Mooncake: spread requests sharing a timestamp")
    f.add_argument("--arrival", help="files without times: poisson, gamma or constant (default poisson)")
    f.add_argument("--rate", type=float, help="files without times: requests/s (inf = all at t=0)")
    f.add_argument("--burstiness", type=float, help="gamma arrivals: shape (1 = Poisson)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size for the prefix-sharing numbers")
    p.set_defaults(func=run)
    return trace


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts = {d: getattr(args, d) for d in _OPTION_DESTS if getattr(args, d, None) is not None}
    opts.update({d: True for d in _FLAG_DESTS if getattr(args, d, False)})
    return opts


def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_table(stats: dict[str, Any], trace: LoadedTrace) -> str:
    s = stats
    lines = [
        f"trace      {s['source']}  ({s['format']})",
        f"rows       {s['num_rows']} in file, {s['count']} loaded; skipped {s['num_skipped']}, "
        f"clipped {s['num_clipped']}, failed {s['num_failed']}",
        f"arrivals   duration {_num(s['duration_s'])} s, mean rate {_num(s['mean_rate_rps'], 3)} req/s, "
        f"inter-arrival CV {_num(s['interarrival_cv'], 3)} (gamma shape {_num(s['gamma_shape'], 3)})",
        "",
        f"{'tokens':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name in ("prompt_len", "output_len"):
        cells = "".join(f"{_num(s[f'{name}_{k}']):>10}" for k in ("mean", "p50", "p90", "p99", "max"))
        lines.append(f"{name.split('_')[0]:<10}{cells}")
    lines += [
        "",
        f"prefix     identity {_pct(s['has_prefix_identity_frac'])} of requests, shared with an earlier one "
        f"{_pct(s['prefix_shared_frac'])}, ideal hit ratio {_pct(s['ideal_prefix_hit_ratio'])} "
        f"(block {s['prefix_block_size']})",
    ]
    for note in trace.notes:
        lines.append(f"note       {note}")
    for err in trace.errors:
        lines.append(f"skipped    {err}")
    return "\n".join(lines)


MAX_BLOCK = 1 << 16  # tokens in a block for trace stats' prefix numbers


def _check_flags(args: argparse.Namespace) -> None:
    """What the loaders leave open but the numbers here need: a block size for the prefix-sharing numbers (any
    positive size: a Mooncake trace's hash blocks are 512 tokens, vLLM's backends take multiples of 16 up to
    1024), and the time_scale bound for --rate-scale (TraceOptions leaves rate_scale open for the sizing
    search; a user's flag gets the bound its inverse has)."""
    if not 1 <= args.block_size <= MAX_BLOCK:
        raise ConfigError(f"--block-size: block_size got {args.block_size}; allowed 1 to {MAX_BLOCK} tokens (the engine's "
                          f"are {', '.join(map(str, BLOCK_SIZES))})")
    if args.rate_scale is not None and option_number("rate_scale", args.rate_scale) > MAX_RATE_SCALE:
        raise ConfigError(f"trace option rate_scale: got {args.rate_scale:g}; allowed rate_scale <= {MAX_RATE_SCALE:g} "
                          f"(as time_scale >= {1 / MAX_RATE_SCALE:g})")


def run(args: argparse.Namespace) -> int:
    """Load, summarise, print (a table, or JSON with ``--json``); 0 on success."""
    _check_flags(args)
    trace = load_trace(args.file, format=args.format, **_options(args))
    if args.seed is not None and seed_unused(trace.notes, option_seed("seed", args.seed)):
        raise ConfigError(f"--seed {args.seed}: nothing is drawn at random here (no --sample, and the file "
                          "records its arrival times); allowed: --seed with --sample, or a file without times")
    stats = trace_stats(trace, block_size=args.block_size)
    if args.json:
        print(json.dumps({**stats, "notes": list(trace.notes), "errors": list(trace.errors)}, indent=2))
    else:
        print(format_table(stats, trace))
    return 0
