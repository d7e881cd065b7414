"""In each rank: where it stands, written to a small status file the notebook reads.

A daemon thread samples the main thread's stack every `INTERVAL` seconds (gloo and DDP release
the GIL while they wait, so the thread runs while the rank is stuck in a collective) and writes
`rank<k>.json` in the run's folder (its fields: rank_status.py's `RankStatus`): the user's
own `file:line`, the collective it is in (if any), a progress count that moves when the stack or
the CPU time moves, what was recorded, the script's last torch.distributed calls
(collectives.py), the exception if the script raised, and how it left (an exit status and the
line of the `sys.exit`). A rank killed in native code (gloo aborting on a collective mismatch,
a segfault) leaves faulthandler's dump of its stacks in `rank<k>.fault`, which
`rank_status.read()` turns into where it was when it died. It runs before the script.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..borrow import Borrowed
from ..job import group_formed
from . import rank_status
from .collectives import CollectiveLog
from .lifeline import TERMINATED, Lifeline
from .where import frames_of, is_user_file, locate, raised_frames

INTERVAL = 0.5  # seconds between samples
_TRACEBACK_LINES = 60  # of a failed rank's traceback, kept in its status
_BUSY_CPU = 0.1  # CPU seconds per second of wall time that count as working (10% of a core)


class Agent:
    """The status writer of one rank; `start()` it before the script, `stop()` after."""

    def __init__(self, folder: str | os.PathLike, rank: int,
                 clock: Callable[[], float] = time.monotonic):
        self.path = rank_status.path(folder, rank)
        self.rank = rank
        self._clock = clock
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = 0
        self._last: tuple[Any, float] | None = None  # (stack signature, CPU time)
        self._extra: rank_status.RankStatus = {}
        self._periodic: list[Callable[[], dict[str, Any] | None]] = []
        self._lock = threading.Lock()
        self.stopping = False
        self.lifeline = Lifeline(folder)
        self.collectives = CollectiveLog(is_user_file)
        self._owner = Borrowed("the ranks' agent: torch.distributed calls counted")
        self._fault: Any = None
        self._formed = False  # a process group was seen: the ranks formed one job

    def every_beat(self, fn: Callable[[], dict[str, Any] | None]) -> None:
        """Call `fn` in the agent's thread at each sample; a dict it returns joins the status."""
        self._periodic.append(fn)

    def at_exit(self, work: Callable[[], Any]) -> None:
        """The rank's last work (its records saved): done once, at the script's end by the
        main thread (`exit_work()`), or by the agent's thread when SIGTERM finds the main thread
        stuck in native code (lifeline.py)."""
        self.lifeline.at_exit(work)

    def exit_work(self) -> Any:
        return self.lifeline.exit_work()

    def start(self) -> Agent:
        """In the main thread, before the script: SIGTERM ends the script, the rank dies with
        the notebook, and the status thread starts."""
        self.lifeline.hold()
        # a death in native code (gloo's abort, a segfault) still says where the rank was
        self._fault = open(self.path.with_suffix(".fault"), "w")  # noqa: SIM115 (kept open)
        faulthandler.enable(file=self._fault, all_threads=True)
        self.collectives.install(self._owner)
        self._write(self._sample())
        self._thread = threading.Thread(target=self._loop, name="singlecard_nb rank agent",
                                        daemon=True)
        self._thread.start()
        return self

    def raised(self, error: BaseException) -> None:
        """The script raised: said before its traceback is printed, so the first rank to fail
        is known even when the others fail a moment later (their peer went away)."""
        self._extra[rank_status.RAISED] = {
            "error": f"{type(error).__name__}: {error}"[:500], "at": time.time(),
            **locate(raised_frames(error)), "traceback": self._traceback(error)}
        self._write(self._sample())

    def left(self, status: int, exit: BaseException | None = None) -> None:
        """The script ended: with `sys.exit(status)` (where it was called) or by running to
        its end (status 0); said at once, so that the first rank to leave is known."""
        place: dict[str, Any] = {"where": None, "function": None, "collective": None}
        if exit is not None:
            place = locate(raised_frames(exit))
        self._extra[rank_status.LEFT] = {"status": status, "at": time.time(), **place}
        self._write(self._sample())

    def _traceback(self, error: BaseException) -> str:
        """The traceback as python prints it, from the script's own first frame on (the
        launcher's and runpy's left out), its middle cut on a deep stack."""
        tb = error.__traceback__
        while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        lines = "".join(traceback.format_exception(
            type(error), error, tb or error.__traceback__)).splitlines()
        if len(lines) > _TRACEBACK_LINES:
            half = _TRACEBACK_LINES // 2
            lines = [*lines[:half], f"  ... {len(lines) - 2 * half} lines ...", *lines[-half:]]
        return "\n".join(line[:300] for line in lines)

    def stop(self, status: int) -> None:
        self.lifeline.exiting.set()  # from here a SIGTERM waits for the exit under way
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * INTERVAL)
        self._extra[rank_status.EXIT] = status
        self.stopping = True  # the last beat: a periodic fn says its last word now
        self._beat()
        self._owner.restore()
        faulthandler.disable()

    # --- the thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            try:
                self._beat()
                why = self.lifeline.why_end()
                if why is not None and not self._stop.is_set():
                    self.lifeline.end_if_stuck(why, self._last_words)
            except Exception as e:  # said, never a silent stop the doctor would read as a hang
                self._failed(e)

    def _failed(self, error: Exception) -> None:
        said = f"{type(error).__name__}: {error}"[:300]
        if self._extra.get(rank_status.AGENT_ERROR) != said:
            self._extra[rank_status.AGENT_ERROR] = said
            print(f"singlecard_nb: rank {self.rank}'s status thread failed ({said}); the hang "
                  "doctor may not see this rank move.", file=sys.__stderr__, flush=True)

    def _last_words(self, why: str) -> None:
        """The status of a rank whose main thread never came back to end it (stuck in a
        collective): it ends here, with SIGTERM's exit status."""
        self._extra.update({rank_status.EXIT: TERMINATED, rank_status.ENDED: why})
        self.stopping = True
        self._beat()

    def _beat(self) -> None:
        for fn in self._periodic:
            try:
                more = fn()
            except Exception as e:  # said in the status, which the notebook shows
                more = {rank_status.AGENT_ERROR: f"{type(e).__name__}: {e}"}
            if more:
                self._extra.update(more)
        self._write(self._sample())

    def _sample(self) -> rank_status.RankStatus:
        frame = sys._current_frames().get(self._main)
        frames = frames_of(frame)
        cpu = time.process_time()
        signature = tuple((f[0], f[1]) for f in frames)
        if self._last is None or signature != self._last[0] \
                or cpu - self._last[1] > _BUSY_CPU * INTERVAL:
            self._progress += 1
        self._last = (signature, cpu)
        self._formed = self._formed or self.collectives.count > 0 or group_formed()
        return {"rank": self.rank, "pid": os.getpid(), "progress": self._progress,
                "time": time.time(), **locate(frames), "formed": self._formed,
                "collectives": self.collectives.snapshot(), **self._extra}  # a RankStatus

    def _write(self, status: rank_status.RankStatus) -> None:
        with self._lock:
            rank_status.write(self.path, status)
