"""sim/app/heap.py: the collector's state is what it was after a run, whatever happened inside."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from sim.app.heap import frozen, paused
from sim.app.progress import _run, run_env


def test_paused_turns_collection_off_and_restores_it_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused():
        assert not gc.isenabled()
        raise RuntimeError("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        gc.enable()


def test_frozen_hides_what_exists_and_gives_it_back():
    before = gc.get_freeze_count()
    with pytest.raises(ValueError), frozen():
        assert gc.get_freeze_count() > before
        raise ValueError("inside")
    assert gc.get_freeze_count() == 0


def test_a_run_turns_automatic_collection_off_and_collects_its_young_generations_itself():
    """Inside ``frozen`` the collector's own thresholds never fire (they rescanned the run's live objects
    every few hundred allocations); the run loop collects generations 0-1 every ``young_every`` events,
    so a cycle made during the run is freed then, and the collector is on again afterwards."""
    import simpy

    class Node:
        pass

    env = simpy.Environment()
    seen: list[tuple[int, bool, int]] = []  # (event, collector on, cycles freed so far)
    freed: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop":
            freed.append(info["collected"])

    def proc():
        for i in range(40):
            a, b = Node(), Node()
            a.other, b.other = b, a  # garbage only the collector frees
            del a, b
            seen.append((i, gc.isenabled(), sum(freed)))
            yield env.timeout(1.0)

    env.process(proc())
    gc.callbacks.append(on_gc)
    try:
        with frozen() as collect:
            assert collect and not gc.isenabled()
            _run(env, None, None, every=4, young_every=8)
    finally:
        gc.callbacks.remove(on_gc)
    assert gc.isenabled()
    assert not any(on for _, on, _ in seen)
    assert seen[-1][2] >= 2 * 30, "the cycles were freed by the loop's collections, every 8 events"
    assert len(freed) >= 4, "about one collection per 8 of the ~42 events"


def test_run_env_leaves_a_collector_that_was_off_off_and_collects_nothing():
    import simpy

    env = simpy.Environment()

    def proc():
        yield env.timeout(1.0)

    env.process(proc())
    gc.disable()
    freed: list[int] = []
    cb = lambda phase, info: freed.append(1) if phase == "stop" else None  # noqa: E731
    gc.callbacks.append(cb)
    try:
        run_env(env)
        assert not gc.isenabled() and not freed
    finally:
        gc.callbacks.remove(cb)
        gc.enable()


def test_garbage_made_during_a_frozen_run_is_still_collected():
    class Node:
        pass

    with frozen():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        del a, b
        assert gc.collect() >= 2


def test_the_cli_freezes_the_heap_only_as_the_process_ends():
    """The console entry freezes the heap for the interpreter's exit; ``main`` called in-process (a test,
    a notebook, a wrapper calling it again and again) keeps its collector as it was."""
    from sim.cli import main as cli

    gc.unfreeze()
    assert cli.main(["models"]) == 0 and gc.get_freeze_count() == 0 and gc.isenabled()
    code = ("import gc, sys; from sim.cli.main import entry; sys.argv = ['servesim', 'models']; rc = entry(); "
            "print(rc, gc.get_freeze_count() > 0, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 True True"


def test_what_a_run_left_in_cycles_is_finalised_before_the_freeze(tmp_path):
    """A plug-in's finaliser still runs (here it writes a file): before_exit collects before it freezes, as
    frozen garbage is never collected, not even at the interpreter's exit."""
    done = tmp_path / "finalised"
    code = (f"from sim.app.heap import before_exit\nclass Holder:\n    def __init__(self):\n"
            f"        self.me = self\n    def __del__(self):\n        open({str(done)!r}, 'w').write('yes')\n"
            f"Holder()\nbefore_exit()\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert done.read_text() == "yes"


@pytest.mark.parametrize("ctx", [frozen, paused], ids=["frozen", "paused"])
def test_what_a_run_made_goes_to_the_oldest_generation_unscanned(ctx):
    """A run's objects live as long as its result: after the run they sit in the oldest generation, so no
    young collection rescans them (at a 16-replica run's end that was ~60 ms that found nothing); a cycle
    among them is still freed by the next full collection."""

    class Node:
        pass

    scanned: list[int] = []
    cb = lambda phase, info: scanned.append(info["generation"]) if phase == "start" else None  # noqa: E731
    with ctx():
        kept = [Node() for _ in range(1000)]
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
    gc.callbacks.append(cb)
    try:
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert all(id(o) in oldest for o in kept), "left in a young generation: the next collection rescans it"
        gc.collect(1)  # a young collection does not look at them
        assert gc.collect() >= 2, "the run's cycle is freed by a full collection"
    finally:
        gc.callbacks.remove(cb)
    assert scanned == [1, 2]
