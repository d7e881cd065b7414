"""One borrowed patch or hook shared by many listeners: made by an owner of its own when the
first listener comes, given back when the last one goes."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .interrupts import uninterrupted
from .owner import Borrowed


class Listeners:
    """One borrowed patch or hook shared by many listeners, who come and go as a tuple.

    The patch is made by `install(owner)` when the first listener arrives. Listeners are kept
    in a tuple that is replaced, never changed, so a dispatch loop running in another thread
    (`for fn in self.listeners`) never sees it change. `keep` keeps the patch when the last
    listener leaves (for a table torch iterates while another thread may change it; the owner
    is still given back by `restore_all()` on unload).
    """

    name = "listeners"
    keep = False

    def __init__(self) -> None:
        self.listeners: tuple[Callable, ...] = ()
        self._owner: Borrowed | None = None
        self._lock = threading.Lock()

    def install(self, owner: Borrowed) -> None:
        raise NotImplementedError

    def add(self, listener: Callable) -> None:
        with uninterrupted(), self._lock:
            self._install_once()
            self.listeners = (*self.listeners, listener)

    def _install_once(self) -> None:
        """The patch made under a new owner if none holds it (the caller holds the lock)."""
        if self._owner is None or not self._owner.active:
            owner = Borrowed(self.name)
            try:
                self.install(owner)
            except BaseException:  # half made: given back, also on Ctrl-C
                owner.restore()
                raise
            self._owner = owner

    def discard(self, listener: Callable) -> None:
        with self._lock:
            self.listeners = tuple(fn for fn in self.listeners if fn is not listener)
            if not self.listeners and not self.keep and self._owner is not None:
                owner, self._owner = self._owner, None
                owner.restore()
