"""sim/app/heap.py: the collector's state is what it was after a run, whatever happened inside."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from sim.app.heap import frozen, paused


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


def test_garbage_made_during_a_frozen_run_is_still_collected():
    class Node:
        pass

    with frozen():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        del a, b
        assert gc.collect() >= 2


def test_the_cli_freezes_the_heap_only_when_it_is_the_process():
    """``main()`` of a process (no argv) freezes the heap for the interpreter's exit; a test or a notebook
    calling ``main(argv)`` in-process keeps its collector as it was."""
    from sim.cli import main as cli

    gc.unfreeze()
    assert cli.main(["models"]) == 0 and gc.get_freeze_count() == 0
    code = ("import gc, sys; from sim.cli.main import main; sys.argv = ['servesim', 'models']; rc = main(); "
            "print(rc, gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 True"
