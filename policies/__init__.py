"""Batching policies. ``sim`` is imported first: its guard decides, before any policy module loads,
whether the mypyc-compiled ones may (sim/native.py)."""

import sim  # noqa: F401
