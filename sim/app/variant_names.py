"""A cluster variant's name is its output folder under ``--out``: the rules that keep it one, checked when the
config is read (sim/app/cluster_config.py), not after the first variants ran."""

from __future__ import annotations

import json
import re
from typing import Any

from sim.core.errors import ConfigError


def variant_label(name: Any) -> str:
    """``[variants.NAME]`` as TOML writes it (a name that is not a bare key quoted)."""
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return f"[variants.{name}]"
    return f"[variants.{json.dumps(name) if isinstance(name, str) else repr(name)}]"


# The files a cluster run writes into a variant's folder, and at the top of --out beside the variants
# (sim/app/outputs.py write_outputs, sim/app/cluster_metrics.py, sim/app/plotlyjs.py): a variant folder named
# like one would collide with another variant's file (tests/test_bad_inputs_round7.py keeps the list whole).
OUTPUT_FILE_NAMES = frozenset({
    "requests.parquet", "steps.parquet", "steps.jsonl", "summary.json", "timeseries.csv", "report.html",
    "replicas.csv", "timeseries_by_replica.csv", "load_balance.html", "comparison.html", "comparison.json",
    "plotly.min.js",
})  # fmt: skip
MAX_VARIANT_DEPTH = 32  # folder levels in a variant's name (a path of thousands overflowed mkdir's recursion)
NAME_MAX = 255  # bytes in one folder name on the usual file systems


def check_variant_name(name: Any) -> None:
    """A variant's name is its output folder under ``--out`` (sim/app/cluster_metrics.write_comparison): a
    folder inside it (``vllm/split`` nests one), never a path that leaves ``--out``, lands in its root, takes
    the name of a file the run writes, or that the file system cannot make: checked with the config, not
    after the first variants ran."""
    parts = name.split("/") if isinstance(name, str) else []
    ok = (bool(parts) and name.strip() != "" and not any(c in name for c in "\\\0")
          and all(p.strip() and p not in (".", "..") for p in parts))
    if not ok:
        raise ConfigError(f"{variant_label(name)}: name {name!r} is not usable as the variant's output folder; "
                          "allowed: a non-empty name of folder names joined by '/' (none empty, '.' or '..'; "
                          "no leading '/', no '\\' or NUL)")
    taken = next((p for p in parts if p in OUTPUT_FILE_NAMES), None)
    if taken is not None:
        raise ConfigError(f"{variant_label(name)}: {taken!r} is the name of a file the run writes; allowed: a "
                          f"folder name other than {', '.join(sorted(OUTPUT_FILE_NAMES))}")
    long = next((p for p in parts if len(p.encode("utf-8", "surrogatepass")) > NAME_MAX), None)
    if long is not None or len(parts) > MAX_VARIANT_DEPTH:
        what = (f"a folder name of {len(long.encode('utf-8', 'surrogatepass'))} bytes" if long is not None
                else f"{len(parts)} folder levels")
        raise ConfigError(f"{variant_label(name)[:80]}: {what}; allowed: at most {NAME_MAX} bytes a name and "
                          f"{MAX_VARIANT_DEPTH} levels")
