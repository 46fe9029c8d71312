"""`servesim sweep`: every point of a grid of config values, replicated, in parallel, to one Parquet table.

    servesim sweep CONFIG.toml --grid engine.max_num_seqs=16,32,64 --grid workload.rate=1,2,4
                   [--replications N] [--slo p99_ttft:1000 tpot:50] [--backend local|ray] [--address ADDR]
                   [--jobs N] --out results.parquet

One row per point × replication (config columns, seed, every summary metric, stability); the printed
table gives each point's mean and Student-t interval over the replications. Replication i uses the same
seed at every point (common random numbers), so points differ by their settings, not their luck.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from sim.app.config import add_override_option
from sim.app.tables import fixed, fixed_table
from sim.core.errors import ConfigError

_SHOWN = ("request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms", "saturated")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sweep`` on the main CLI's subparsers (sets ``func``)."""
    p = subparsers.add_parser(
        "sweep",
        help="run a grid of configurations × replications in parallel (local processes or Ray)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="path to a TOML config")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="SECTION.KEY=V1,V2,...",
        help="an axis of the grid (repeatable); values are TOML",
    )
    add_override_option(p, "override a config value for every point (repeatable)")
    from sim.cli.catalog import add_vllm_option
    from sim.cli.size import add_slo_option

    add_vllm_option(p)
    add_slo_option(p, "SLOs for goodput and percentile checks (default: the config's [slo])")
    p.add_argument("--replications", type=int, default=1, help="seeds per point (default 1)")
    p.add_argument("--level", type=float, default=None,
                   help="confidence level of the printed intervals (default 0.95; needs --replications >= 2)")
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local processes (default) or a Ray cluster",
    )
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument("--jobs", type=int, default=None, help="local processes (default: every CPU)")
    p.add_argument("--out", required=True, help="results table: .parquet (or .csv)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (as --quiet)")
    from sim.cli.progress import add_quiet_option

    add_quiet_option(p)
    p.add_argument("--json", action="store_true", help="print the per-point table as JSON")
    p.add_argument("--knee-gain", type=float, default=None, metavar="FRACTION",
                   help="with an engine.max_num_seqs axis: the knee is where throughput gains less than this "
                        "per doubling (default 0.1); columns gain_per_doubling and knee")
    p.set_defaults(func=run)  # fmt: skip
    return p


_YES_NO = ("saturated",)  # fractions of replications: shown as yes / no / "yes 2/3", never with an interval


def _cell(mean: Any, lo: Any, hi: Any) -> str:
    """A mean and its interval's half-width, in fixed notation (sim/app/tables.py)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        return fixed(mean)
    return f"{fixed(mean)} ±{fixed((hi - lo) / 2)}"


def _yes_no(frac: Any, n: int) -> str:
    if frac is None or (isinstance(frac, float) and math.isnan(frac)):
        return "-"
    k = round(float(frac) * n)
    return "yes" if k == n else "no" if k == 0 else f"yes {k}/{n}"


def _check_grid_vllm(grid: Any, vllm: list[str], flag: str = "--grid") -> None:
    """A key that ``--vllm-args`` sets and the grid varies: the grid's values would replace it unsaid."""
    from sim.app.config import override_key

    for o in vllm:
        key = override_key(o)
        if key in grid:
            raise ConfigError(f"{flag} {key}=... and --vllm-args (which sets {o}) both set {key}; allowed: one of "
                              f"them (drop the vLLM flag, or the {flag} axis)")


