"""``--quiet``, shared by the commands that draw a progress bar (run, cluster, size, sweep)."""

from __future__ import annotations

import argparse

from sim.app.progress import check_env, wanted


def add_quiet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar on stderr (there is none anyway when stderr is not a terminal)")  # fmt: skip


def show_progress(args: argparse.Namespace) -> bool:
    """A bar unless --quiet (or sweep's --no-progress), and only on a terminal; size's --progress forces it."""
    if getattr(args, "progress", False) is True:
        if getattr(args, "quiet", False):  # the two contradict each other: neither would be honoured whole
            from sim.core.errors import ConfigError

            raise ConfigError("--progress and --quiet: one or the other")
        check_env()
        return True
    show = wanted(bool(getattr(args, "quiet", False) or getattr(args, "no_progress", False)))
    if show:
        check_env()
    return show
