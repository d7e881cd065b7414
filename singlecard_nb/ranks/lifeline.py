"""How a rank ends: with the notebook, or when asked, its own exit work done once.

Stopping is torchrun's (torch elastic's `SubprocessContext._close`): the notebook sends SIGTERM,
waits a bounded time shared by all ranks, then SIGKILLs (run.py). In the rank:
- SIGTERM raises `SystemExit(143)` in the main thread, so the script's `finally` and atexit run
  and the rank saves its records at its own exit (cli main's `finally`); its DataLoader
  workers, stopped with it (one session), raise nothing over that exit;
- the rank dies with the notebook: Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG)`,
  SIGTERM), and the agent's beat watches the parent's pid for platforms without it;
- a main thread stuck in native code (a collective that never completes) runs no signal
  handler: the agent's thread, told by the notebook's stop file or finding its parent gone,
  gives the main thread `STUCK` seconds, then does the exit work itself and ends the process.
Standard library only: it runs before the script.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARENT = "SINGLECARD_NB_PARENT"  # the notebook's pid (launch.plan): a rank dies with it
STOP_FILE = "stop"  # written by the notebook before its SIGTERM
TERMINATED = 128 + signal.SIGTERM  # the exit status of a rank stopped by SIGTERM, as a shell says
STUCK = 1.0  # seconds the main thread has to begin its exit after SIGTERM
GRACE = 10.0  # seconds the notebook waits after SIGTERM before SIGKILL (torchrun: 30)
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """SIGTERM to this process when `parent` goes (Linux); True when the kernel will send it.
    A parent already gone (it died before this ran) is answered at once."""
    armed = False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl (macOS): the agent's watch of the pid remains
        pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return armed


class Lifeline:
    """One rank's tie to the notebook; `hold()` it in the main thread before the script."""

    def __init__(self, folder: str | os.PathLike, parent: int | None = None):
        self.stop_file = Path(folder) / STOP_FILE
        self.parent = parent if parent is not None else _parent_from_environment()
        self.exiting = threading.Event()  # the main thread began its exit: it does the work
        self._work: Callable[[], Any] | None = None
        self._work_lock = threading.Lock()
        self._work_done = False
        self._ending_since: float | None = None

    def hold(self) -> None:
        signal.signal(signal.SIGTERM, self._terminated)
        die_with_parent(self.parent)

    def _terminated(self, signum: int, frame: Any) -> None:
        if not self.exiting.is_set():  # a save under way at exit is left to finish
            # What the rank started in its session (DataLoader workers) got this SIGTERM too:
            # their deaths are this stop, not the error DataLoader's SIGCHLD handler would
            # raise over the SystemExit (a RuntimeError traceback in every stopped rank). A
            # handler that does nothing, not SIG_DFL: Python prints "Signal 17 ignored due to
            # race condition" for a SIGCHLD received before the change and run after it.
            if hasattr(signal, "SIGCHLD"):
                signal.signal(signal.SIGCHLD, _stopped_with_the_rank)
            raise SystemExit(TERMINATED)

    def at_exit(self, work: Callable[[], Any]) -> None:
        """What the rank does last (its records saved), by whichever thread gets there."""
        self._work = work

    def exit_work(self) -> Any:
        """Run the exit work once; its result (None when it had been done, or there is none)."""
        with self._work_lock:
            if self._work_done or self._work is None:
                return None
            self._work_done = True
            return self._work()

    # --- in the agent's thread --------------------------------------------------------------
    def why_end(self) -> str | None:
        """"parent gone" or "asked to stop" once either holds; None while the rank goes on."""
        if os.getppid() != self.parent:
            return "parent gone"
        if self.stop_file.exists():
            return "asked to stop"
        return None

    def end_if_stuck(self, why: str, last_words: Callable[[str], None]) -> None:
        """The main thread had `STUCK` seconds (`GRACE` where the script handles SIGTERM
        itself) to begin its exit; if it did not, do the exit work here and end the process."""
        if self._ending_since is None:
            self._ending_since = time.monotonic()
            if why == "parent gone":
                os.kill(os.getpid(), signal.SIGTERM)  # where no parent-death signal was armed
        ours = signal.getsignal(signal.SIGTERM) == self._terminated
        left = (STUCK if ours else GRACE) - (time.monotonic() - self._ending_since)
        if self.exiting.wait(max(left, 0.0)):  # the main thread's exit is under way
            if why != "parent gone":
                return
            time.sleep(GRACE)  # an orphan ends within GRACE, whatever its exit does
            _end_now()
        if not ours and why != "parent gone":
            return  # the notebook's SIGKILL comes at its GRACE
        try:
            self.exit_work()
            last_words(why)
        finally:
            _end_now()


def _stopped_with_the_rank(signum: int, frame: Any) -> None:
    """SIGCHLD while the rank stops: a child of its session ended with it; nothing to do."""


def _parent_from_environment() -> int:
    try:
        return int(os.environ[PARENT])
    except (KeyError, ValueError):  # started by torchrun itself: its agent is the parent
        return os.getppid()


def _end_now() -> None:
    """This process, and what it started in its session (DataLoader workers), gone."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(TERMINATED)
