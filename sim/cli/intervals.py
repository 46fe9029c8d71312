"""``servesim run CONFIG --intervals``: replications plus the profile's calibration residuals → a prediction
interval for every summary figure (sim/app/intervals.py, docs/intervals.md)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def add_options(p: argparse.ArgumentParser) -> None:
    """The run command's interval options (registered by sim/cli/main.py)."""
    p.add_argument("--intervals", action="store_true",
                   help="replicate over seeds and print each figure's prediction interval of the real value "
                        "(replication spread + the profile's calibration residuals; docs/intervals.md)")
    p.add_argument("--replications", type=int, default=None, help="with --intervals: number of seeds (default 5)")
    p.add_argument("--level", type=float, default=None, help="with --intervals: interval level (default 0.90)")


def _fmt(v: Any) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.1f}" if 1 <= abs(v) < 1e9 else f"{v:.3g}" if abs(v) >= 1e9 else f"{v:.3f}"  # 1e120, not 121 digits


def run(args: argparse.Namespace) -> int:
    from sim.app.config import load_config
    from sim.app.intervals import interval_table
    from sim.app.replicate import replicate
    from sim.core.errors import ConfigError
    from sim.cost.hardware import get_gpu
    from sim.cost.profiles import get_profile

    if args.replications is None:
        args.replications = 5
    if args.level is None:
        args.level = 0.90
    from sim.app.replicate import check_replications

    check_replications(args.replications)
    if args.replications < 2:  # one seed gives no spread: every interval would be empty
        raise ConfigError(f"--replications {args.replications}: --intervals needs at least 2 seeds; allowed an "
                          "integer >= 2 (default 5)")
    if not 0 < args.level < 1:
        raise ConfigError(f"--level must be in (0, 1), got {args.level}")
    if args.out or args.step_trace:
        raise ConfigError("--intervals prints a table (or --json); it writes no --out files")
    cfg = load_config(args.config, args.overrides)
    from sim.cli.outpath import check_step_trace_setting

    check_step_trace_setting(cfg.simulation.record_step_trace, args, "run --intervals")
    prof = None
    if cfg.engine.cost_model != "constant":
        prof = get_profile(get_gpu(cfg.hardware.gpu), None if cfg.hardware.profile == "auto" else cfg.hardware.profile)
    rows = replicate(cfg, args.replications)
    table = interval_table(rows, prof, args.level)
    calibrated = bool(table["calibrated"].any()) if len(table) else False
    if args.json:
        print(json.dumps({"level": args.level, "replications": args.replications,
                          "profile": prof.description if prof else None, "calibrated": calibrated,
                          "intervals": table.to_dict(orient="records")}, indent=2, default=str))
        return 0
    print(f"{args.replications} replications, {100 * args.level:g} % prediction intervals of the real value"
          + ("" if calibrated else " (replication spread only: the profile carries no calibration residuals; "
                                   "fit one with servesim fit --from-run)"))
    print(f"{'metric':22s} {'sim mean':>10s} {'predicted':>10s} {'low':>10s} {'high':>10s}  calibration")
    for r in table.itertuples():
        cal = f"K={r.n_calibration}, bias {100 * (math.exp(r.bias_log) - 1):+.1f} %" if r.calibrated else "none"
        print(f"{r.metric:22s} {_fmt(r.sim_mean):>10s} {_fmt(r.center):>10s} {_fmt(r.low):>10s} {_fmt(r.high):>10s}"
              f"  {cal}")
    return 0
