"""servesim's Python API: the face of the packages below it (sim, policies, routers, workloads).

    >>> import servesim
    >>> res = servesim.run({"workload": {"num_requests": 8, "rate": 4.0,
    ...                                  "prompt": {"dist": "fixed", "value": 128},
    ...                                  "output": {"dist": "fixed", "value": 16}}},
    ...                    engine={"max_num_seqs": 4})
    >>> len(res.requests), res.summary["completed"]
    (8, 8)

``run`` takes a config (a path to a TOML file, a dict of TOML tables, or a loaded ``RunConfig``) and
keyword overrides, one table each (``engine={...}`` merges into ``[engine]``), and returns a ``Result``:
the per-request and per-step tables as pandas DataFrames and the summary (vLLM ``bench serve`` keys).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from typing import Any

import pandas as pd

from sim.app.config import RunConfig, config_from_dict, load_config
from sim.app.results import SimResult, request_metrics, steps_table, summarize
from sim.app.simulate import simulate

try:
    __version__ = _dist_version("servesim")
except PackageNotFoundError:  # pragma: no cover - running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["Result", "RunConfig", "__version__", "load_config", "run"]


@dataclass(frozen=True)
class Result:
    """One simulation's outputs. ``raw`` is the underlying SimResult (ITL arrays, meta, step trace)."""

    raw: SimResult
    config: RunConfig

    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request: timestamps (``*_time``, s), lengths, status, and the derived latencies
        ``ttft_s``, ``tpot_s``, ``e2el_s``, ``queue_time_s`` (seconds, as their names say)."""
        return request_metrics(self.raw.requests)

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine step: start (s), duration_s, batch composition, KV usage, queue lengths."""
        return steps_table(self.raw.steps)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The run's summary, under the config's SLOs when it has any."""
        return summarize(self.raw, slo=self.config.slo or None)


def _merge(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for section, table in overrides.items():
        if not isinstance(table, dict):
            from sim.core.errors import ConfigError

            raise ConfigError(f"servesim.run({section}=...): expected a table (dict) of [{section}] keys, "
                              f"got {type(table).__name__}")
        raw.setdefault(section, {}).update(table)
    return raw


def run(config: str | Path | dict[str, Any] | RunConfig | None = None, **overrides: dict[str, Any]) -> Result:
    """Simulate ``config`` (TOML path, dict of tables, RunConfig, or None for the built-in defaults) with
    ``overrides`` merged table by table; bad input raises ServesimError subclasses naming the field."""
    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif isinstance(config, str | Path):
        raw = load_config(config).to_dict()
    else:
        raw = copy.deepcopy(config) if config is not None else {}
    cfg = config_from_dict(_merge(raw, overrides))
    return Result(raw=simulate(cfg), config=cfg)
