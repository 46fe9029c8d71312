"""``servesim cluster CONFIG``: run a cluster config, or every variant of a comparison config.

``servesim run`` hands cluster configs here too (``is_cluster_file``), so one command runs both kinds.
Also runnable as ``python -m sim.cli.cluster CONFIG``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sim.app.config import add_override_option
from sim.app.tables import fixed_table
from sim.core.errors import ServesimError, run_command


def is_cluster_file(path: str | Path) -> bool:
    """True when ``path`` is a TOML config with [cluster], [[replica]], [[stream]] or [variants]."""
    from sim.app.cluster_config import is_cluster_config, read_toml

    try:
        return is_cluster_config(read_toml(path))
    except ServesimError:
        return False  # let the single-engine path report the problem


def runs_as_cluster(config: str | Path, overrides: Sequence[str] | None) -> bool:
    """Whether ``servesim run CONFIG --set ...`` is a cluster run: the file holds a cluster table, or a --set
    names one."""
    return is_cluster_file(config) or sets_cluster_tables(overrides)


def sets_cluster_tables(overrides: Sequence[str] | None) -> bool:
    """True when a ``--set`` names a cluster table (``cluster.replicas=3``): ``servesim run`` then runs the
    config as a cluster, as it does a file holding that table (a single engine has no [cluster])."""
    from sim.app.cluster_config import CLUSTER_TABLES
    from sim.app.config import override_key

    out = False
    for o in overrides or ():
        try:
            out = out or override_key(o).split(".")[0] in CLUSTER_TABLES
        except ServesimError:
            pass  # a malformed --set: the config load reports it, naming it
    return out


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("cluster", help="simulate replicas behind a gateway (or compare deployments)")
    p.add_argument("config", help="path to a cluster TOML config (examples/cluster_*.toml)")
    add_override_option(p, "override a config value (repeatable), e.g. --set cluster.router=least-kv")
    p.add_argument("--variant", action="append", default=[], help="run only this variant (repeatable)")
    p.add_argument("--out", help="directory for tables, reports and (with variants) comparison.html")
    p.add_argument("--step-trace", action="store_true",
                   help="with --out: steps.jsonl lists each step's scheduled requests (slower, larger)")
    p.add_argument("--steps-jsonl", action="store_true",
                   help="with --out: also steps.jsonl, one line of counts per step (steps.parquet holds the same)")
    p.add_argument("--json", action="store_true", help="print the summary (or summaries) as JSON")
    from sim.cli.outpath import add_plotlyjs_option
    from sim.cli.prices import add_price_options
    from sim.cli.progress import add_quiet_option

    add_quiet_option(p)
    add_price_options(p)
    add_plotlyjs_option(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Also the hook for ``servesim run``: uses ``config``, ``overrides``, ``out``, ``json`` (and
    ``variant`` when present)."""
    from sim.app.cluster import run_once
    from sim.app.cluster_config import load_cluster, replace_base
    from sim.app.cluster_metrics import (
        compare_table,
        format_cluster_summary,
        summarize_cluster,
        write_cluster_outputs,
        write_comparison,
    )
    from sim.cli.outpath import check_out_dir, check_steps_jsonl_flags, steps_jsonl_wanted
    from sim.cli.prices import price_overrides

    check_steps_jsonl_flags(args)
    check_out_dir(getattr(args, "out", None))
    cfgs = load_cluster(args.config, [*(getattr(args, "overrides", []) or []), *price_overrides(args)])
    from sim.cli.outpath import check_step_trace_setting

    for c in cfgs.values():
        check_step_trace_setting(c.base.simulation.record_step_trace, args)
    from sim.app.setup import profile_notes

    for note in profile_notes(r.run for c in cfgs.values() for r in c.replicas):  # another card's profile
        print(f"servesim: note: {note}", file=sys.stderr)
    wanted = list(getattr(args, "variant", []) or [])
    twice = sorted({v for v in wanted if wanted.count(v) > 1})
    if twice:  # it would run (and be reported) twice
        from sim.core.errors import ConfigError

        raise ConfigError(f"--variant {twice[0]!r}: given twice; allowed: distinct variants")
    # the cards of every variant in the file: one price list for the file, whichever --variant is picked
    cards = {r.run.hardware.gpu for c in cfgs.values() for r in c.replicas}
    if wanted:
        missing = [v for v in wanted if v not in cfgs]
        if missing:
            from sim.core.errors import ConfigError

            have = [k for k in cfgs if k]
            raise ConfigError(f"--variant: no variant(s) {missing} in {args.config}; "
                              + (f"allowed: {', '.join(have)}" if have else "it has no [variants]: drop --variant"))
        cfgs = {k: cfgs[k] for k in wanted}
    from sim.cli.prices import check_prices_used

    check_prices_used(args, cards)
    from sim.app.streams import check_variant_workloads

    check_variant_workloads(cfgs)  # a bad workload in one variant, before any variant runs
    if args.out and list(cfgs) != [""]:  # each variant's folder: names the file system can make, before any run
        for name in cfgs:
            check_out_dir(Path(args.out) / name, f"--out (variant {name[:60]!r})")
    runs = {}
    for name, cfg in cfgs.items():
        if args.out and getattr(args, "step_trace", False) and not cfg.base.simulation.record_step_trace:
            from dataclasses import replace

            cfg = replace_base(cfg, simulation=replace(cfg.base.simulation, record_step_trace=True))
        from sim.cli.progress import show_progress

        try:
            result = run_once(cfg, progress=show_progress(args))
        except ServesimError as e:  # what only the run finds (a prompt past max_model_len): named by its variant
            if not name:
                raise
            from sim.app.streams import _renamed

            raise _renamed(e, f"[variants.{name}]: {e}") from None
        runs[name] = (result, summarize_cluster(result, slo=cfg.base.slo or None))
    title = f"servesim cluster: {Path(args.config).name}"
    if args.out:
        js = getattr(args, "plotlyjs", None)
        jsonl = steps_jsonl_wanted(args, any(c.base.simulation.record_step_trace for c in cfgs.values()))
        if list(runs) == [""]:
            res, summ = runs[""]
            files = write_cluster_outputs(res, Path(args.out), summ, title=title, plotlyjs=js, step_trace=jsonl)
        else:
            files = write_comparison(runs, Path(args.out), title, plotlyjs=js, step_trace=jsonl)
        if not args.json:
            print(f"wrote {', '.join(str(f) for f in files.values())}")
    if args.json:
        payload = runs[""][1] if list(runs) == [""] else {n: s for n, (_, s) in runs.items()}
        print(json.dumps(payload, indent=2, default=str))
        return 0
    for name, (_, summ) in runs.items():
        if name:
            print(f"== {name}")
        print(format_cluster_summary(summ))
    if len(runs) > 1 or list(runs) != [""]:
        table = compare_table({n: s for n, (_, s) in runs.items()})
        print("== comparison")
        print(fixed_table(table, index=True))
    _print_classes(cfgs, runs)
    return 0


def _print_classes(cfgs: dict, runs: dict) -> None:
    """Per-class latencies when classes matter: by priority (latency / throughput queues) and by length
    (long / short pools, split at the length-pools router's threshold)."""
    import pandas as pd

    from sim.app.cluster_metrics import class_rows

    cols = ["completed", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_e2el_ms"]
    thresholds = {
        int(c.router.options.get("threshold", 8192)) for c in cfgs.values() if c.router.name == "length-pools"
    }
    if any(res.requests["priority"].nunique() > 1 for res, _ in runs.values()):
        t = pd.concat(
            {n or "run": class_rows(res).set_index("priority")[cols] for n, (res, _) in runs.items()}
        )
        print("== by priority")
        print(fixed_table(t, index=True))
    for thr in sorted(thresholds):
        t = pd.concat(
            {
                n or "run": class_rows(res, threshold=thr).set_index("length_class")[cols]
                for n, (res, _) in runs.items()
            }
        )
        print(f"== by length (prompt + output over {thr} tokens = long)")
        print(fixed_table(t, index=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servesim cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "cluster":
        argv = ["cluster", *argv]
    args = parser.parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
