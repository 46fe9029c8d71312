"""`servesim size CONFIG --gpus ...`: which card, how many, at what cost (sim/app/card_search.py).

    servesim size CONFIG.toml --gpus "RTX 4090,A100 40GB,A100 80GB,H100 SXM" [--dtypes fp16,int8,awq]
                  [--kv-dtypes auto,fp8] [--tp 1,2] [--instances-per-gpu 1,2]
                  --target-rate R | --target-concurrency N [--slo ...] [--gpu-hour-usd X] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _names(text: str) -> list[str]:
    items = text.split(",")
    if text.strip() and any(not v.strip() for v in items):  # 'A,' or 'A,,B': as --grid and --vary refuse
        raise argparse.ArgumentTypeError(f"{text!r}: empty value; allowed: names separated by commas")
    vals = [v.strip() for v in items if v.strip()]
    if not vals:
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
    return vals


def add_card_options(p: argparse.ArgumentParser, int_list: Any) -> None:
    g = p.add_argument_group("card search (--gpus): the cheapest deployment that carries a target")
    g.add_argument("--gpus", type=_names, metavar="GPU,GPU,...", help="cards to compare (catalogue names, aliases)")
    g.add_argument("--dtypes", type=_names, metavar="D,D,...", help="weight dtypes: fp16, bf16, int8, fp8, awq, gptq")
    g.add_argument("--kv-dtypes", type=_names, metavar="D,D,...", help="KV-cache dtypes: auto, fp8")
    g.add_argument("--tp", type=int_list, metavar="N,N,...", help="tensor-parallel sizes (default 1)")
    g.add_argument("--instances-per-gpu", type=int_list, metavar="N,N,...",
                   help="engines sharing each card (gpu_memory_utilization split evenly; default 1)")
    t = g.add_mutually_exclusive_group()
    t.add_argument("--target-rate", type=float, metavar="REQ_PER_S", help="requests per second to carry")
    t.add_argument("--target-concurrency", type=int, metavar="CLIENTS",
                   help="concurrent clients to carry (the workload becomes a closed loop of them)")
    # defaults None: given without --gpus they are refused (size.py), not silently unused
    g.add_argument("--device-overlap", type=float, default=None,
                   help="instances sharing a card: how much two busy ones overlap (default 0 = time slicing)")
    g.add_argument("--seqs-per-deployment", type=int, default=None,
                   help="default max_num_seqs candidates per deployment (powers of two up to the KV limit; default 3)")


def run(args: argparse.Namespace, cfg: Any, slo: dict[str, float] | None) -> int:
    from sim.app.card_search import search_cards
    from sim.app.plotlyjs import write_figure
    from sim.core.errors import ConfigError

    if args.goal == "knee":
        raise ConfigError("--goal knee applies to one card (without --gpus): the knee of its max_num_seqs curve")
    if args.vary:
        raise ConfigError("--vary applies without --gpus; the card search varies --dtypes, --kv-dtypes, --tp itself")
    if args.device_overlap is not None and args.device_overlap > 0 and max(args.instances_per_gpu or [1]) == 1:
        # one engine a card: no two instances share one, so the overlap would change nothing
        raise ConfigError(f"--device-overlap {args.device_overlap:g}: only with --instances-per-gpu above 1 "
                          "(instances sharing a card); allowed: --instances-per-gpu 2,... or leave it out")
    if args.device_overlap is None:
        args.device_overlap = 0.0
    if args.seqs_per_deployment is None:
        args.seqs_per_deployment = 3
    if args.seqs_per_deployment < 1:
        raise ConfigError(f"--seqs-per-deployment: {args.seqs_per_deployment}; allowed: an integer >= 1")
    res = search_cards(
        cfg, slo, gpus=args.gpus, dtypes=args.dtypes, kv_dtypes=args.kv_dtypes, tps=args.tp,
        instances=args.instances_per_gpu, target_rate=args.target_rate, target_concurrency=args.target_concurrency,
        max_num_seqs=args.max_num_seqs, goal=args.goal, replications=args.replications, level=args.level,
        rel_tol=args.tol, min_attainment=args.min_attainment, jobs=args.jobs, progress=args.progress,
        device_overlap=args.device_overlap, seqs_per_deployment=args.seqs_per_deployment,
    )  # fmt: skip
    from sim.cli.size import emit

    files = {"cards.json": lambda p: p.write_text(json.dumps(res.to_dict(), indent=2) + "\n", encoding="utf-8"),
             "cards.csv": lambda p: res.table().drop(columns=["slo_checks_at_target"]).to_csv(p, index=False),
             "cards.html": lambda p: write_figure(res.figure(), p, getattr(args, "plotlyjs", None))}  # fmt: skip
    return emit(res, args, files, res.best is not None)
