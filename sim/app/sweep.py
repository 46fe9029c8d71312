"""Sweeps: every point of a grid of config values × replications, in parallel, as one table.

``--grid engine.max_num_seqs=16,32,64 --grid workload.rate=1,2,4`` is the Cartesian product of the
axes, in the order given. Each value is TOML (``fp8`` is a bare word; ``{dist = "fixed", value = 64}``
is a table, and commas inside brackets, braces or quotes do not split values). Every point is validated
before anything runs (unknown key, wrong type, negative rate → ConfigError naming the point).

Execution: ``run_tasks`` runs (config, seed) tasks inline (``jobs = 1``), in a local process pool
(``concurrent.futures``), or on Ray (``backend = "ray"``: an existing cluster at ``address``, else a
local instance started for the sweep). Progress is a tqdm bar on stderr (sim/app/progress.py). Rows come
back in task order.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from sim.app.config import (
    _SECTIONS,
    RunConfig,
    check_rate_scale,
    config_from_dict,
    engine_keys,
    override_key,
    parse_value,
)
from sim.app.progress import bar as progress_bar
from sim.app.replicate import DEFAULT_LEVEL, interval_table, run_one, seed_list
from sim.app.values import same_value
from sim.core.errors import ConfigError, ServesimError

BACKENDS = ("local", "ray")
SECTIONS = (*_SECTIONS, "workload", "slo")
SUMMARY_METRICS = (
    "request_throughput", "request_goodput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "p99_tpot_ms", "p99_e2el_ms", "mean_num_waiting", "saturated",
)  # fmt: skip


# ---- grid --------------------------------------------------------------------------------------------
def split_values(text: str) -> list[str]:
    """Split on commas that are not inside [], {}, () or quotes."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def check_key(key: str, what: str = "--grid") -> tuple[str, ...]:
    """``section.key[.sub]`` → its parts; sections with fixed fields must name one of them."""
    parts = tuple(p.strip() for p in key.split("."))
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{what} {key!r}: expected SECTION.KEY=VALUES, e.g. engine.max_num_seqs=16,32")
    section = parts[0]
    if section not in SECTIONS:
        raise ConfigError(f"{what} {key!r}: unknown section {section!r}; known: {', '.join(SECTIONS)}")
    if section in _SECTIONS:
        known = engine_keys() if section == "engine" else [f.name for f in fields(_SECTIONS[section])]
        if len(parts) != 2 or parts[1] not in known:
            raise ConfigError(f"{what} {key!r}: unknown key in [{section}]; known keys: {', '.join(known)}")
    return parts


def parse_grid(items: Sequence[str], flag: str = "--grid") -> dict[str, list[Any]]:
    """``["engine.max_num_seqs=16,32"]`` → ``{"engine.max_num_seqs": [16, 32]}`` (values parsed as TOML);
    ``flag``: the option the items came from, for the messages (``size --vary`` takes them too)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not text.strip():
            raise ConfigError(f"{flag} {item!r}: expected SECTION.KEY=V1,V2,...")
        key = ".".join(check_key(key))
        if key == "simulation.seed":
            raise ConfigError(f"{flag} {key}: seeds come from --replications (common random numbers)")
        if key in grid:
            raise ConfigError(f"{flag} {key}: given twice; put all its values in one {flag}")
        values = [parse_value(v, f"{flag} {key}") for v in split_values(text)]
        if any(v == "" for v in values):
            raise ConfigError(f"{flag} {item!r}: empty value")
        said = repeated(key, values)  # a repeated value would run the same points twice
        if said is not None:
            raise ConfigError(f"{flag} {item!r}: {said}; allowed: distinct values")
        if key == "workload.rate_scale":  # a user's, bounded as in a config (the sizing search's are not)
            for v in values:
                check_rate_scale(v, f"{flag} {key}")
        grid[key] = values
    return grid


def repeated(key: str, values: Sequence[Any], identical: str = "the value {!r} is repeated") -> str | None:
    """The first value of setting ``key`` that ``values`` give twice, in any spelling (``same_value``), said
    for a refusal (``identical``: how a value given twice as such is said); None when they are distinct."""
    for i, v in enumerate(values):
        w = next((w for w in values[:i] if same_value(key, w, v)), None)
        if w is not None:
            if type(w) is type(v) and w == v:
                return identical.format(v)
            return f"{w!r} and {v!r} " + ("resolve to one catalogue model" if key == "model.name" else
                                          f"are the same {key}")
    return None


def check_grid_overrides(grid: Mapping[str, Any], overrides: Sequence[str], flag: str = "--grid") -> None:
    """A ``--set`` of a key the grid varies would be lost (the grid's values win): refused."""
    for o in overrides:
        key = override_key(o)
        if key in grid:
            raise ConfigError(f"{flag} {key}=... and --set {o!r} both set {key}; allowed: one of them (put the "
                              f"value in {flag})")


def with_params(cfg: RunConfig, params: Mapping[str, Any]) -> RunConfig:
    """``cfg`` with dotted keys set (validated as the config file would be)."""
    raw = copy.deepcopy(cfg.to_dict())
    for key, value in params.items():
        parts = check_key(key, "parameter")
        node = raw
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"parameter {key}: {p} is not a table")
            node = nxt
        node[parts[-1]] = value
    hw, eng = raw.get("hardware"), raw.get("engine")
    if "engine.cost_model" in params and isinstance(hw, dict) and isinstance(eng, dict) \
            and eng.get("cost_model") == "constant":
        hw["profile"] = "auto"  # a shared profile is the grid's roofline points'; a constant point reads none
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{_fmt_params(params)}: {e}") from None


