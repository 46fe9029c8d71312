"""servesim's Python API: the face of the packages below it (sim, policies, routers, workloads).

    >>> import servesim
    >>> res = servesim.run({"workload": {"num_requests": 8, "rate": 4.0,
    ...                                  "prompt": {"dist": "fixed", "value": 128},
    ...                                  "output": {"dist": "fixed", "value": 16}}},
    ...                    engine={"max_num_seqs": 4})
    >>> len(res.requests), res.summary["completed"]
    (8, 8)

``compare`` replays a real benchmark run (a ``vllm bench serve`` result JSON, an inference-perf results
directory, engine JSONL or Prometheus scrapes) and returns what ``servesim compare --json`` prints; ``size``
searches ``max_num_seqs`` for the most capacity under SLOs (milliseconds) and returns the SizingResult:

    >>> sizing = servesim.size({"engine": {"cost_model": "constant", "constant_step_s": 0.01},
    ...                         "workload": {"num_requests": 40, "rate": 4.0,
    ...                                      "prompt": {"dist": "fixed", "value": 64},
    ...                                      "output": {"dist": "fixed", "value": 8}}},
    ...                        slo={"p99_ttft_ms": 200}, max_num_seqs=[2, 8], replications=2)
    >>> [c.params["engine.max_num_seqs"] for c in sizing.candidates], sizing.recommended
    ([2, 8], 1)
    >>> bool(sizing.table()["capacity_req_s"].iloc[1] > sizing.table()["capacity_req_s"].iloc[0])  # 8 seqs: more req/s
    True

``run`` takes a config (a path to a TOML file, a dict of TOML tables, or a loaded ``RunConfig``) and
keyword overrides, one table each (``engine={...}`` merges into ``[engine]``), and returns a ``Result``:
the per-request and per-step tables as pandas DataFrames and the summary (vLLM ``bench serve`` keys).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from types import GeneratorType
from typing import Any

import pandas as pd

from sim.app.config import RunConfig, config_from_dict, load_config
from sim.app.results import SimResult, request_metrics, steps_table, summarize
from sim.app.simulate import simulate

try:
    __version__ = _dist_version("servesim")
except PackageNotFoundError:  # pragma: no cover - running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["Result", "RunConfig", "__version__", "compare", "load_config", "run", "size"]


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
    from sim.core.errors import ConfigError

    for section, table in overrides.items():
        if not isinstance(table, dict):
            raise ConfigError(f"servesim.run({section}=...): expected a table (dict) of [{section}] keys, "
                              f"got {type(table).__name__}")
        base = raw.get(section)
        if section == "frontend" and table.get("enabled") is False:
            base = {}  # off: a loaded config's filled-in front-end values would be refused beside it
        raw[section] = {**(base if isinstance(base, dict) else {}), **_plain(table)}  # None: a section left out
    return raw


def _plain(v: Any) -> Any:
    """A notebook's numpy scalars as the Python numbers a TOML file gives (``np.int64(8)`` is an int), its
    numpy arrays as lists of them, and a generator as the list it yields: a TOML
    file's arrays are lists."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return type(v)(_plain(x) for x in v)
    if type(v).__module__ == "numpy" and hasattr(v, "tolist"):
        return v.tolist()  # a scalar's number, an array's (nested) list of numbers
    if isinstance(v, GeneratorType):  # not any iterator: an endless one, or an open file, stays as given
        return [_plain(x) for x in v]
    return v


