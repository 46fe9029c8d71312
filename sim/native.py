"""The hot modules compiled by mypyc: which ones, how they are built, and how a build is (never wrongly) used.

The engine's per-step work is attribute reads and writes on requests, blocks and plans, row by row.
mypyc compiles these typed modules to C extension modules with native classes, which runs the same
code about 1.3x faster end to end (bench/README.md). ``build()`` (``make native``, which ``make
test``/``demo``/``bench`` run first) compiles ``MODULES`` and moves the extension modules out of the
source tree into ``.native/<python cache tag>/``, with a manifest of the sha256 of every source they
were built from (the compiled modules and the project modules they import, whose types they enforce).

Nothing beside the sources: Python's own import finds only the ``.py`` files, so a checkout of another
commit, a branch, or another Python version can never pick up a build by accident. ``install()``
(called by ``sim/__init__``, before any of these modules can be imported) puts a finder first on
``sys.meta_path`` that loads the compiled modules only when the manifest matches the sources and this
Python; otherwise (an edited source: one warning) and with ``SERVESIM_PURE=1`` everything runs from
the sources, with the same results (tests/test_native.py). The compiled modules share one native
library and reach each other's classes directly, so it is all of them or none.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
MODULES = (
    "sim.core.prefix",
    "sim.core.request",
    "sim.core.batch",
    "sim.core.plan",
    "sim.core.hash_prefixes",
    "sim.kv.block_pool",
    "sim.kv.table",
    "sim.kv.manager",
    "sim.kv.rows",
    "sim.kv.growth",
    "policies.common",
    "policies.vllm",
    "sim.engine.rowpass",
    "sim.engine.runcalc",
    "sim.engine.fastforward",
    "sim.engine.chain",
    "sim.engine.chain_legs",
    "sim.engine.sync_chain",
    "sim.engine.fastforward_async",
    "sim.engine.loop",
    "sim.engine.recorder",
    "sim.engine.step_store",
    "sim.engine.gaps",
    "sim.cost.decode_price",
    "sim.cost.step_price",
    "sim.app.timing",
    "sim.app.gateway",
    "sim.app.inbox",
    "workloads.gen.session_source",
    "routers.view",
    "routers.rotor",
)
PURE_ENV = "SERVESIM_PURE"
PACKAGES = ("sim", "policies", "workloads", "routers")  # where compiled modules live (and where an old in-place build may linger)


def native_dir() -> Path:
    """This Python's build: ``.native/cpython-311/`` (one per interpreter, so they never mix)."""
    return REPO / ".native" / sys.implementation.cache_tag


def source(module: str) -> Path:
    return REPO / (module.replace(".", "/") + ".py")


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so


def _built(module: str) -> Path:
    return native_dir() / (module.replace(".", "/") + _suffix())


