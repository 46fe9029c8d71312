"""Console tables with fixed number formats: about four significant digits, never scientific notation
(``12346``, ``123.5``, ``7.616``, ``0.042``), yes/no for booleans, ``-`` for missing values."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def fixed(v: Any) -> str:
    """One cell: the number with at most 3 decimals and ~4 significant digits; bools as yes/no."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") in "iu"):
        return str(int(v))
    if isinstance(v, float) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") == "f"):
        v = float(v)
        if not math.isfinite(v):
            return str(v)
        if v == 0:
            return "0"
        decimals = min(3, max(0, 3 - math.floor(math.log10(abs(v)))))
        return f"{v:.{decimals}f}"
    return str(v)


def fixed_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every cell formatted by :func:`fixed` (strings, so pandas prints them as they are)."""
    return df.map(fixed) if hasattr(df, "map") else df.applymap(fixed)


def fixed_table(df: pd.DataFrame, index: bool = False) -> str:
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.max_colwidth", 120):
        return fixed_frame(df).to_string(index=index)
