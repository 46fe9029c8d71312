"""``servesim schema [--section S]``: the run config's JSON Schema (sim/app/schema.py), for editors."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schema", help="print the config's JSON Schema (for editors completing the TOML)")
    p.add_argument("--section", metavar="S", help="one section only (model, hardware, engine, ...)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sim.app.schema import config_schema, section_schema

    schema = section_schema(args.section) if args.section is not None else config_schema()  # "" is no section
    print(json.dumps(schema, indent=2))
    return 0
