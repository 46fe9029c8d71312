"""servesim's simulator. Importing it first installs the guard that keeps a stale mypyc build of the hot
modules from running (sim/native.py)."""

from sim import native as _native

_native.install()
