"""The ``servesim`` command line. Every ServesimError becomes one clear line and exit code 2."""

from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

# No collections while the libraries load (pandas, pyarrow, pydantic: ~70 ms of a 0.5 s import went to
# collections that found no garbage); the collector is back as it was before any command runs.
_COLLECTING = gc.isenabled()
gc.disable()
try:
    from sim.app.config import add_override_option
    from sim.app.heap import before_exit
    from sim.cli import intervals as cli_intervals
    from sim.core.errors import run_command
finally:
    if _COLLECTING:
        gc.enable()


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate one configuration (TOML)")
    p.add_argument("config", help="path to a TOML config")
    add_override_option(p, "override a config value (repeatable), e.g. --set engine.max_num_seqs=64")
    p.add_argument(
        "--out", help="directory for requests.parquet, steps.parquet, summary.json, timeseries.csv, report.html"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--steps-jsonl", action="store_true",
                   help="with --out: also steps.jsonl, one line of counts per step (steps.parquet holds the same "
                        "counts; off by default: ~4.6 KB of text per request on the quickstart)")
    p.add_argument("--step-trace", action="store_true",
                   help="with --out: steps.jsonl lists each step's scheduled requests ([id, tokens]) instead of "
                        "its counts (records every step's rows: slower and larger)")
    p.add_argument("--goodput", action="extend", nargs="+", default=[], metavar="NAME:MS",
                   help="per-request SLOs as vllm bench serve --goodput takes them, e.g. ttft:1000 tpot:50 (ms); "
                        "sets [slo] ttft_ms / tpot_ms / itl_ms / e2el_ms")
    from sim.cli.catalog import add_vllm_option
    from sim.cli.outpath import add_plotlyjs_option
    from sim.cli.prices import add_price_options
    from sim.cli.progress import add_quiet_option

    add_vllm_option(p)
    add_quiet_option(p)
    add_price_options(p)
    cli_intervals.add_options(p)
    add_plotlyjs_option(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sim.app.config import load_config, override_key
    from sim.app.outputs import write_outputs
    from sim.app.results import slo_from_goodput_args, summarize
    from sim.app.simulate import simulate
    from sim.cli import cluster as cli_cluster
    from sim.cli.catalog import vllm_overrides
    from sim.cli.outpath import check_out_dir, check_steps_jsonl_flags, steps_jsonl_wanted
    from sim.cli.prices import price_overrides
    from sim.core.errors import ConfigError

    if args.intervals:  # replications + calibration residuals -> prediction intervals (sim/cli/intervals.py)
        unused = [flag for flag in ("--goodput", "--gpu-hour", "--gpu-hour-usd", "--usd-rate", "--currency", "--price-set",
                                    "--plotlyjs")
                  if getattr(args, flag[2:].replace("-", "_"), None)]  # fmt: skip
        if unused:  # the intervals table has latencies and throughputs only: these would be dropped
            raise ConfigError(f"{', '.join(unused)}: not with --intervals (it prints a table: no goodput, cost or "
                              "page); allowed: run without --intervals for them")
        args.overrides = [*vllm_overrides(args), *args.overrides]  # the engine the vLLM flags describe
        if cli_cluster.runs_as_cluster(args.config, args.overrides):
            raise ConfigError(f"--intervals with {args.config}: it holds [cluster], [[replica]], [[stream]] or "
                              "[variants] (or --set names one), and intervals replicate one engine; allowed: a "
                              "single-engine config, or run without --intervals")
        return cli_intervals.run(args)

    if args.replications is not None:  # a flag that would do nothing is refused, not ignored
        raise ConfigError(f"--replications {args.replications}: only with --intervals")
    if args.level is not None:
        raise ConfigError(f"--level {args.level:g}: only with --intervals")
    check_out_dir(args.out)  # before any simulation, so a bad --out does not waste the run
    check_steps_jsonl_flags(args)
    slos = slo_from_goodput_args(args.goodput)
    for o in args.overrides:  # --goodput is --set slo.K=V by another name: both for one K, one would be lost
        key = override_key(o)
        if key.startswith("slo.") and key[4:] in slos:
            raise ConfigError(f"--goodput and --set {o!r} both set slo.{key[4:]}; allowed: one of them")
    goodput = [f"slo.{k}={v!r}" for k, v in slos.items()]
    # vLLM flags first, so --set and the [cost] / [slo] options win over them
    args.overrides = [*vllm_overrides(args), *args.overrides, *price_overrides(args), *goodput]
    # [cluster] / [[replica]] configs, in the file or by --set cluster.*: several engines
    if cli_cluster.runs_as_cluster(args.config, args.overrides):
        return cli_cluster.run(args)
    cfg = load_config(args.config, args.overrides)
    from sim.cli.outpath import check_step_trace_setting

    check_step_trace_setting(cfg.simulation.record_step_trace, args)  # as --step-trace without --out
    from sim.app.setup import profile_notes

    for note in profile_notes([cfg]):  # another card's profile: run as asked, and said
        print(f"servesim: note: {note}", file=sys.stderr)
    from sim.cli.prices import check_prices_used

    check_prices_used(args, [cfg.hardware.gpu])
    if args.out and args.step_trace and not cfg.simulation.record_step_trace:
        cfg = replace(cfg, simulation=replace(cfg.simulation, record_step_trace=True))
    from sim.cli.progress import show_progress

    result = simulate(cfg, progress=show_progress(args))
    summary = summarize(result, slo=cfg.slo or None)
    if args.out:
        files = write_outputs(result, Path(args.out), summary=summary, plotlyjs=args.plotlyjs,
                              step_trace=steps_jsonl_wanted(args, cfg.simulation.record_step_trace))
        if not args.json:
            print(f"wrote {', '.join(str(f) for f in files.values())}")
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        from sim.app.simulate import format_summary

        print(format_summary(summary, result))
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the seed scenario: a 7B model on a 24 GB card, concurrency 4 to 32")
    p.add_argument("--out", default="out/demo", help="directory for the HTML report and tables")
    p.add_argument("--quick", action="store_true", help="fewer requests (for tests)")
    from sim.cli.outpath import add_plotlyjs_option

    add_plotlyjs_option(p)
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from sim.app.demo import run_demo
    from sim.cli.outpath import check_out_dir

    check_out_dir(args.out)
    run_demo(Path(args.out), quick=args.quick, plotlyjs=args.plotlyjs)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servesim")
    except PackageNotFoundError:  # pragma: no cover - a checkout that was never installed
        return "0+unknown"


_SEEN = "_servesim_given"  # the namespace's record of the single-value options given (_StoreOnce)


class _StoreOnce(argparse._StoreAction):
    """argparse's store, except that an option given twice with different values is an error: argparse
    keeps the last (``--out a --out b`` wrote only b), which would silently replace the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault(_SEEN, {})
        if option_string is not None and self.dest in given and given[self.dest] != values:
            parser.error(f"argument {option_string}: given twice ({given[self.dest]!r} and {values!r}); allowed: "
                         "one value")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong and where to look), exit code 2, like
    every other bad input; ``--help`` still prints the whole usage. A single-value option given twice
    with different values is refused (``_StoreOnce``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        # '-inf', '-1e5', '-nan' are values, not options (argparse knew only -1 and -1.5): --usable-gib -inf
        # is then refused naming the value, not with "expected one argument"
        self._negative_number_matcher = re.compile(
            r"^-(?:\d+\.?\d*(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?|inf(?:inity)?|nan)$", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="servesim", description=__doc__)
    parser.add_argument("--version", action="version", version=f"servesim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_demo(sub)
    from sim.cli import calibrate as cli_calibrate
    from sim.cli import catalog as cli_catalog
    from sim.cli import cluster as cli_cluster
    from sim.cli import compare as cli_compare
    from sim.cli import plan as cli_plan
    from sim.cli import schema as cli_schema
    from sim.cli import size as cli_size
    from sim.cli import sweep as cli_sweep

    cli_cluster.add_parser(sub)
    cli_calibrate.add_parsers(sub)
    cli_compare.add_parser(sub)

    cli_size.add_parser(sub)
    cli_sweep.add_parser(sub)

    cli_plan.add_parser(sub)
    sub.choices["plan"].set_defaults(func=cli_plan.run)
    cli_catalog.add_parsers(sub)
    cli_schema.add_parser(sub)
    try:
        from sim.cli import trace as cli_trace
    except ImportError:  # pragma: no cover - optional until the trace loaders land
        cli_trace = None
    if cli_trace is not None:
        cli_trace.add_parser(sub)
        sub.choices["trace"].set_defaults(func=cli_trace.run)
    return parser


def _glue_vllm_args(argv: Sequence[str]) -> list[str]:
    """``--vllm-args -tp=2`` as ``--vllm-args=-tp=2``: argparse takes a value that starts with '-' for a flag
    of its own (and says "expected one argument"), but --vllm-args' value is vLLM's flags."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--vllm-args":
            nxt = next(it, None)
            if nxt is not None and nxt.startswith("-"):
                out.append(f"--vllm-args={nxt}")
                continue
            out.append(a)
            if nxt is not None:
                out.append(nxt)
            continue
        out.append(a)
    return out


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the subcommand ``args`` were parsed by (``servesim trace stats`` -> its parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _innermost(chosen, args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(_glue_vllm_args(sys.argv[1:] if argv is None else argv))
    if extra:  # said by the subcommand that got them, so its --help is the one named
        _innermost(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    vars(args).pop(_SEEN, None)
    func = getattr(args, "func", None)
    if func is None:  # subcommands registered by other modules dispatch through `run`
        raise SystemExit(parser.print_help() or 2)
    def checked(a: argparse.Namespace) -> int | None:
        if getattr(a, "overrides", None):  # before any subcommand reads them
            from sim.app.config import check_set_repeats

            check_set_repeats(a.overrides)
        return func(a)

    try:
        rc = run_command(checked, args)
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's final flush
        return rc
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except BrokenPipeError:  # `servesim run --json | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not complain
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe
    except OSError as exc:  # a full disk or a failing device under what it prints (`servesim models > /dev/full`)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is left unwritten goes nowhere, not into a second error
        print(f"servesim: error: cannot write the output ({exc.strerror})", file=sys.stderr)
        return 1


def entry() -> int:
    """The ``servesim`` console command: ``main`` for a process that ends with it (sim/app/heap.py
    before_exit); a caller that runs ``main`` in-process keeps its heap as it was."""
    rc = main()
    before_exit()
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
