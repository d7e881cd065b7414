"""What code leaves Python's garbage collector to track: the measure of the tests that hold
a recorded step, and the ranking's read of a run, to few long-lived objects."""

from __future__ import annotations

import gc
from collections.abc import Callable


def objects_left_by(run: Callable[[], object]) -> int:
    """Objects the collector tracks that `run()` made and left alive, once a collection of the
    youngest generation has untracked what it can (tuples of numbers and strings): those it
    would count as long-lived. Everything older is out of sight (frozen) meanwhile."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # what run() makes stays in the youngest generation
    gc.freeze()  # and every older object out of gc.get_objects()'s sight
    try:
        run()
        gc.collect(0)  # untracks tuples of atomic values, as every collection does
        return len(gc.get_objects())
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