def _config(config: str | Path | dict[str, Any] | RunConfig | None, overrides: dict[str, Any]) -> RunConfig:
    """A RunConfig from any form ``run`` takes, with ``overrides`` merged table by table."""
    from sim.core.errors import ConfigError

    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif isinstance(config, str | Path):
        if not str(config).strip():
            raise ConfigError(f"servesim: config {str(config)!r}: empty; allowed: a TOML path, a dict of tables, a "
                              "RunConfig or None (the built-in defaults)")
        from sim.app.config import _resolve_paths
        from sim.core.fields import load_toml

        raw = load_toml(Path(config))  # the file's own tables: merged before defaults are filled in
        _resolve_paths(raw, Path(config).parent)
    elif config is None or isinstance(config, dict):
        raw = copy.deepcopy(_plain(config)) if config is not None else {}  # (a generator cannot be copied)
    else:
        raise ConfigError(f"servesim: config must be a TOML path, a dict of tables, a RunConfig or None; got "
                          f"{type(config).__name__}")
    return config_from_dict(_merge(raw, overrides))


def run(config: str | Path | dict[str, Any] | RunConfig | None = None, **overrides: dict[str, Any]) -> Result:
    """Simulate ``config`` (TOML path, dict of tables, RunConfig, or None for the built-in defaults) with
    ``overrides`` merged table by table; bad input raises ServesimError subclasses naming the field."""
    cfg = _config(config, overrides)
    return Result(raw=simulate(cfg), config=cfg)


def _set_strings(overrides: list[str] | dict[str, dict[str, Any]] | None) -> list[str]:
    """``{"engine": {"max_num_seqs": 64}}`` (or ``--set`` strings as they are) -> ``["engine.max_num_seqs=64"]``:
    JSON scalars are TOML values, which is how the replay reads its overrides."""
    from sim.core.errors import ConfigError

    if overrides is None or isinstance(overrides, list | tuple):
        bad = [o for o in overrides or [] if not isinstance(o, str)]
        if bad:
            raise ConfigError(f"servesim.compare(overrides=[...]): {bad[0]!r} is not a string; allowed: "
                              "'SECTION.KEY=VALUE' strings, or a dict of tables")
        return list(overrides or [])
    if not isinstance(overrides, dict):
        raise ConfigError(f"servesim.compare(overrides=...): expected a list of 'SECTION.KEY=VALUE' strings or a "
                          f"dict of tables, got {type(overrides).__name__}")
    out = []
    for section, table in overrides.items():
        if not isinstance(table, dict):
            raise ConfigError(f"servesim.compare(overrides={{{section!r}: ...}}): expected a table (dict) of "
                              f"[{section}] keys, got {type(table).__name__}")
        for k, v in table.items():
            if not isinstance(k, str) or not k.strip() or k != k.strip() or "=" in k or "." in k:
                raise ConfigError(f"servesim.compare(overrides={{{section!r}: {{{k!r}: ...}}}}): not a key name; "
                                  f"allowed: one [{section}] key such as 'max_num_seqs'")
            v = _plain(v)  # a numpy scalar is its Python value
            if v is None:  # TOML has no null: a --set cannot say "the default"
                raise ConfigError(f"servesim.compare(overrides={{{section!r}: {{{k!r}: None}}}}): None has no --set "
                                  "spelling; allowed: a value, or leave the key out (the run's own setting)")
            try:  # inf and nan in TOML's spelling (JSON's is Infinity)
                text = (("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v) else "nan"
                        if isinstance(v, float) and math.isnan(v) else json.dumps(v))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"servesim.compare(overrides={{{section!r}: {{{k!r}: ...}}}}): {e}") from None
            out.append(f"{section}.{k}={text}")
    return out


