"""Whether two values of one setting configure the same thing: the check behind a repeated --set and a grid
that would run one point twice. Its own module, light to import: the config loader asks it for every --set,
and sweep.py (which brings scipy and a process pool) is what a plain `servesim run` must not load."""

from __future__ import annotations

from typing import Any

from sim.core.errors import ServesimError

_INT_IS_NOT_FLOAT = frozenset({"workload.sample"})  # settings that read an int and a float differently


def same_value(key: str, a: Any, b: Any) -> bool:
    """Whether two values of setting ``key`` configure the same thing, so a grid of both would run one point
    twice: equal values (a bool only as a bool: True is not 1), one number as an int and a float (5 and
    5.0), two spellings of one dtype (``fp8`` and ``fp8_e4m3``), two names of one catalogue model or card."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if key == "hardware.gpu" and a != b:
        from sim.cost.hardware import get_gpu

        try:  # aliases of one catalogue card ("4090", 4090 read as a number, "RTX 4090")
            return get_gpu(str(a)).name == get_gpu(str(b)).name
        except ServesimError:
            return False
    if isinstance(a, int | float) and isinstance(b, int | float):
        # a trace's sample is a count as an int and a fraction as a float: 1 and 1.0 differ there
        return a == b and (type(a) is type(b) or key not in _INT_IS_NOT_FLOAT)
    if isinstance(a, str) and isinstance(b, str) and a != b:
        from sim.cost.modelspec import dtype_format

        name = key.rsplit(".", 1)[-1]
        if name in ("dtype", "kv_cache_dtype"):
            return dtype_format(a) == dtype_format(b)
        if key == "model.name":
            from sim.cost.models import get_model

            try:  # catalogue names resolve to one spec object; a config.json path is its own
                return get_model(a) is get_model(b)
            except ServesimError:
                return False  # the config check names the bad one

        return False
    return type(a) is type(b) and a == b
