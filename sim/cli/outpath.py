"""``--out`` checked before any simulation: a directory that exists or can be made, and can be written."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from sim.core.errors import ConfigError
from sim.core.fields import short_path

MAX_NEW_LEVELS = 256  # folders one --out may create below its nearest existing one


def check_out_dir(path: str | Path | None, flag: str = "--out") -> None:
    """Raise a ConfigError naming ``flag`` and the path when ``path`` cannot hold the outputs: an existing
    file, a path under a file, or a directory that cannot be made or written. Creates nothing (the
    writers make the directory once there is something to write), so a refused input leaves no trace."""
    if path is None:
        return
    if not str(path).strip():  # "" would be the current directory on some commands and nothing on others
        raise ConfigError(f"{flag}: an empty path; allowed: a directory path (e.g. out/run1)")
    p = Path(path)
    try:
        _check_dir(p, flag)
    except OSError as exc:  # e.g. a name longer than the file system allows (ENAMETOOLONG)
        raise ConfigError(f"{flag}: cannot use {short_path(p)} ({exc.strerror or exc}); allowed: a writable directory "
                          "path") from None


# The files the commands write into an --out directory: a directory (or a broken link) by one of these names
# there would stop the write after the run (IsADirectoryError), so it is refused before.
OUTPUT_NAMES = ("summary.json", "report.html", "plotly.min.js", "requests.parquet", "steps.parquet", "steps.jsonl",
                "timeseries.csv", "timeseries_by_replica.csv", "replicas.csv", "load_balance.html",
                "concurrency_sweep.csv", "comparison.json", "comparison.html", "fit_report.md", "size.json",
                "size.html", "candidates.csv", "curve.csv", "cards.csv", "cards.html", "cards.json")  # fmt: skip


def _check_links(p: Path, flag: str, allowed: str = "a directory path, or a link to one") -> None:
    """``p`` or the folder it would be made in is a symbolic link that leads nowhere (a missing target, a
    loop): Path.exists() says False, so the writer's mkdir would fail after the run (FileExistsError)."""
    q = p
    while True:
        if q.is_symlink() and not q.exists():
            raise ConfigError(f"{flag}: {short_path(q)} is a symbolic link to {os.readlink(q)!r}, which leads nowhere "
                              f"(a missing target or a loop); allowed: {allowed}")
        if q.exists() or q.parent == q:
            return
        q = q.parent


def _check_dir(p: Path, flag: str) -> None:
    _check_links(p, flag)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag}: {p} is an existing file, not a directory; allowed: a directory (new or existing)")
    if p.is_dir():
        for name in OUTPUT_NAMES:
            q = p / name
            if q.is_dir() or (q.is_symlink() and not q.exists()):
                raise ConfigError(f"{flag}: {short_path(q)} is a directory or a broken link where servesim writes "
                                  f"its {name}; allowed: an output directory without it (remove it, or choose another)")
    probe = _existing(p)
    if not probe.is_dir():
        raise ConfigError(f"{flag}: cannot make {p}: {probe} is a file; allowed: a writable directory")
    name_max = os.pathconf(probe, "PC_NAME_MAX")
    new = p.parts[len(probe.parts):]
    if len(new) > MAX_NEW_LEVELS:  # Path.mkdir(parents=True) recurses once a level: thousands overflow it
        raise ConfigError(f"{flag}: {len(new)} folder levels to make in {short_path(p)}; allowed: at most "
                          f"{MAX_NEW_LEVELS}")
    for part in new:  # the folders and name still to be made
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{flag}: a name of {len(os.fsencode(part))} bytes in {short_path(p)}; allowed: at most "
                              f"{name_max} bytes a name on this file system")
    try:  # a file made and removed there: what a write needs, which os.access does not tell root
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".servesim-write-check-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write to {p} ({exc.strerror or exc}); allowed: a writable directory") from None