def compare(run_path: str | Path, gpu: str | None = None, overrides: list[str] | dict[str, Any] | None = None,
            profile: str | None = None, *, format: str = "auto", max_per_stage: int | None = None) -> dict[str, Any]:
    """Replay a real run and compare: ``{"settings", "stages", "overall", "timeseries"}``, each metric as
    ``{"real", "sim", "error_pct"}`` (what ``servesim compare --json`` prints). ``overrides``: ``--set``
    strings or a dict of tables; ``max_per_stage``: replay only the first N requests of each stage."""
    from sim.app.compare import compare as _compare
    from sim.app.results import to_jsonable
    from sim.core.errors import ConfigError
    from workloads.runs import load_run

    max_per_stage = _plain(max_per_stage)  # np.int64(5) is 5
    if max_per_stage is not None and (isinstance(max_per_stage, bool) or not isinstance(max_per_stage, int)
                                      or max_per_stage < 1):  # fmt: skip
        raise ConfigError(f"servesim.compare(max_per_stage=...): expected an integer >= 1 or None, got {max_per_stage!r}")
    for name, v in (("run_path", run_path), ("profile", profile)):
        if not (isinstance(v, str | Path) or (v is None and name == "profile")):
            raise ConfigError(f"servesim.compare({name}=...): expected a path, got {type(v).__name__}")
    for name, v, what in (("gpu", gpu, "a catalogue GPU name (e.g. H100), or None: the run's own"),
                          ("profile", profile, "a profile JSON, a shipped profile name or 'prior', or None")):
        if v is not None and (not isinstance(v, str | Path) or not str(v).strip()):  # as the CLI's --gpu ''
            raise ConfigError(f"servesim.compare({name}={v!r}): empty or not text; allowed: {what}")
    sets = _set_strings(overrides)
    real = load_run(str(run_path), format)
    c = _compare(real, gpu, profile, sets, max_per_stage)
    return to_jsonable(c.to_dict())


def size(config: str | Path | dict[str, Any] | RunConfig | None = None, slo: dict[str, float] | None = None,
         *, as_dict: bool = False, **kw: Any) -> Any:
    """Search ``max_num_seqs`` (or ``vary``) for the highest capacity under ``slo`` (ms keys as in ``[slo]``:
    ``p99_ttft_ms``, ``ttft_ms``, ...; default: the config's [slo]). ``kw``: sim.app.sizing.size's keywords
    (max_num_seqs, vary, goal, replications, level, jobs, ...). Returns the SizingResult (``.table()``,
    ``.recommended``), or with ``as_dict`` what ``servesim size --json`` prints."""
    from sim.app.sizing import size as _size

    as_dict = _plain(as_dict)  # a numpy bool is the bool it is
    if not isinstance(as_dict, bool):
        from sim.core.errors import ConfigError

        raise ConfigError(f"servesim.size(as_dict=...): expected True or False, got {as_dict!r}")
    kw = _size_keywords(kw)
    goal = kw.get("goal", "slo")
    if goal in ("throughput", "knee"):  # as the CLI: these rank by throughput and judge no SLO
        import inspect

        default = inspect.signature(_size).parameters["min_attainment"].default  # a wrapper may pass it on
        given = [k for k, v in (("slo", bool(slo)), ("min_attainment", kw.get("min_attainment", default) not in
                                                     (None, default))) if v]
        if given:
            from sim.core.errors import ConfigError

            raise ConfigError(f"servesim.size({', '.join(given)} with goal={goal!r}): that goal ranks by offline "
                              "throughput, so they would change nothing; allowed: goal='slo', or leave them out")
    cfg = _config(config, {})
    if slo is not None:
        from sim.app.results import parse_slo

        slo = _plain(slo)  # numpy numbers as Python's
        parse_slo(slo)  # before any run: a bad key or unit is one line naming it
    res = _size(cfg, slo, **kw)
    return res.to_dict() if as_dict else res


