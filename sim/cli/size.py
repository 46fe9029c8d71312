"""`servesim size`: the max_num_seqs (and other engine settings) that sustain the most load under SLOs.

    servesim size CONFIG.toml --slo p99_ttft:1000 p99_tpot:50 [--max-num-seqs 8,16,32,64]
                  [--vary engine.kv_cache_dtype=auto,fp8] [--replications 3] [--jobs N] [--json] [--out DIR]
    servesim size CONFIG.toml --goal knee [--knee-gain 0.1]          # the knee of the max_num_seqs curve
    servesim size CONFIG.toml --gpus "RTX 4090,A100 40GB" --target-concurrency 20 [--dtypes fp16,int8]
                  [--kv-dtypes auto,fp8] [--tp 1,2] [--instances-per-gpu 1,2]   # which card, how many, cost

Every SLO is in milliseconds, as ``vllm bench serve --goodput ttft:1000 tpot:50`` takes it: percentile
SLOs ``p99_ttft:1000`` (``p<q>_`` + ttft, tpot, itl, e2el or queue_time; any q; ``[slo] p99_ttft_ms``) and
per-request SLOs ``ttft:1000`` (``[slo] ttft_ms``), judged by the fraction of requests that meet them
(``--min-attainment``). ``--goal throughput`` ranks the settings by offline (all-at-once)
throughput instead: the offline-batch question. See sim/app/sizing.py for the search.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sim.app.config import add_override_option, override_key
from sim.cli.outpath import check_out_dir, check_plotlyjs
from sim.core.errors import ConfigError
from sim.core.fields import check_range


def parse_slo_args(items: list[str], overrides: list[str] | None = None) -> dict[str, float]:
    """``["p99_ttft:1000", "tpot:50"]`` (vLLM's NAME:MS) -> ``{"p99_ttft_ms": 1000.0, "tpot_ms": 50.0}``,
    validated by sim.app.results (the old ``ttft_p99=1.0`` seconds spelling fails naming the new one).
    ``--slo`` replaces the config's whole [slo], so a ``--set slo.K=V`` among ``overrides`` would be lost:
    refused."""
    from sim.app.results import slo_from_args

    for o in overrides or ():
        if override_key(o).startswith("slo."):
            raise ConfigError(f"--slo and --set {o!r}: --slo replaces the config's [slo], so the --set would be "
                              "unused; allowed: put every SLO in --slo, or use --set slo.K=V without --slo")
    return slo_from_args(items, flag="--slo", percentiles=True)


def add_slo_option(p: argparse.ArgumentParser, what: str) -> None:
    """``--slo NAME:MS [NAME:MS ...]`` (repeatable), in vLLM's ``--goodput`` syntax."""
    p.add_argument("--slo", action="extend", nargs="+", default=[], metavar="NAME:MS",
                   help=f"{what}: per request ttft:1000, tpot:50 (ms, as vllm bench --goodput) or percentile "
                        "p99_ttft:1000 (ms); repeatable")  # fmt: skip


def _int_list(text: str) -> list[int]:
    items = text.split(",")
    if text.strip() and any(not v.strip() for v in items):  # '4,' or '4,,8': as --grid and --vary refuse
        raise argparse.ArgumentTypeError(f"{text!r}: empty value; allowed: integers separated by commas, e.g. 8,16")
    try:
        vals = [int(v) for v in items if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    if len(set(vals)) < len(vals):  # a repeated candidate would be searched twice and shown as two
        raise argparse.ArgumentTypeError(f"a value given twice in {text!r}; allowed: distinct integers")
    return vals


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``size`` on the main CLI's subparsers (sets ``func``)."""
    p = subparsers.add_parser(
        "size",
        help="find the max_num_seqs / engine settings with the most capacity under latency SLOs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="path to a TOML config (its [slo] is used when no --slo is given)")
    add_slo_option(p, "the SLOs (default: the config's [slo])")
    add_override_option(p, "override a config value (repeatable)")
    p.add_argument(
        "--max-num-seqs",
        type=_int_list,
        metavar="N,N,...",
        help="candidates (default: powers of two up to twice the KV concurrency)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="SECTION.KEY=V1,V2",
        help="also search an engine setting (repeatable), e.g. engine.max_num_batched_tokens=512,2048",
    )
    p.add_argument(
        "--goal",
        choices=("slo", "throughput", "knee"),
        default="slo",
        help="slo: most load meeting the SLOs; throughput: most offline throughput; knee: the smallest "
        "max_num_seqs past which throughput gains less than --knee-gain per doubling",
    )
    p.add_argument("--knee-gain", type=float, default=None, metavar="FRACTION",
                   help="--goal knee: throughput gain per doubling of max_num_seqs below which the curve is flat "
                        "(default 0.1)")
    p.add_argument("--replications", type=int, default=3, help="seeds per load level (default 3)")
    p.add_argument("--level", type=float, default=None,
                   help="confidence level of the t-intervals (default 0.95; needs --replications >= 2)")
    p.add_argument("--tol", type=float, default=0.05,
                   help="relative width at which bisection stops (1e-6 <= TOL < 1; default 0.05)")  # fmt: skip
    p.add_argument(
        "--min-attainment",
        type=float,
        default=None,  # None: 0.99; given, it must have per-request SLOs to judge
        help="per-request SLOs: fraction of requests that must meet them (lower CI bound; default 0.99)",
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel processes (default: every CPU)")
    p.add_argument("--progress", action="store_true",
                   help="a progress bar per search round on stderr even when it is not a terminal")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.add_argument("--out", help="directory for size.json, candidates.csv, curve.csv and size.html")
    p.add_argument("--intervals", action="store_true",
                   help="judge percentile SLOs on the prediction interval of the real value: replication spread "
                        "plus the GPU profile's calibration residuals (servesim fit --from-run; docs/intervals.md)")
    from sim.cli.catalog import add_vllm_option
    from sim.cli.outpath import add_plotlyjs_option
    from sim.cli.prices import add_price_options
    from sim.cli.size_cards import add_card_options

    add_vllm_option(p)
    from sim.cli.progress import add_quiet_option

    add_quiet_option(p)
    add_card_options(p, _int_list)
    add_price_options(p)
    add_plotlyjs_option(p)
    p.set_defaults(func=run)  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    from sim.app.config import load_config
    from sim.app.plotlyjs import write_figure
    from sim.app.sizing import size
    from sim.app.sweep import parse_grid

    slo = parse_slo_args(args.slo, args.overrides) if args.slo else None
    vary = parse_grid(args.vary, "--vary") if args.vary else None
    if vary:
        from sim.app.sweep import check_grid_overrides

        check_grid_overrides(vary, args.overrides, "--vary")
    from sim.app.sweep import check_jobs

    check_jobs(args.jobs)
    check_range("", "--min-attainment", args.min_attainment, 0, 1, lo_open=True)
    if args.level is not None:
        check_range("", "--level", args.level, 0, 1, lo_open=True, hi_open=True)
        if isinstance(args.replications, int) and args.replications == 1:  # one seed: no interval to give a level to
            raise ConfigError(f"--level {args.level:g}: intervals need --replications >= 2 (this search has "
                              f"{args.replications}); allowed: add --replications N, or leave --level out")
    args.level = 0.95 if args.level is None else args.level
    from sim.app.sizing import MIN_TOL

    check_range("", "--tol", args.tol, MIN_TOL, 1, hi_open=True)  # narrower: the bisection never ends
    from sim.app.replicate import check_replications

    check_replications(args.replications)
    if args.goal == "knee" and args.max_num_seqs is not None and len(args.max_num_seqs) < 2:  # distinct already
        raise ConfigError(f"--goal knee with --max-num-seqs {','.join(map(str, args.max_num_seqs))}: a knee is on a "
                          "curve; allowed: two or more values (or leave --max-num-seqs out)")
    if args.goal in ("throughput", "knee"):  # ranked by offline throughput / its curve: no SLO is judged
        given = [f for f, v in (("--slo", args.slo), ("--min-attainment", args.min_attainment is not None)) if v]
        if given:
            raise ConfigError(f"{' and '.join(given)} with --goal {args.goal}: it ranks by offline throughput"
                              f"{'' if args.goal == 'throughput' else ' along max_num_seqs'}, so they would change "
                              "nothing; allowed: --goal slo, or leave them out")
    if args.knee_gain is not None and args.goal != "knee":  # a flag that would do nothing is refused
        raise ConfigError(f"--knee-gain {args.knee_gain:g}: only with --goal knee")
    if args.knee_gain is None:
        from sim.app.knee import DEFAULT_KNEE_GAIN

        args.knee_gain = DEFAULT_KNEE_GAIN
    card_only = [f for f, v in (("--dtypes", args.dtypes), ("--kv-dtypes", args.kv_dtypes), ("--tp", args.tp),
                                ("--instances-per-gpu", args.instances_per_gpu),
                                ("--device-overlap", args.device_overlap is not None),
                                ("--seqs-per-deployment", args.seqs_per_deployment is not None)) if v]  # fmt: skip
    if card_only and not args.gpus:
        raise ConfigError(f"{', '.join(card_only)}: only with --gpus (options of the card search)")
    check_out_dir(args.out)
    check_plotlyjs(args, "size.html")
    from sim.cli.catalog import vllm_overrides
    from sim.cli.prices import price_overrides
    from sim.cli.progress import show_progress

    vllm = vllm_overrides(args)
    if vary:
        from sim.cli.sweep import _check_grid_vllm

        _check_grid_vllm(vary, vllm, "--vary")
    cfg = load_config(args.config, [*vllm, *args.overrides, *price_overrides(args)])
    from sim.cli.outpath import check_step_trace_setting

    check_step_trace_setting(cfg.simulation.record_step_trace, args, "servesim size")
    _check_min_attainment(args, slo, cfg)
    from sim.cli.prices import check_prices_used

    check_prices_used(args, args.gpus or [cfg.hardware.gpu, *((vary or {}).get("hardware.gpu") or [])])
    if args.min_attainment is None:
        args.min_attainment = 0.99
    args.progress = show_progress(args)  # on a terminal unless --quiet (sim/cli/progress.py)
    if args.gpus and args.intervals:
        raise ConfigError("--intervals is not modelled with --gpus (the card search judges SLOs on the "
                          "replications alone); drop one of them")
    if args.gpus:  # which card, how many, at what cost (sim/cli/size_cards.py)
        from sim.cli import size_cards

        return size_cards.run(args, cfg, slo)
    if args.target_rate is not None or args.target_concurrency is not None:
        raise ConfigError("--target-rate / --target-concurrency need --gpus (the cards to compare)")
    res = size(cfg, slo, max_num_seqs=args.max_num_seqs, vary=vary, goal=args.goal,
               replications=args.replications, level=args.level, rel_tol=args.tol,
               min_attainment=args.min_attainment, jobs=args.jobs, progress=args.progress,
               knee_gain=args.knee_gain, calibration=calibration(cfg) if args.intervals else None)  # fmt: skip
    files = {"size.json": lambda p: p.write_text(json.dumps(res.to_dict(), indent=2) + "\n", encoding="utf-8"),
             "candidates.csv": lambda p: res.table().to_csv(p, index=False),
             "curve.csv": lambda p: res.curve().to_csv(p, index=False),
             "size.html": lambda p: write_figure(res.figure(), p, args.plotlyjs)}  # fmt: skip
    return emit(res, args, files, res.recommended is not None)


def _check_min_attainment(args: argparse.Namespace, slo: dict[str, float] | None, cfg: Any) -> None:
    """--min-attainment judges the per-request SLOs (ttft:MS ...); with only percentile ones it does nothing."""
    if args.min_attainment is None or args.goal != "slo":
        return
    from sim.app.sizing import parse_slo

    slos = dict(cfg.slo if slo is None else slo)
    if slos and not parse_slo(slos)[0]:
        raise ConfigError(f"--min-attainment {args.min_attainment:g}: judges per-request SLOs (e.g. --slo ttft:1000), "
                          f"and these are percentile ones only ({', '.join(slos)}); allowed: a per-request SLO, or "
                          "leave --min-attainment out")


def calibration(cfg: Any) -> Any:
    """key -> the config's GPU profile's calibration residuals (an error when it has none: the interval
    would be the replication spread alone, which says nothing about the real engine)."""
    from sim.app.intervals import calibration_residuals
    from sim.cost.hardware import get_gpu
    from sim.cost.profiles import get_profile

    if cfg.engine.cost_model == "constant":
        raise ConfigError("--intervals: a constant cost model has no calibration to judge against")
    prof = get_profile(get_gpu(cfg.hardware.gpu), None if cfg.hardware.profile == "auto" else cfg.hardware.profile)
    if not ((prof.metadata or {}).get("calibration") or {}).get("residuals_log"):
        raise ConfigError(f"--intervals: profile {prof.description!r} carries no calibration residuals; fit one "
                          "with servesim fit --from-run RUN --gpu GPU --out P.json and pass "
                          "--set hardware.profile=P.json")
    return lambda key: calibration_residuals(prof, key)


def emit(res: Any, args: argparse.Namespace, files: dict[str, Any], ok: bool) -> int:
    """Write ``files`` (name -> writer of that path) under ``--out``, print the answer (``--json``: all of
    it); exit code 0 when there is an answer, 1 when none."""
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, write in files.items():
            write(out / name)
        print(f"wrote {out}/{', '.join(files)}", file=sys.stderr)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(res.format())
    return 0 if ok else 1
