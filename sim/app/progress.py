"""Progress bars (tqdm) on stderr for commands that can take a while: a run over a long trace, size, sweep.

Shown only when asked (the CLI asks unless ``--quiet``) and stderr is a terminal, so pipes, logs and tests
see nothing. A run's bar is driven between SimPy steps, not from the engine: :func:`run_env` is SimPy's own
``Environment.run`` loop with a counter read every ``EVERY`` events (a check per thousand events; the
events, their order and so the results are exactly those of ``env.run()``). A lone engine takes only
one wait in 16 as an event (sim/engine/loop.py ``Engine.jump``), so its bar moves every ~16k waits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import simpy
from simpy.core import EmptySchedule

from sim.app.heap import YOUNG_EVERY, collect_young, frozen
from sim.app.timing import run_steps

if TYPE_CHECKING:
    from tqdm import tqdm

EVERY = 1024  # SimPy events between two reads of the counter
DELAY_S = 2.0  # a run's bar appears only once it has taken this long (quick runs stay silent)


def wanted(quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether to draw: not ``--quiet``, and stderr (or ``stream``) is a terminal."""
    s = stream if stream is not None else sys.stderr
    isatty = getattr(s, "isatty", None)
    return not quiet and bool(isatty and isatty())


class _NoBar:
    """What a disabled bar is: every call does nothing (and tqdm is not even imported)."""

    disable = True

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int | None, desc: str, *, enabled: bool, stream: TextIO | None = None, unit: str = "it",
        delay: float = 0.0, leave: bool = True) -> tqdm | _NoBar:  # fmt: skip
    """A tqdm bar on stderr; disabled, a no-op stand-in, so a command that draws no bar never loads tqdm."""
    if not enabled:
        return _NoBar()
    check_env()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=stream if stream is not None else sys.stderr,
                delay=delay, leave=leave, dynamic_ncols=True, smoothing=0.1)  # fmt: skip


def check_env() -> None:
    """tqdm reads ``TQDM_*`` environment variables into its bars' settings and raises on one it cannot
    read (``TQDM_MININTERVAL=abc``): said in one line, naming them, before any work, where a bar is drawn."""
    names = sorted(k for k in os.environ if k.startswith("TQDM_"))
    if not names:
        return
    import io

    try:  # tqdm applies them when its class is made (the import) and again to each bar
        from tqdm import tqdm

        tqdm(total=1, file=io.StringIO(), disable=True).close()
    except (ValueError, TypeError) as exc:
        from sim.core.errors import ConfigError

        shown = ", ".join(f"{k}={os.environ[k]!r}" for k in names)
        raise ConfigError(f"progress bar: tqdm cannot read its environment ({shown}): {exc}; fix or unset "
                          "the variable, or leave the bar off") from None


def run_env(env: simpy.Environment, progress: tqdm | _NoBar | None = None, count: Callable[[], int] | None = None,
            every: int = EVERY) -> None:  # fmt: skip
    """``env.run()`` (no ``until``), updating ``progress`` to ``count()`` every ``every`` events; what
    exists when the run starts is kept out of the garbage collector's scans, and the young generations
    are collected every YOUNG_EVERY events instead of by the collector's own thresholds (sim/app/heap.py)."""
    with frozen() as collect:
        _run(env, progress, count, every, YOUNG_EVERY if collect else 0)


def _simpys_step(fn: object) -> bool:
    """Whether ``fn`` is SimPy's own ``Environment.step`` (not a replacement, set before or after this
    module was imported)."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == simpy.core.__file__ and fn.__qualname__ == "Environment.step"  # type: ignore[attr-defined]


def _run(env: simpy.Environment, progress: tqdm | _NoBar | None, count: Callable[[], int] | None,
         every: int, young_every: int = 0) -> None:  # fmt: skip
    """SimPy's run loop (``Environment.run`` steps until the schedule is empty), in chunks of ``every``
    events: between chunks the bar is updated and, every ``young_every`` events (0: never), the young
    generations collected."""
    pb = progress if progress is not None and not progress.disable and count is not None else None
    step, done, since = env.step, 0, 0
    # SimPy's own step on its own Environment: taken by the compiled run_steps (same steps, no interpreted
    # call per event); a subclass, or a step replaced on the class or the instance, is called as it is
    plain = type(env) is simpy.Environment and _simpys_step(getattr(env.step, "__func__", None))
    try:
        while True:
            if plain:
                run_steps(env, every)
            else:
                for _ in range(every):
                    step()
            if pb is not None:
                n = count()
                pb.update(n - done)
                done = n
                pb.set_postfix_str(f"t={env.now:.0f} s", refresh=False)
            since += every
            if young_every and since >= young_every:
                collect_young()
                since = 0
    except EmptySchedule:
        pass
    finally:
        if pb is not None:
            pb.update(count() - done)
            pb.close()


def run_bar(what: Any, desc: str, enabled: bool) -> tqdm | None:
    """The bar of one simulated run of ``what`` (a workload: its length is the total)."""
    if not enabled:
        return None
    total = len(what) if hasattr(what, "__len__") else None
    return bar(total, desc, enabled=True, unit="req", delay=DELAY_S, leave=False)
