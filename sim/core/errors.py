"""Project exceptions: each names the offending field, row or value so the CLI can print one clear line."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any


class ServesimError(Exception):
    """Base class; the CLI turns any of these into one line on stderr and exit code 2.

    The message reads as one line everywhere, the API's exceptions too: a value shown in it whose repr
    spans lines (a pandas Series, a 2-D array, a path with a newline) has its line breaks escaped."""

    def __str__(self) -> str:
        return one_line(super().__str__())


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``), so a message is one line whatever it quotes."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class ConfigError(ServesimError):
    """A configuration key, type or value that cannot be used."""


class TraceFormatError(ServesimError):
    """A trace file or row that does not parse."""


class MemoryPlanError(ServesimError):
    """The model (or the requested context) does not fit in GPU memory."""


class UnknownNameError(ConfigError):
    """A policy, model, GPU or cost-model name that is not registered."""


class ResultsIntegrityError(RuntimeError):
    """The engine handed over records that contradict each other: a bug, so deliberately not a
    ServesimError (the CLI lets it show its traceback)."""


def run_command(func: Callable[[Any], int | None], args: Any) -> int:
    """Run a CLI subcommand: a ServesimError becomes one line on stderr and exit code 2 (the
    contract of every ``servesim`` entry point)."""
    try:
        return int(func(args) or 0)
    except ServesimError as exc:  # one line, whatever a value in the message holds (a path with a newline)
        print("servesim: error: " + str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # a path given on the command line past the system's limit (255 bytes a name): found when it is
        # first looked at, before any work, wherever that is
        name = str(exc.filename or "")
        shown = name if len(name) <= 60 else f"{name[:40]}...{name[-10:]} ({len(name)} characters)"
        print(f"servesim: error: path {shown!r}: too long for this system (a file name is at most 255 bytes)",
              file=sys.stderr)
        return 2
