"""The hot modules compiled by mypyc: which ones, how they are built, and a guard against stale builds.

The engine's per-step work is attribute reads and writes on requests, blocks and plans, row by row.
mypyc compiles these typed modules to C extension modules with native classes, which runs the same
code about 1.3x faster end to end (bench/README.md). ``build()`` (``make native``, which ``make test``/``demo`` run first)
compiles ``MODULES`` beside their sources and records each source's sha256 in ``native_manifest.json``;
without mypyc, or when compiling fails, everything runs interpreted, with the same results.

Python imports an extension module in preference to its source, even after the source has changed.
``install()`` (called by ``sim/__init__``, before any of these modules can be imported) checks the
manifest against the sources and, if any differs, puts a finder first on ``sys.meta_path`` that loads
every compiled module from its source: the compiled modules share one native library and reach each
other's classes directly, so it is all of them or none. ``SERVESIM_PURE=1`` does the same on purpose
(tests/test_native.py compares the two). A stale build never runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
MANIFEST = Path(__file__).with_name("native_manifest.json")
MODULES = (
    "sim.core.prefix",
    "sim.core.request",
    "sim.core.batch",
    "sim.core.policy",
    "sim.core.hash_prefixes",
    "sim.kv.block_pool",
    "sim.kv.manager",
    "sim.kv.rows",
    "sim.kv.growth",
    "policies.common",
    "policies.vllm",
    "sim.engine.rowpass",
)
PURE_ENV = "SERVESIM_PURE"


def source(module: str) -> Path:
    return REPO / (module.replace(".", "/") + ".py")


def extensions(module: str) -> list[Path]:
    """The extension modules built for ``module`` (``request.cpython-311-x86_64-linux-gnu.so``, ...)."""
    src = source(module)
    return [src.with_name(src.stem + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if src.with_name(src.stem + suffix).exists()]


def _digest(module: str) -> str:
    return hashlib.sha256(source(module).read_bytes()).hexdigest()


def state() -> str:
    """"compiled" (a build that matches the sources), "stale" (built from other sources), or "none"."""
    built = [m for m in MODULES if extensions(m)]
    if not built:
        return "none"
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return "stale"
    if len(built) != len(MODULES) or any(manifest.get(m) != _digest(m) for m in MODULES):
        return "stale"
    return "compiled"


class _FromSource(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from their sources (a stale build, or SERVESIM_PURE=1)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


def active() -> bool:
    """Whether the compiled modules are the ones imported in this process."""
    return not any(isinstance(f, _FromSource) for f in sys.meta_path) and state() == "compiled"


def install() -> None:
    """Before any compiled module is imported: fall back to the sources when the build is stale or
    SERVESIM_PURE=1 asks for it (once per process)."""
    if any(isinstance(f, _FromSource) for f in sys.meta_path):
        return
    st = state()
    if st == "none":
        return
    pure = os.environ.get(PURE_ENV) == "1"
    if st == "stale" and not pure:
        warnings.warn("servesim: the compiled modules do not match their sources; running interpreted "
                      "(`make native` rebuilds them)", RuntimeWarning, stacklevel=2)
    if st == "stale" or pure:
        sys.meta_path.insert(0, _FromSource())
    else:
        _load_shared_library()


def _load_shared_library() -> None:
    """The compiled modules' shared library (``<hash>__mypyc``) sits at the repository root, which is on
    ``sys.path`` only when Python starts there; an installed ``servesim`` started elsewhere finds the
    packages through the editable install, not it: so it is loaded by path, once."""
    for lib in sorted(REPO.glob("*__mypyc.*")):
        name = lib.name.split(".", 1)[0]
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, lib)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def clean() -> None:
    for m in MODULES:
        for ext in extensions(m):
            ext.unlink()
    for p in REPO.glob("*__mypyc*"):
        p.unlink()
    MANIFEST.unlink(missing_ok=True)


def build() -> int:
    """Compile MODULES with mypyc in place and write the manifest; on any failure, leave no build
    behind (interpreted, same results) and say so in one line. Returns 0 either way."""
    clean()
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None:
        print("servesim native: mypyc not installed; running interpreted")
        return 0
    files = [str(source(m).relative_to(REPO)) for m in MODULES]
    env = {**os.environ, "MYPYC_OPT_LEVEL": os.environ.get("MYPYC_OPT_LEVEL", "3")}
    had_build = (REPO / "build").exists()
    proc = subprocess.run([mypyc, "--ignore-missing-imports", "--follow-imports=silent", *files],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if not had_build:  # mypyc's C sources and objects (setuptools' build/): not needed once built
        shutil.rmtree(REPO / "build", ignore_errors=True)
    if proc.returncode != 0 or any(not extensions(m) for m in MODULES):
        clean()
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        print(f"servesim native: mypyc failed ({last[0]}); running interpreted")
        return 0
    MANIFEST.write_text(json.dumps({m: _digest(m) for m in MODULES}, indent=1) + "\n")
    print(f"servesim native: compiled {len(MODULES)} modules")
    return 0

