"""Ctrl-C held back while a change and its owner's note of it are made: one step, so that no
hook or patch is ever left with no owner to give it back."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then delivered as it would have been.

    A change and its owner's note of it are one step: a KeyboardInterrupt landing between a
    hook's registration and the owner taking its handle would leave the hook in torch's table
    for good. Python delivers SIGINT to the main thread only, so elsewhere (and inside another
    such block, and where no Python handler is installed) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or getattr(previous, "_holds_ctrl_c", False):
        yield
        return
    caught: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        caught.append((signum, frame))

    hold._holds_ctrl_c = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])  # Python's own handler: raises KeyboardInterrupt here
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
