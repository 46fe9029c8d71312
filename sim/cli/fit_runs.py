"""``servesim fit --from-run RUN [RUN ...] --gpu NAME --out PROFILE.json [--holdout RUN ...]``: the CLI of
sim/app/runfit.py. Prints the fit error per run (shipped profile vs fitted) and, given --holdout, the
held-out error of each held-out run replayed with the fitted profile."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _pct(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:+.1f} %"


def _per_run(rows: list[dict[str, Any]], key: str) -> list[str]:
    by: dict[str, list[float]] = defaultdict(list)
    lines = []
    for r in rows:
        if r.get(key) is not None:
            by[r["run"]].append(abs(r[key]))
    for run, errs in by.items():
        lines.append(f"  {run}: mean |error| {sum(errs) / len(errs):.1f} % over {len(errs)} (stage, metric) targets")
    return lines


def _refuse_unused(args: argparse.Namespace) -> None:
    """The microbenchmark fit's flags do nothing with --from-run: one given is refused, not ignored (--base
    in particular: the replay fit starts from --profile)."""
    from sim.core.errors import ConfigError

    def given(name: str, default: Any = None) -> Any:
        v = getattr(args, name, default)
        return v if v not in (default, "", []) and v is not None else None

    unused = [f"{flag} {v!r}" if not isinstance(v, list) else f"{flag} {' '.join(map(str, v))!r}"
              for flag, v in (("input paths", given("inputs")), ("--recipe", given("recipe")),
                              ("--model", given("model")), ("--base", given("base", "prior")),
                              ("--freeze", given("freeze")), ("--from-base", given("from_base")),
                              ("--report", given("report")), ("--data", given("data"))) if v is not None]  # fmt: skip
    if unused:
        raise ConfigError(f"servesim fit --from-run: {', '.join(unused)} not used with --from-run (microbenchmark "
                          "fits only; the replay fit starts from --profile PROFILE.json, default the GPU's shipped "
                          "profile); allowed: --gpu, --profile, --set, --holdout, --max-per-stage, --max-nfev, "
                          "--out, --json, --quiet")


def run_fit_from_runs(args: argparse.Namespace) -> int:
    from sim.app.replay import prepare
    from sim.app.runfit import evaluate, fit_runs, fitted_profile
    from sim.cli.calibrate import _sayer
    from sim.cli.fit_checks import check_outputs_not_inputs, real_path, refuse_repeats
    from sim.cli.outpath import check_out_file
    from sim.cli.progress import show_progress
    from sim.core.errors import ConfigError
    from workloads.runs import load_run

    _refuse_unused(args)
    if not args.out:
        raise ConfigError("servesim fit --from-run: give --out PROFILE.json (where the fitted profile goes)")
    check_out_file(args.out)
    if args.max_per_stage is None:
        args.max_per_stage = 200
    if args.max_nfev is None:
        args.max_nfev = 30
    if args.max_per_stage < 1:
        raise ConfigError(f"--max-per-stage must be >= 1, got {args.max_per_stage}")
    if args.max_nfev < 1:
        raise ConfigError(f"--max-nfev must be >= 1, got {args.max_nfev}")
    refuse_repeats("--from-run", list(args.from_run))
    refuse_repeats("--holdout", list(args.holdout or []))
    fitted = {real_path(p): p for p in args.from_run}
    for p in args.holdout or []:
        if real_path(p) in fitted:
            raise ConfigError(f"--holdout {p}: also given to --from-run ({fitted[real_path(p)]}); allowed: runs not used "
                              "in the fit")
    sources: list[tuple[str, str | Path]] = [("--from-run", p) for p in args.from_run]
    sources += [("--holdout", p) for p in args.holdout or []]
    # (--profile is read whole before anything is written: refitting it in place is allowed)
    check_outputs_not_inputs([("--out", args.out)], sources)
    runs = [load_run(p) for p in args.from_run]
    holdout = [load_run(p) for p in (args.holdout or [])]
    for r in holdout:  # bad input in a held-out run is refused now, not after the fit has run and been written
        prepare(r, args.gpu, args.profile, list(args.overrides), args.max_per_stage)
    say = _sayer(args.json)  # with --json, stdout is the JSON alone: the tables go to stderr
    cmd = "servesim fit " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "servesim fit --from-run"
    res = fit_runs(runs, args.gpu, args.profile, args.overrides, args.max_per_stage, args.max_nfev,
                   log=say, progress=show_progress(args))
    prof = fitted_profile(res, runs, cmd, args.max_per_stage)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    prof.save(args.out)
    say(f"fitted on {len(runs)} run(s) in {res.wall_s:.0f} s ({res.nfev} evaluations); wrote {args.out}")
    for name, p in res.params.items():
        flag = " (held by the prior: these runs do not constrain it)" if p["held_by_prior"] else ""
        flag += " (at a bound)" if p["at_bound"] else ""
        say(f"  {name:22s} {p['start']:.4g} -> {p['value']:.4g}  sd(ln) {p['sd_log']:.3f}{flag}")
    for n in res.notes:
        say(f"  note: {n}")
    say("fit error per (run, stage, metric): shipped profile -> fitted")
    for e in res.errors:
        say(f"  {Path(e['run']).name} stage {e['stage']} {e['metric']:14s} {_pct(e['shipped_error_pct']):>9s} -> "
            f"{_pct(e['fitted_error_pct']):>9s}")
    say("fit error per run (fitted):")
    say("\n".join(_per_run(res.errors, "fitted_error_pct")))
    if holdout:
        hold = evaluate(holdout, args.gpu, args.out, args.overrides, args.max_per_stage)
        say("held-out error (fitted profile), per (run, stage, metric):")
        for e in hold:
            sat = " (clients gave up: not a latency target)" if e["saturated"] else ""
            say(f"  {Path(e['run']).name} stage {e['stage']} {e['metric']:14s} {_pct(e['error_pct']):>9s}{sat}")
        say("held-out error per run:")
        say("\n".join(_per_run([e for e in hold if not e["saturated"]], "error_pct")))
        if args.json:
            print(json.dumps({"fit": res.errors, "holdout": hold, "params": res.params}, indent=2, default=str))
    elif args.json:
        print(json.dumps({"fit": res.errors, "params": res.params}, indent=2, default=str))
    return 0
