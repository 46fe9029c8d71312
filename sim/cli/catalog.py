"""``servesim models`` / ``servesim gpus``: list the catalogues; and ``--vllm-args``, the vLLM flags that
``run``, ``size`` and ``sweep`` take (sim/app/vllm_args.py does the mapping)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sim.app.tables import fixed_table
from sim.core.errors import ConfigError


def add_parsers(sub: Any) -> None:
    for name, what in (("models", "the model catalogue (names a config's model.name takes)"),
                       ("gpus", "the GPU catalogue (names a config's hardware.gpu takes)")):  # fmt: skip
        p = sub.add_parser(name, help=f"list {what}")
        p.add_argument("--json", action="store_true", help="print the rows as JSON")
        if name == "models":
            p.add_argument("--sources", action="store_true", help="add the column citing each model's config")
        p.set_defaults(func=_list, table=name)


def _list(args: argparse.Namespace) -> int:
    from sim.app.catalog import gpu_table, model_table

    df = model_table() if args.table == "models" else gpu_table()
    if args.json:
        print(json.dumps(json.loads(df.to_json(orient="records")), indent=2))
        return 0
    if args.table == "models" and not args.sources:
        df = df.drop(columns=["source"])
    print(fixed_table(df))
    return 0


def add_vllm_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-args", metavar='"FLAGS"',
                   help='vLLM engine flags (or a whole "vllm serve MODEL ..." line) as config overrides; flags '
                        "servesim does not model are named on stderr; --set wins over them")  # fmt: skip


def vllm_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides ``--vllm-args`` stands for (before the user's own --set, which win); each flag
    not modelled is one ``ignored:`` line on stderr."""
    text = getattr(args, "vllm_args", None)
    if text is None:
        return []
    if not text.strip():  # would read as "not given"
        raise ConfigError(f"--vllm-args {text!r}: empty; allowed: vLLM engine flags, e.g. '--max-num-seqs 64'")
    from policies.base import options_class
    from sim.app.cluster_config import read_toml
    from sim.app.config import apply_overrides
    from sim.app.vllm_args import translate

    raw = apply_overrides(read_toml(args.config), [o for o in args.overrides if o.startswith("engine.")])
    eng = raw.get("engine") if isinstance(raw.get("engine"), dict) else {}
    policy = eng.get("policy") or eng.get("preset") or "vllm"
    accepted = options_class(policy).accepted() if isinstance(policy, str) else ()
    t = translate(text, accepted)
    for line in t.ignored:
        print(f"servesim: ignored: {line}", file=sys.stderr)
    return t.overrides