def _fmt_params(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "base config"


@dataclass(frozen=True)
class Point:
    index: int
    params: dict[str, Any]
    cfg: RunConfig


def expand_grid(cfg: RunConfig, grid: Mapping[str, Sequence[Any]]) -> list[Point]:
    keys = list(grid)
    combos = itertools.product(*(grid[k] for k in keys)) if keys else [()]
    return [
        Point(i, dict(zip(keys, combo, strict=True)), with_params(cfg, dict(zip(keys, combo, strict=True))))
        for i, combo in enumerate(combos)
    ]


def validate_points(points: Sequence[Point]) -> None:
    """Resolve each point's memory plan and build each distinct workload once, before anything runs, so
    a bad value fails in a second with the point named (not in a worker after minutes)."""
    from sim.app.simulate import resolve
    from workloads.synthetic import build_workload

    seen_setup: dict[str, int] = {}
    seen_wl: set[str] = set()
    for p in points:
        c = p.cfg
        try:
            key = json.dumps([c.to_dict()[s] for s in ("model", "hardware", "engine")], sort_keys=True)
            if key not in seen_setup:
                seen_setup[key] = resolve(c).limits.max_model_len
            wl = dict(c.workload)
            if c.simulation.num_requests is not None:
                wl["num_requests"] = c.simulation.num_requests
            wkey = json.dumps([wl, seen_setup[key]], sort_keys=True, default=str)
            if wkey not in seen_wl:
                build_workload(wl, seed=c.simulation.seed, max_model_len=seen_setup[key])
                seen_wl.add(wkey)
        except ServesimError as e:
            raise type(e)(f"grid point {p.index} ({_fmt_params(p.params)}): {e}") from None


# ---- execution ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    key: tuple
    cfg: RunConfig
    seed: int
    slo: Mapping[str, float] | None = None
    runner: Callable[..., dict[str, Any]] | None = None  # (cfg, seed, slo) -> row; None: run_one (one engine)


def execute(task: Task) -> dict[str, Any]:
    """Run one task; a ServesimError becomes an ``error`` field (a bug still raises)."""
    try:
        return (task.runner or run_one)(task.cfg, task.seed, task.slo)
    except ServesimError as e:
        return {"seed": task.seed, "error": f"{type(e).__name__}: {e}"}


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def check_jobs(jobs: int | None) -> None:
    """``--jobs``: 1 up to 4 processes per CPU this process may use (more only queue for the CPUs, and a
    pool of 10^5 forks is a fork bomb); None is one per CPU."""
    top = 4 * default_jobs()
    if jobs is not None and not 1 <= jobs <= top:
        raise ConfigError(f"--jobs: got {jobs}; allowed 1 to {top} (4 processes per CPU here)")


def run_tasks(
    tasks: Sequence[Task],
    *,
    jobs: int | None = None,
    backend: str = "local",
    address: str | None = None,
    progress: bool = False,
    label: str = "sweep",
    stream: TextIO | None = None,
    func: Callable[[Task], dict[str, Any]] = execute,
    pool: Executor | None = None,
) -> list[dict[str, Any]]:
    """Rows of ``func(task)`` in task order. ``jobs`` None = every CPU; 1 = inline, no pool. ``pool``: an
    executor to reuse across calls (a search runs many small batches; worker start-up is not free)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    bar = progress_bar(len(tasks), label, enabled=progress and len(tasks) > 0, stream=stream, unit="run")
    try:
        if backend == "ray":
            return _run_ray(tasks, address, bar, func)
        if address is not None:
            raise ConfigError("--address only applies to --backend ray")
        if pool is not None:
            return _run_pool(tasks, pool, bar, func)
        jobs = min(jobs or default_jobs(), len(tasks)) or 1
        if jobs == 1:
            out = []
            for t in tasks:
                out.append(func(t))
                bar.update()
            return out
        with ProcessPoolExecutor(max_workers=jobs) as own:
            return _run_pool(tasks, own, bar, func)
    finally:
        bar.close()


def _run_pool(tasks: Sequence[Task], pool: Executor, bar: Any, func) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    futures = {pool.submit(func, t): i for i, t in enumerate(tasks)}
    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in done:
            results[futures[f]] = f.result()
            bar.update()
    return results  # type: ignore[return-value]


_RAY_ADDRESS = re.compile(r"(?:ray://)?([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")  # HOST:PORT, an IPv6 host bracketed


def check_ray_address(address: str) -> None:
    """``--address``: ``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT`` (what ``ray.init`` takes), port
    1-65535; an IPv6 host in brackets."""
    m = _RAY_ADDRESS.fullmatch(address.strip())
    if address.strip() not in ("auto", "local") and (m is None or not 1 <= int(m.group(2)) <= 65535):
        raise ConfigError(f"--address {address!r}: expected auto, local, HOST:PORT or ray://HOST:PORT (a Ray "
                          "cluster's address)")


RAY_CONNECT_TIMEOUT_S = 5.0  # how long reach_ray_address waits for a TCP connection


def reach_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """That something listens at ``--address`` HOST:PORT (``auto`` / ``local``: nothing to reach). Ray's own
    connect retries for ever where nothing answers, inside ``ray.init``; a TCP connect says it in seconds."""
    m = _RAY_ADDRESS.fullmatch(address.strip())
    if m is None:
        return  # auto, local (check_ray_address refuses anything else)
    host, port = m.group(1).strip("[]"), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        why = f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConfigError(f"--address {address!r}: nothing answers at {host}:{port} ({why}); allowed: the address "
                          "of a running Ray cluster (`ray start --head` prints it), or no --address for a local "
                          "instance") from None


def _run_ray(tasks: Sequence[Task], address: str | None, bar: Any, func) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'servesim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        if address is not None:
            reach_ray_address(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ValueError, ConnectionError, RuntimeError) as e:  # no cluster there, ray[client] missing, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--address {address!r}: Ray could not connect ({first})") from None
    try:
        remote = ray.remote(num_cpus=1)(func)
        refs = {remote.remote(t): i for i, t in enumerate(tasks)}
        results: list[dict[str, Any] | None] = [None] * len(tasks)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                results[refs[r]] = ray.get(r)
                bar.update()
        return results  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()


# ---- the sweep ---------------------------------------------------------------------------------------
def run_sweep(
    cfg: RunConfig,
    grid: Mapping[str, Sequence[Any]],
    *,
    replications: int = 1,
    slo: Mapping[str, float] | None = None,
    jobs: int | None = None,
    backend: str = "local",
    address: str | None = None,
    progress: bool = False,
    stream: TextIO | None = None,
) -> pd.DataFrame:
    """One row per grid point × replication: ``point``, ``replication``, ``seed``, one column per grid key,
    then the metrics of ``sim.app.replicate.run_one`` (and ``error`` where a point failed)."""
    points = expand_grid(cfg, grid)
    validate_points(points)
    seeds = seed_list(cfg.simulation.seed, replications)
    tasks = [Task((p.index, r), p.cfg, s, slo) for p in points for r, s in enumerate(seeds)]
    rows = run_tasks(tasks, jobs=jobs, backend=backend, address=address, progress=progress, stream=stream)
    records = []
    for t, row in zip(tasks, rows, strict=True):
        p = points[t.key[0]]
        records.append({"point": p.index, "replication": t.key[1], **p.params, **row})
    df = pd.DataFrame(records)
    if "error" not in df.columns:
        df["error"] = None
    for key in grid:  # a column of mixed types (e.g. 2048 and "auto") cannot go to Parquet as is
        if df[key].map(type).nunique() > 1 and not pd.api.types.is_numeric_dtype(df[key]):
            df[key] = df[key].map(lambda v: json.dumps(v) if not isinstance(v, str) else v)
        elif df[key].map(lambda v: isinstance(v, dict | list)).any():
            df[key] = df[key].map(json.dumps)
    return df


def aggregate(
    df: pd.DataFrame,
    grid_keys: Sequence[str],
    metrics: Sequence[str] = SUMMARY_METRICS,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Mean and t-interval per point: columns ``point``, grid keys, then ``<metric>``, ``<metric>_lo``,
    ``<metric>_hi`` (NaN bounds with one replication)."""
    ok = df[df["error"].isna()] if "error" in df.columns else df
    metrics = [m for m in metrics if m in ok.columns]
    if ok.empty:
        return pd.DataFrame(columns=["point", *grid_keys])
    long = interval_table(ok, metrics, by=["point", *grid_keys], level=level)
    rows: dict[int, dict[str, Any]] = {}
    for rec in long.to_dict("records"):
        row = rows.setdefault(rec["point"], {"point": rec["point"], **{k: rec[k] for k in grid_keys}})
        m = rec["metric"]
        row[m], row[f"{m}_lo"], row[f"{m}_hi"] = rec["mean"], rec["ci_low"], rec["ci_high"]
    return pd.DataFrame(list(rows.values()))


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Parquet (``.parquet``) or CSV (``.csv``), by extension."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        raise ConfigError(f"--out {path}: expected a .parquet or .csv file name")
    return path