def run(args: argparse.Namespace) -> int:
    from sim.app.config import load_config
    from sim.app.results import to_jsonable
    from sim.app.sweep import aggregate, parse_grid, run_sweep, write_table
    from sim.cli.size import parse_slo_args

    if not args.grid:
        raise ConfigError("sweep: give at least one --grid SECTION.KEY=V1,V2,...")
    from sim.app.knee import DEFAULT_KNEE_GAIN, SEQS_KEY, check_gain, sweep_knees
    from sim.app.sweep import check_grid_overrides

    grid = parse_grid(args.grid)
    check_grid_overrides(grid, args.overrides)
    if args.knee_gain is not None:
        check_gain(args.knee_gain)
        if SEQS_KEY not in grid:
            raise ConfigError(f"--knee-gain {args.knee_gain:g}: the knee is found along an {SEQS_KEY} axis; "
                              f"add --grid {SEQS_KEY}=V1,V2,... or leave --knee-gain out")
    knee_gain = DEFAULT_KNEE_GAIN if args.knee_gain is None else args.knee_gain
    slo = parse_slo_args(args.slo, args.overrides) if args.slo else None
    from sim.app.replicate import check_replications

    check_replications(args.replications)  # before anything runs
    if args.level is not None:
        from sim.core.fields import check_range

        check_range("", "--level", args.level, 0, 1, lo_open=True, hi_open=True)
        if args.replications < 2:  # one seed a point: no interval to give a level to
            raise ConfigError(f"--level {args.level:g}: intervals need --replications >= 2 (this sweep has "
                              f"{args.replications}); allowed: add --replications N, or leave --level out")
    args.level = 0.95 if args.level is None else args.level
    from sim.app.sweep import check_jobs, check_ray_address, reach_ray_address

    check_jobs(args.jobs)
    if args.address is not None and args.backend != "ray":
        raise ConfigError("--address only applies to --backend ray")
    if args.jobs is not None and args.backend == "ray":  # Ray schedules the tasks on its own CPUs
        raise ConfigError(f"--jobs {args.jobs}: local processes only; with --backend ray the cluster's CPUs run the tasks")
    if args.address is not None:
        check_ray_address(args.address)
        reach_ray_address(args.address)  # before any point runs: Ray itself would retry for ever
    if not str(args.out).endswith((".parquet", ".pq", ".csv")):
        raise ConfigError(f"--out {args.out}: expected a .parquet or .csv file name")
    from sim.cli.outpath import check_out_file

    check_out_file(args.out)  # before the grid runs, not after
    from sim.cli.catalog import vllm_overrides
    from sim.cli.progress import show_progress

    vllm = vllm_overrides(args)
    _check_grid_vllm(grid, vllm)
    cfg = load_config(args.config, [*vllm, *args.overrides])
    from sim.cli.outpath import check_step_trace_setting

    check_step_trace_setting(cfg.simulation.record_step_trace, args, "servesim sweep")
    wl = cfg.workload
    if args.replications > 1 and wl.get("kind", "trace" if "trace" in wl else "open") == "trace":
        print("servesim: note: a replayed trace does not depend on the seed, so its replications repeat one "
              "run; grid over workload.start/end windows, or use `servesim size` (windows as replications)",
              file=sys.stderr)  # fmt: skip
    df = run_sweep(cfg, grid, replications=args.replications, slo=slo, jobs=args.jobs, backend=args.backend,
                   address=args.address, progress=show_progress(args))  # fmt: skip
    path = write_table(df, args.out)
    agg = aggregate(df, list(grid), level=args.level)
    knees = sweep_knees(df, list(grid), knee_gain)  # empty without an engine.max_num_seqs axis
    if len(knees):
        agg = agg.merge(knees, on="point", how="left")
    if args.json:
        print(json.dumps(to_jsonable(agg.to_dict("records")), indent=2))
    else:
        view = agg[["point", *grid]].copy()
        for m in _SHOWN:
            if m in agg and m in _YES_NO:
                view[m] = [_yes_no(a, args.replications) for a in agg[m]]
            elif m in agg:
                view[m] = [
                    _cell(a, b, c) for a, b, c in zip(agg[m], agg[f"{m}_lo"], agg[f"{m}_hi"], strict=True)
                ]
        for m in ("gain_per_doubling", "knee"):
            if m in agg:
                view[m] = agg[m]
        print(fixed_table(view))
        note = (
            f"{args.replications} replications, {100 * args.level:.10g}% t-intervals"
            if args.replications > 1
            else "1 replication (no intervals)"
        )
        print(f"{len(df)} runs ({note}); table written to {path}")
    failed = df[df["error"].notna()]
    if len(failed):
        print(
            f"servesim: {len(failed)} of {len(df)} runs failed; first: {failed['error'].iloc[0]}",
            file=sys.stderr,
        )
        return 1
    return 0
