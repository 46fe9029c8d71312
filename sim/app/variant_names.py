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


# The files a cluster run with variants writes (sim/app/outputs.py write_outputs, sim/app/cluster_metrics.py,
# sim/app/plotlyjs.py): each variant's in its folder, the comparison's and plotly.js at the top of --out
# (tests/test_bad_inputs_round7.py checks these lists against what a run writes).
VARIANT_FILE_NAMES = frozenset({
    "requests.parquet", "steps.parquet", "steps.jsonl", "summary.json", "timeseries.csv", "report.html",
    "replicas.csv", "timeseries_by_replica.csv", "load_balance.html",
})  # fmt: skip
TOP_FILE_NAMES = frozenset({"comparison.html", "comparison.json", "plotly.min.js"})
OUTPUT_FILE_NAMES = VARIANT_FILE_NAMES | TOP_FILE_NAMES


def check_variant_name(name: Any) -> None:
    """A variant's name is its output folder under ``--out`` (sim/app/cluster_metrics.write_comparison): a
    folder inside it (``vllm/split`` nests one), never a path that leaves ``--out`` or lands in its root.
    Names that collide with another variant's files: ``check_variant_names``; names the file system cannot
    make: sim/cli/cluster.py checks each folder as an --out (sim/cli/outpath.check_out_dir) before any run."""
    parts = name.split("/") if isinstance(name, str) else []
    ok = (bool(parts) and name.strip() != "" and not any(c in name for c in "\\\0")
          and all(p.strip() and p not in (".", "..") for p in parts))
    if not ok:
        raise ConfigError(f"{variant_label(name)}: name {name!r} is not usable as the variant's output folder; "
                          "allowed: a non-empty name of folder names joined by '/' (none empty, '.' or '..'; "
                          "no leading '/', no '\\' or NUL)")


def check_variant_names(names: list[str]) -> None:
    """The variants' folders against the files the run writes beside them: a folder named like the
    comparison's files at the top (``comparison.html``), or like a file in another variant's folder
    (``a/summary.json`` beside a variant ``a``), would meet a FileExistsError after the first variants ran."""
    taken = {f: "the comparison" for f in TOP_FILE_NAMES}
    for v in names:
        taken.update({f"{v}/{f}": f"variant {v!r}" for f in VARIANT_FILE_NAMES})
    for name in names:
        parts = name.split("/")
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            if prefix in taken:
                raise ConfigError(f"{variant_label(name)}: its folder {prefix!r} is a file {taken[prefix]} writes; "
                                  "allowed: another name")
