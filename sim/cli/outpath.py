"""``--out`` checked before any simulation: a directory that exists or can be made, and can be written."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from sim.core.errors import ConfigError


def check_out_dir(path: str | Path | None, flag: str = "--out") -> None:
    """Raise a ConfigError naming ``flag`` and the path when ``path`` cannot hold the outputs: an existing
    file, a path under a file, or a directory that cannot be made or written. Makes the directory."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag}: {p} is an existing file, not a directory; allowed: a directory (new or existing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".servesim-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write to {p} ({exc.strerror or exc}); allowed: a writable directory") from None


def check_out_file(path: str | Path | None, flag: str = "--out") -> None:
    """The same for a single output file: its folder must be writable and the path not a directory."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag}: {p} is a directory; allowed: a file path")
    check_out_dir(p.parent if str(p.parent) else ".", flag)


def add_plotlyjs_option(p: argparse.ArgumentParser) -> None:
    """``--plotlyjs directory|cdn|inline``: how the HTML reports load plotly.js (sim/app/plotlyjs.py)."""
    from sim.app.plotlyjs import PLOTLYJS_MODES

    p.add_argument("--plotlyjs", choices=PLOTLYJS_MODES, default="directory",
                   help="HTML reports: directory (default) writes one plotly.min.js into the output directory for "
                        "every page there (offline, one copy); cdn loads it from the CDN; inline embeds it per file")  # fmt: skip
