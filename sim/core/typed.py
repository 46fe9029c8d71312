"""Typed config sections: a frozen dataclass (the runtime form) validated through a pydantic v2 model made
from its fields, so a TOML table is checked by pydantic (strict types, Field constraints, unknown keys) and
every error is still one line naming the section, the key, the value and what is allowed.

The dataclass stays the runtime form (``dataclasses.replace`` and attribute access keep working); its
annotations carry the constraints, e.g. ``max_num_seqs: Annotated[int, Field(ge=1)] | None = None``.
``section_model(cls)`` is the pydantic model (``model_json_schema()`` for editors: ``servesim schema``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticCustomError

from sim.core.errors import ConfigError

# TOML values as they are: no "8" -> 8, no true -> 1; ints are accepted for floats; nan / inf rejected.
STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def _exact_literals(ann: Any) -> Any:
    """``ann`` with each ``Literal[...]`` inside it checked for the options' own types first: pydantic's
    literal check compares by equality, even strict, so ``16.0`` passed as ``16`` and ``true`` as ``1``
    (a block_size of ``true`` ran with 1-token blocks)."""
    origin = typing.get_origin(ann)
    if origin is Literal:
        options = typing.get_args(ann)
        kinds = {type(o) for o in options}
        shown = [repr(o) for o in options]
        expected = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"  # as pydantic says it

        def exact(v: Any) -> Any:
            if type(v) not in kinds:
                raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
            return v

        return typing.Annotated[ann, BeforeValidator(exact)]
    if origin is typing.Annotated:
        inner, *meta = typing.get_args(ann)
        return typing.Annotated[(_exact_literals(inner), *meta)]
    if isinstance(ann, types.UnionType) or origin is typing.Union:
        args = tuple(_exact_literals(a) for a in typing.get_args(ann))
        return typing.Union[args]  # noqa: UP007  (built from a tuple)
    return ann


@functools.cache
def section_model(cls: type) -> type[BaseModel]:
    """The pydantic model of dataclass ``cls``: its user fields (``derived`` ones left out), their
    annotated types and defaults; the field's ``metadata["doc"]`` becomes its description."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("derived"):
            continue
        doc = f.metadata.get("doc")
        ann = _exact_literals(hints[f.name])
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (ann, Field(default=f.default, description=doc))
        else:
            fields[f.name] = (ann, Field(default_factory=f.default_factory, description=doc))
    return create_model(f"{cls.__name__}Model", __config__=STRICT, __doc__=cls.__doc__, **fields)


def validate_table(cls: type, where: str, raw: Any, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """``raw`` (a TOML table) checked against ``cls``'s model; returns the given keys, coerced (int ->
    float). ``keys``: the names offered for "did you mean" (default: the model's fields)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table, got {raw!r}")
    model = section_model(cls)
    try:
        m = model.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError(error_line(where, exc.errors()[0], cls, keys)) from None
    return {k: getattr(m, k) for k in raw}


def build(cls: type, where: str, raw: Any) -> Any:
    """A ``cls`` instance from a TOML table, validated (see validate_table)."""
    return cls(**validate_table(cls, where, raw))


def check_value(where: str, key: str, value: Any, annotation: Any) -> Any:
    """One value against a type (e.g. an engine-native alias of a shared limit), with the same messages."""
    model = _value_model(key, annotation)
    try:
        return getattr(model.model_validate({key: value}), key)
    except ValidationError as exc:
        raise ConfigError(error_line(where, exc.errors()[0], None, None, {key: annotation})) from None


@functools.cache
def _value_model(key: str, annotation: Any) -> type[BaseModel]:
    return create_model("Value", __config__=STRICT, **{key: (_exact_literals(annotation), ...)})


# ---- one line per error ---------------------------------------------------------------------------------
_TYPE_ERRORS = {"int_type", "int_from_float", "float_type", "bool_type", "string_type", "dict_type",
                "list_type", "none_required", "int_parsing", "float_parsing", "bool_parsing"}  # fmt: skip
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}


def error_line(where: str, err: Mapping[str, Any], cls: type | None, keys: Iterable[str] | None = None,
               hints: Mapping[str, Any] | None = None) -> str:
    """pydantic's error as ``[section] key: what was wrong, got VALUE; allowed ...``."""
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    value = err["input"]
    if hints is None and cls is not None:
        hints = typing.get_type_hints(cls, include_extras=True)
    hints = hints or {}
    ann = hints.get(loc[0]) if loc else None
    kind = err["type"]
    if kind == "extra_forbidden":
        known = list(keys) if keys is not None else list(section_model(cls).model_fields) if cls else []
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{where} unknown key {key!r}; {hint}known keys: {', '.join(known)}"
    if kind in _BOUNDS:
        lo, hi, lo_open, hi_open = _bounds(ann)
        if lo is None and hi is None:  # a knob whose range its preset checks after (NaN, inf: no number at all)
            return f"{where} {key}: must be a finite number, got {_show(value)}"
        allowed = _range(lo, hi, lo_open, hi_open, _unit(loc[-1], _description(cls, loc[0]) or ""))
        head = "must be a finite number" if kind == "finite_number" else "out of range"
        return f"{where} {key}: {head}, got {_show(value)}; allowed {allowed}"
    if kind == "literal_error":
        return f"{where} {key}: got {value!r}; allowed {err['ctx']['expected']}"
    if kind == "string_pattern_mismatch":
        doc = _description(cls, loc[0]) or f"a string matching {err['ctx']['pattern']}"
        return f"{where} {key}: expected {doc}, got {value!r}"
    if kind in _TYPE_ERRORS:
        inner = hints.get(loc[0]) if len(loc) == 1 else _value_type(ann)
        doc = _description(cls, loc[0]) if len(loc) == 1 else None
        return f"{where} {key}: expected {_type_names(inner)}{f' ({doc})' if doc else ''}, got {value!r}"
    return f"{where} {key}: {err['msg'].lower()}, got {value!r}"


def _show(value: Any) -> str:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)


