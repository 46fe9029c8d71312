"""``servesim compare RUN``: replay a real run (vllm bench result JSON, inference-perf results directory,
per-request engine JSONL, Prometheus scrapes) and print real vs simulated per stage and overall."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sim.app.config import add_override_option


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="replay a real run and compare its metrics with the simulation",
                       description=__doc__)  # fmt: skip
    p.add_argument("run", help="vllm bench serve result JSON (--save-detailed), inference-perf results directory, "
                               "requests.jsonl (or its directory), or Prometheus scrapes (a file or a directory)")
    p.add_argument("--format", default="auto", help="auto (sniff) or vllm-bench, inference-perf, engine-jsonl, prometheus")
    p.add_argument("--gpu", help="catalogue GPU the run used (when the run does not say)")
    p.add_argument("--profile", help="calibration profile: a JSON (e.g. from servesim fit --from-run), a shipped "
                                     "name, or 'prior' (default: the GPU's shipped profile)")
    add_override_option(p, "override a replay setting (repeatable), e.g. --set engine.async_scheduling=false; "
                           "workload.rate=R gives the load of a run without arrival times; simulation.seed=N "
                           "the seed of what a replay draws (default 0)")
    p.add_argument("--max-per-stage", type=int, help="replay only the first N requests of each stage (faster)")
    p.add_argument("--json", action="store_true", help='print {"stages": [...], "overall": {...}} as JSON')
    p.add_argument("--out", help="directory for report.html (distributions and time series) and comparison.json")
    from sim.cli.progress import add_quiet_option

    add_quiet_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sim.app.compare import compare, format_comparison
    from sim.app.replay import prepare, replay_seed
    from sim.app.results import to_jsonable
    from sim.cli.flags import check_not_empty
    from sim.cli.outpath import check_out_dir
    from workloads.runs import load_run

    check_not_empty(args, {"gpu": "a catalogue GPU name (e.g. H100)",
                           "profile": "a profile JSON, a shipped profile name or 'prior'"})  # fmt: skip
    check_out_dir(args.out)
    seed = replay_seed(args.overrides)  # what the run's loader draws (lengths, arrivals) is drawn from it too
    real = load_run(args.run, args.format, 0 if seed is None else seed)
    rep = prepare(real, args.gpu, args.profile, args.overrides, args.max_per_stage)  # bad input fails here
    from sim.cli.progress import show_progress

    c = compare(real, rep=rep, progress=show_progress(args))
    if args.out:
        from sim.app.compare_report import write_report

        paths = write_report(c, args.out)
        if not args.json:
            print(f"wrote {paths['report']}, {paths['json']}")
    if args.json:
        print(json.dumps(to_jsonable(c.to_dict()), indent=2))
    else:
        print(format_comparison(c))
    return 0
