"""Typed config values: a TOML value checked against a dataclass field's annotation.

Shared by the run config (sim.app.config) and the policies' own option classes (policies/options.py).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from sim.core.errors import ConfigError


def check_type(where: str, key: str, value: Any, annotation: Any) -> Any:
    """Coerce ints to floats where a float is wanted; reject everything else that does not match.

    ``where`` names the table in the message (e.g. ``[engine]``)."""
    options = annotation_types(annotation)
    if value is None and type(None) in options:
        return None
    for t in options:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is bool and isinstance(value, bool):
            return value
        if t is str and isinstance(value, str):
            return value
    names = " or ".join("null" if t is type(None) else t.__name__ for t in options)
    raise ConfigError(f"{where} {key}: expected {names}, got {value!r}")


def annotation_types(annotation: Any) -> tuple[type, ...]:
    if isinstance(annotation, str):
        annotation = eval(annotation, {"Any": Any})  # annotations are simple builtins here
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(typing.get_args(annotation))
    return (annotation,)
