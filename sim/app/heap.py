"""The garbage collector around a run: what the engine holds for a whole run is not rescanned.

CPython's cyclic collector scans every tracked object at each full collection, and it runs one each
time the objects that survived since the last grow by a quarter. A run holds tens of thousands of
objects that live as long as it does (each replica's KV blocks, ~29k on an 80 GB card; the workload's
requests), so each full collection rescans them all, and a 16-replica cluster spends ~6 % of its wall
time there (bench/README.md). None of them is garbage before the run ends, so:

* ``paused()`` turns collection off while the engines are built (a burst of allocations that makes no
  garbage; collections resume after it) and hands what it made to the oldest generation unscanned
  (``to_oldest``): 16 replicas' blocks were otherwise scanned by the first young collection after it;
* ``frozen()`` moves everything alive when the run starts out of the collector's sight
  (``gc.freeze``) and back at the end (``gc.unfreeze``), with what the run made, into the oldest
  generation (``to_oldest``), so garbage made before or during the run is still collected afterwards, by
  the next full collection; inside, the collector does not run on its own: the run loop collects the
  young generations every ``YOUNG_EVERY`` events instead (sim/app/progress.py). Automatic collections
  rescanned the run's own live objects (requests in flight, their specs, segments and block hashes, a
  session's future turns) every few hundred allocations while the run made no cyclic garbage at all:
  ~8 % of a sessions run, ~5 % with shared prefixes, ~2 % plain Poisson (bench/paths.py, n = 20,000,
  timed with gc.callbacks); after a 20,000-request sessions run a full collection finds the same
  objects with or without them (30,949 / 30,962). The periodic collection bounds what a plug-in that
  makes cycles can leave before the run ends.

Results do not depend on either: nothing in the simulator has a finaliser or a weak reference.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """No collections inside (restores whether the collector was on); what exists at the end goes to the
    oldest generation (``to_oldest``)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        to_oldest()
        if was_on:
            gc.enable()


def to_oldest() -> None:
    """Move every tracked object to the oldest generation without scanning it (``gc.freeze`` then
    ``gc.unfreeze``; a frozen set from an enclosing ``frozen`` is moved too, which only the young
    collections inside it, never the oldest, would have skipped).

    A run's objects live as long as its result: left young, each would be scanned by the next young
    collection and again by the next middle one before reaching the oldest generation, which at a run's
    end was 60-70 ms of a 3 s sessions or 16-replica run (bench/paths.py, n = 20,000, gc.callbacks) and
    found nothing (0 collected). The oldest generation is scanned only by full collections, which still
    free any cycle among them."""
    gc.freeze()
    gc.unfreeze()


# events of a run between two collections of the young generations (run_env); a lone engine's run makes one
# event per 16 waits (sim/engine/loop.py Engine.jump): ~4M waits, ~2M quickstart requests
YOUNG_EVERY = 1 << 18


@contextmanager
def frozen() -> Iterator[bool]:
    """What is alive on entry is not scanned until exit (``gc.freeze`` / ``gc.unfreeze``), and no
    automatic collection happens inside. Yields whether the collector was on: the caller then collects
    the young generations now and then (``collect_young``)."""
    gc.freeze()
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield was_on
    finally:
        to_oldest()
        if was_on:
            gc.enable()


def collect_young() -> None:
    """Collect what the run made since the last time (generations 0 and 1; survivors go to the oldest,
    which is not collected again before the run ends)."""
    gc.collect(1)


def before_exit() -> None:
    """The process is about to end: collect once, then freeze what is left, so the interpreter's
    shutdown, which collects while it tears the modules down, does not scan every object again (a
    quickstart run of 2,000 requests: 0.095-0.112 s from the command's end to the process's, 0.045-0.048 s
    with this, of which the collection is 0.022-0.024 s). The collection runs the finalisers of what the run left in cycles (a plug-in's open log file
    among them: frozen garbage is never collected); what is alive is freed as its module goes. Only for
    a process that ends here (the console entry, ``sim.cli.main.entry``), never a library call."""
    gc.collect()
    gc.freeze()