def check_out_file(path: str | Path | None, flag: str = "--out") -> None:
    """The same for a single output file: its folder must be writable and the path not a directory."""
    if path is None:
        return
    if not str(path).strip():
        raise ConfigError(f"{flag}: an empty path; allowed: a file path")
    p = Path(path)
    try:
        is_dir = p.is_dir()
        _check_links(p, flag, "a file path, or a link to one")
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot use {short_path(p)} ({exc.strerror or exc}); allowed: a file path") from None
    if is_dir:
        raise ConfigError(f"{flag}: {p} is a directory; allowed: a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{flag}: cannot write {p}: {parent} is a file; allowed: a file path in a directory")
    check_out_dir(parent, flag)
    name_max = os.pathconf(_existing(p.parent), "PC_NAME_MAX")
    if len(os.fsencode(p.name)) > name_max:
        raise ConfigError(f"{flag}: a file name of {len(os.fsencode(p.name))} bytes ({short_path(p)}); allowed: at most "
                          f"{name_max} bytes on this file system")


def _existing(p: Path) -> Path:
    """The nearest of ``p`` and its parents that exists."""
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def add_plotlyjs_option(p: argparse.ArgumentParser) -> None:
    """``--plotlyjs directory|cdn|inline``: how the HTML reports load plotly.js (sim/app/plotlyjs.py)."""
    from sim.app.plotlyjs import PLOTLYJS_MODES

    p.add_argument("--plotlyjs", choices=PLOTLYJS_MODES, default=None,  # None: directory; given without --out: refused
                   help="HTML reports: directory (default) writes one plotly.min.js into the output directory for "
                        "every page there (offline, one copy); cdn loads it from the CDN; inline embeds it per file")  # fmt: skip


def steps_jsonl_wanted(args: argparse.Namespace, recorded: bool) -> bool:
    """Whether ``--out`` writes steps.jsonl: asked for (``--steps-jsonl``: counts per step), or a step trace
    recorded (``--step-trace`` or ``simulation.record_step_trace``: each step's rows). Not by default:
    steps.parquet holds the same counts, and as JSON text they are ~4.5 GB for a million requests."""
    return bool(getattr(args, "steps_jsonl", False) or getattr(args, "step_trace", False) or recorded)


def check_steps_jsonl_flags(args: argparse.Namespace) -> None:
    """``--step-trace`` / ``--steps-jsonl`` without ``--out`` would do nothing: refused (run and cluster)."""
    for flag, on in (("--step-trace", getattr(args, "step_trace", False)),
                     ("--steps-jsonl", getattr(args, "steps_jsonl", False))):
        if on and not getattr(args, "out", None):
            raise ConfigError(f"{flag}: only with --out (it is how steps.jsonl is written)")
    if getattr(args, "step_trace", False) and getattr(args, "steps_jsonl", False):
        raise ConfigError("--step-trace and --steps-jsonl: one or the other (--step-trace writes the full trace, "
                          "which replaces the counts --steps-jsonl asks for)")
    check_plotlyjs(args, "report.html")


def check_step_trace_setting(record: bool, args: argparse.Namespace, what: str = "") -> None:
    """``[simulation] record_step_trace = true`` where nothing would write the trace (``run`` / ``cluster``
    without ``--out``; ``what`` names a command that never writes one): refused, as ``--step-trace`` is."""
    if not record:
        return
    if what:
        raise ConfigError(f"[simulation] record_step_trace = true: {what} writes no step trace (one row a run); "
                          "allowed: leave it false, or servesim run with --out")
    if not getattr(args, "out", None):
        raise ConfigError("[simulation] record_step_trace = true: the step trace is written as steps.jsonl under "
                          "--out; allowed: add --out DIR, or leave it false")


def check_plotlyjs(args: argparse.Namespace, page: str) -> None:
    """``--plotlyjs`` without ``--out`` would do nothing (no page is written): refused."""
    if getattr(args, "plotlyjs", None) is not None and not getattr(args, "out", None):
        raise ConfigError(f"--plotlyjs: only with --out (it says how the written {page} loads plotly.js)")