def dependencies() -> list[str]:
    """The compiled modules and the project modules they import: the sources a build depends on."""
    import ast  # build time only (imported lazily: every process imports this module)

    deps = set(MODULES)
    for module in MODULES:
        for node in ast.walk(ast.parse(source(module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                deps.add(node.module)
    return sorted(d for d in deps if source(d).exists())


def _fingerprint(modules: list[str] | None = None) -> dict[str, str]:
    """sha256 of each source (``dependencies()`` by default) and the Python the build is for."""
    out = {}
    for m in dependencies() if modules is None else modules:
        try:
            out[m] = hashlib.sha256(source(m).read_bytes()).hexdigest()
        except OSError:
            out[m] = "missing"
    out["python"] = sys.implementation.cache_tag + " " + _suffix()
    return out


def state() -> str:
    """"compiled" (a build for this Python that matches the sources), "stale", or "none"."""
    manifest_path = native_dir() / "manifest.json"
    if not manifest_path.exists():
        return "none"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return "stale"
    recorded = manifest.get("sources")
    if not isinstance(recorded, dict) or not set(MODULES) <= set(recorded):
        return "stale"
    # the sources the build recorded (found by parsing imports at build time, not at every start: a
    # compiled module that imports something new has changed itself, so it is stale either way)
    if recorded != _fingerprint([m for m in recorded if m != "python"]):
        return "stale"
    if not all(_built(m).exists() for m in MODULES):
        return "stale"
    lib = manifest.get("library")
    return "compiled" if isinstance(lib, str) and (native_dir() / lib).exists() else "stale"


class _FromBuild(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from this Python's build (installed only when it matches)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        built = str(_built(fullname))
        return importlib.util.spec_from_file_location(
            fullname, built, loader=importlib.machinery.ExtensionFileLoader(fullname, built))


def active() -> bool:
    """Whether this process imports the compiled modules."""
    return any(isinstance(f, _FromBuild) for f in sys.meta_path)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def pure_setting() -> bool:
    """Whether ``SERVESIM_PURE`` asks for the sources (1 / true / yes / on, any case and spacing). A value
    that is neither that nor 0 / false / no / off / unset warns once and counts as unset: it is read at
    import, before any CLI, so a warning, not an exit."""
    raw = os.environ.get(PURE_ENV)
    if raw is None:
        return False
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v not in _FALSE:
        _warn(f"{PURE_ENV}={raw!r} is not understood; allowed: 1 (run interpreted) or 0 / unset "
              "(the compiled build when it matches); running as if unset")
    return False


def _warn(message: str) -> None:
    """A RuntimeWarning shown as one line, ``servesim:0: RuntimeWarning: MESSAGE`` (warnings.warn would name
    sim/__init__.py and add its source line beneath)."""
    warnings.warn_explicit(message, RuntimeWarning, filename="servesim", lineno=0, module=__name__)


def install() -> None:
    """Before any compiled module is imported: use the build if it matches (once per process)."""
    pure = pure_setting()
    if active() or pure:
        return
    st = state()
    if st == "stale":
        _warn("the compiled modules do not match their sources; running interpreted "
              "(`make native` rebuilds them)")
    if st != "compiled":
        return
    lib = json.loads((native_dir() / "manifest.json").read_text())["library"]
    name = lib.split(".", 1)[0]
    try:  # the shared library first: each compiled module imports it by name
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, native_dir() / lib)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    except (ImportError, OSError, AssertionError) as exc:
        sys.modules.pop(name, None)
        _warn(f"the compiled modules do not load ({exc}); running interpreted")
        return
    sys.meta_path.insert(0, _FromBuild())


def clean() -> None:
    """Remove every build: all Pythons', and any left beside the sources by an older layout."""
    shutil.rmtree(REPO / ".native", ignore_errors=True)
    for package in PACKAGES:
        for ext in (REPO / package).rglob("*.so"):
            ext.unlink()
    for lib in REPO.glob("*__mypyc*"):
        lib.unlink()


def build() -> int:
    """Compile MODULES with mypyc and move the result to ``native_dir()`` with its manifest. Returns 0
    on success; on any failure leaves no build behind (interpreted, same results), says so in one
    line and returns 1."""
    import subprocess  # build time only

    shutil.rmtree(native_dir(), ignore_errors=True)
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None:
        print("servesim native: mypyc not installed; running interpreted")
        return 1
    files = [str(source(m).relative_to(REPO)) for m in MODULES]
    had_build = (REPO / "build").exists()
    # Every float multiply and add stays its own rounding, as in numpy and the interpreter: a C compiler
    # may fuse a * b + c into one FMA (GCC does by default where the target has it, e.g. aarch64),
    # which would change results from machine to machine.
    env = {**os.environ, "CFLAGS": (os.environ.get("CFLAGS", "") + " -ffp-contract=off").strip()}
    proc = subprocess.run([mypyc, "--ignore-missing-imports", "--follow-imports=silent", *files],
                          cwd=REPO, capture_output=True, text=True, env=env)
    if not had_build:  # mypyc's C sources and objects (setuptools' build/): not needed once built
        shutil.rmtree(REPO / "build", ignore_errors=True)
    in_place = [(m, source(m).with_name(source(m).stem + _suffix())) for m in MODULES]
    libs = sorted(REPO.glob("*__mypyc" + _suffix()))
    ok = proc.returncode == 0 and len(libs) == 1 and all(p.exists() for _, p in in_place)
    if ok:
        for module, built in in_place:
            _built(module).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(built, _built(module))
        shutil.move(libs[0], native_dir() / libs[0].name)
        manifest = {"sources": _fingerprint(), "library": libs[0].name}
        (native_dir() / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for _, built in in_place:  # never leave an extension beside its source
        built.unlink(missing_ok=True)
    for lib in libs:
        lib.unlink(missing_ok=True)
    if not ok:
        shutil.rmtree(native_dir(), ignore_errors=True)
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        print(f"servesim native: mypyc failed ({last[0]}); running interpreted")
        return 1
    print(f"servesim native: compiled {len(MODULES)} modules into {native_dir().relative_to(REPO)}")
    return 0
