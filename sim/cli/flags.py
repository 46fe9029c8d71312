"""Checks shared by the subcommands' string flags: an empty value is refused, naming the flag (argparse
takes ``--gpu ''`` as given, and ``if not args.gpu`` downstream would read it as "not given")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.core.errors import ConfigError


def check_not_empty(args: Any, allowed: Mapping[str, str]) -> None:
    """``allowed``: argparse dest -> what the flag takes; a given value that is empty or blank is a ConfigError
    ``--flag '': empty; allowed: WHAT``."""
    for dest, what in allowed.items():
        v = getattr(args, dest, None)
        if isinstance(v, str) and not v.strip():
            raise ConfigError(f"--{dest.replace('_', '-')} {v!r}: empty; allowed: {what}")