def _values(name: str, v: Any, key: str = "engine.max_num_seqs") -> list[Any]:
    """A list of candidate values of setting ``key`` from a list, tuple, range, numpy array or pandas Series
    (numpy's numbers as Python's), refused when it is a string, a table, empty or names a value twice (in
    any spelling: sim.app.sweep.same_value)."""
    from sim.app.sweep import repeated
    from sim.core.errors import ConfigError

    if isinstance(v, str | bytes | dict) or not hasattr(v, "__iter__"):
        raise ConfigError(f"servesim.size({name}): expected a list of values (e.g. [8, 16, 32]), got "
                          f"{type(v).__name__}")
    out = [_plain(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
    if not out:
        raise ConfigError(f"servesim.size({name}): empty; allowed: one value or more (None: the default grid)")
    said = repeated(key, out, "{!r} given twice")  # a repeated candidate would be searched twice and shown as two
    if said is not None:
        raise ConfigError(f"servesim.size({name}): {said}; allowed: distinct values")
    return out


def _size_keywords(kw: dict[str, Any]) -> dict[str, Any]:
    """``size``'s keywords checked as the CLI checks its flags, before any simulation, each error naming
    the keyword; numpy's numbers (and arrays or Series of candidates) taken as Python's."""
    import inspect
    from numbers import Real

    from sim.app.replicate import MAX_REPLICATIONS
    from sim.app.sizing import GOALS
    from sim.app.sizing import size as _size
    from sim.core.errors import ConfigError

    allowed = [k for k in inspect.signature(_size).parameters if k not in ("cfg", "slo")]
    out: dict[str, Any] = {}
    for k, v in kw.items():
        if k not in allowed:
            raise ConfigError(f"servesim.size({k}=...): unknown keyword; allowed: slo, as_dict, {', '.join(allowed)}")
        if k == "max_num_seqs":
            v = None if v is None else _values("max_num_seqs=...", v)
        elif k == "vary" and v is not None:
            if not isinstance(v, dict):
                raise ConfigError(f"servesim.size(vary=...): expected a dict of setting -> list of values (e.g. "
                                  f"{{'engine.max_num_batched_tokens': [2048, 8192]}}), got {type(v).__name__}")
            from sim.app.sweep import check_key

            for key in v:  # as size --vary reads its keys
                if not isinstance(key, str):
                    raise ConfigError(f"servesim.size(vary={{{key!r}: ...}}): expected a 'SECTION.KEY' setting such "
                                      f"as 'engine.max_num_batched_tokens', got {type(key).__name__} {key!r}")
                check_key(key, "servesim.size(vary=...)")
            v = {key: _values(f"vary={{{key!r}: ...}}", vals, key) for key, vals in v.items()}
        else:
            v = _plain(v)
        out[k] = v

    def number(k: str, lo: float, hi: float, hi_closed: bool = False) -> None:
        v = out.get(k)
        if k in out and (isinstance(v, bool) or not isinstance(v, Real) or not (lo < v < hi or (hi_closed and v == hi))):
            raise ConfigError(f"servesim.size({k}=...): expected a number in ({lo:g}, {hi:g}{']' if hi_closed else ')'}, "
                              f"got {v!r}")

    number("level", 0, 1)
    number("rel_tol", 0, 1)
    number("min_attainment", 0, 1, hi_closed=True)
    number("knee_gain", 0, 1)
    for k, lo, hi in (("replications", 1, MAX_REPLICATIONS), ("jobs", 1, None)):
        v = out.get(k)
        if k in out and not (v is None and k == "jobs") and (
                isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi)):
            allowed_text = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo} or None (every CPU)"
            raise ConfigError(f"servesim.size({k}=...): expected {allowed_text}, got {v!r}")
    if "jobs" in out and out["jobs"] is not None:
        from sim.app.sweep import check_jobs

        check_jobs(out["jobs"])
    if "goal" in out and out["goal"] not in GOALS:
        raise ConfigError(f"servesim.size(goal=...): expected one of {', '.join(map(repr, GOALS))}, got {out['goal']!r}")
    if "progress" in out and not isinstance(out["progress"], bool):
        raise ConfigError(f"servesim.size(progress=...): expected True or False, got {out['progress']!r}")
    if out.get("calibration") is not None and not callable(out["calibration"]):
        raise ConfigError("servesim.size(calibration=...): expected a function key -> residuals (or None), got "
                          f"{type(out['calibration']).__name__}")
    return out