def _unit(key: str, doc: str) -> str:
    """From the name (``_s``, ``_gib``) or a description that starts with its unit."""
    if key.endswith("_s") or doc.startswith("seconds"):
        return "seconds"
    return "GiB" if key.endswith("_gib") else ""


def _num(v: Any) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"  # an int bound in full (2147483647, not 2.14748e+09)


def _range(lo: Any, hi: Any, lo_open: bool, hi_open: bool, unit: str) -> str:
    if lo is not None and hi is None:
        text = f"value {'>' if lo_open else '>='} {_num(lo)}"
    else:
        text = (f"{_num(lo)} {'<' if lo_open else '<='} " if lo is not None else "") + "value"
        text += f" {'<' if hi_open else '<='} {_num(hi)}" if hi is not None else ""
    return text + (f" {unit}" if unit else "")


def _walk(ann: Any) -> Iterable[Any]:
    """Every type and constraint inside an annotation (unions, Annotated, dict values)."""
    yield ann
    for a in typing.get_args(ann):
        yield from _walk(a)
    for m in getattr(ann, "__metadata__", ()):
        yield m
        yield from getattr(m, "metadata", ())


def _bounds(ann: Any) -> tuple[Any, Any, bool, bool]:
    lo = hi = None
    lo_open = hi_open = False
    for m in _walk(ann):
        if isinstance(m, at.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, at.Ge):
            lo, lo_open = m.ge, False
        elif isinstance(m, at.Lt):
            hi, hi_open = m.lt, True
        elif isinstance(m, at.Le):
            hi, hi_open = m.le, False
    return lo, hi, lo_open, hi_open


def _value_type(ann: Any) -> Any:
    """``dict[str, X]`` -> X (a bad value inside a table)."""
    for a in _walk(ann):
        if typing.get_origin(a) is dict:
            return typing.get_args(a)[1]
    return ann


_NAMES = {int: "int", float: "float", str: "str", bool: "bool", type(None): "null", dict: "a table",
          list: "an array"}  # fmt: skip


def _type_names(ann: Any) -> str:
    """``Annotated[int, ...] | None`` -> ``int or null``."""
    if typing.get_origin(ann) is typing.Annotated:
        return _type_names(typing.get_args(ann)[0])
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        return " or ".join(_type_names(a) for a in typing.get_args(ann))
    if typing.get_origin(ann) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(ann))
    origin = typing.get_origin(ann) or ann
    return _NAMES.get(origin, getattr(origin, "__name__", str(origin)))


def _description(cls: type | None, key: str) -> str | None:
    if cls is None:
        return None
    f = section_model(cls).model_fields.get(key)
    return f.description if f is not None else None
