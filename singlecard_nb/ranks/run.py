"""Start the N ranks, bring their output back as it comes, and stop every one of them.

`RankJob(ranks, folder).run()` starts each rank in its own session (so one signal reaches the
rank and whatever it started, DataLoader workers included), reads its stdout and stderr in
threads, and in the calling thread: echoes each line prefixed `[rank k]`, watches the exits
and the ranks' statuses (rank_status.py), and decides:
- all exited 0: done;
- one exited with an error: stop the others, raise `RankFailed` (which rank, where the others
  waited);
- no rank moved for `hang_after` seconds: stop every rank, raise `RanksHang`;
- Ctrl-C (KeyboardInterrupt in the calling thread): stop every rank, re-raise.
Stopping is torchrun's, in `finally`, with Ctrl-C held back until it is done (every wait has
a deadline): a stop file and SIGTERM to each rank's process group (the rank's `finally` and
atexit run, and it saves its own records: lifeline.py), one wait of `lifeline.GRACE` seconds
shared by all ranks, then SIGKILL to any still running, each step said; so no child, socket or
port outlives the run. A failure is reported once the others are stopped, their output drained.
Each rank also dies with the notebook (its parent-death signal), should the notebook be killed.

Why not torch elastic's `start_processes` (torchrun's engine): its `PContext.start()`, called in
the notebook's main thread, takes SIGTERM, SIGINT, SIGHUP and SIGQUIT for good (Ctrl-C would
raise its SignalException instead of KeyboardInterrupt in every later cell); each rank's
environment is the notebook's `os.environ` updated, so a variable the plan leaves out (the
notebook's own pin) comes back; output reaches the parent only through log files; and its
`wait()` stops the other ranks itself at a failure, before their statuses say where they
waited. Its stopping (`SubprocessContext._close`) is what `stop()` does.
"""

from __future__ import annotations

import codecs
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ..borrow import uninterrupted
from . import agent, doctor, lifeline, rank_status
from .launch import Rank

POLL = 0.1  # seconds between looks at exits and statuses
_DRAIN = 1.0  # seconds the output of stopped ranks has to arrive (their pipes close at exit)


class RankJob:
    """One run of N ranks.

    echo(rank, line, stream): shows a line of a rank's output ("stdout" or "stderr"); a line
    redrawn in place (tqdm's `\r`) comes as "\r" + its latest state, then "\r" when it ends.
    on_status(statuses): called every `status_every` seconds with every rank's latest status
    (the ranks' agents write theirs twice a second).
    """

    def __init__(self, ranks: Sequence[Rank], folder: str, hang_after: float = 60.0,
                 echo: Callable[[int, str, str], None] | None = None,
                 on_status: Callable[[dict[int, Any]], None] | None = None,
                 cwd: str | None = None, status_every: float = agent.INTERVAL,
                 say: Callable[[str], None] | None = None, grace: float = lifeline.GRACE):
        self.ranks = list(ranks)
        self.folder = folder
        self.hang_after = hang_after
        self.echo = echo or _print
        self.on_status = on_status
        self.cwd = cwd
        self.status_every = status_every
        self.say = say or _say
        self.grace = grace
        self.processes: dict[int, subprocess.Popen] = {}
        self._lines: queue.Queue[tuple[int, str, str]] = queue.Queue()
        self._readers: list[threading.Thread] = []
        self.said: dict[int, str] = {}  # what a rank printed of a collective mismatch
        self._statuses = rank_status.Statuses(folder, [spec.rank for spec in self.ranks])

    def run(self) -> dict[int, int]:
        """Run to the end; {rank: exit status} (all 0), or raise as the module says."""
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame)
        try:
            for spec in self.ranks:
                self._start(spec)
            return self._watch()
        finally:
            # A second Ctrl-C (people press it again when a stop takes a moment) waits until
            # every rank is killed and reaped; it would otherwise leave ranks running.
            with uninterrupted():
                self.stop()
                self._drain()  # what they said as they stopped (their `finally`'s words)

    # --- starting ---------------------------------------------------------------------------
    def _start(self, spec: Rank) -> None:
        process = subprocess.Popen(
            list(spec.argv), env=dict(spec.environ), cwd=self.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.processes[spec.rank] = process
        for stream, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            reader = threading.Thread(target=self._read, args=(spec.rank, stream, name),
                                      name=f"[rank {spec.rank}] {name}", daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read(self, rank: int, stream: IO[bytes], name: str) -> None:
        lines = Lines()
        read = getattr(stream, "read1", stream.read)  # what has come, without waiting for more
        while chunk := read(65536):
            for line in lines.feed(chunk):
                self._lines.put((rank, line, name))
        for line in lines.feed(b"", final=True):
            self._lines.put((rank, line, name))
        stream.close()

    # --- watching ---------------------------------------------------------------------------
    def _watch(self) -> dict[int, int]:
        __tracebackhide__ = True  # noqa: F841
        moved = {r: time.monotonic() for r in self.processes}  # last progress of each rank
        progress: dict[int, Any] = {}
        told = 0.0
        exited: set[int] = set()
        while True:
            printed = self._echo_waiting()
            codes = {r: p.poll() for r, p in self.processes.items()}
            statuses = self._statuses.read()
            now = time.monotonic()
            for r, status in statuses.items():
                mark = None if status is None else status.get(rank_status.PROGRESS)
                ended = codes[r] is not None and r not in exited  # an exit moves once
                # Starting Python and torch is no hang: a rank's clock starts at its first word
                starting = status is None and codes[r] is None
                if mark != progress.get(r) or r in printed or ended or starting:
                    progress[r], moved[r] = mark, now
                if ended:
                    exited.add(r)
            if self.on_status is not None and now - told >= self.status_every:
                told = now
                self.on_status(statuses)
            if any(c not in (None, 0) for c in codes.values()):
                statuses = self._fresh(statuses)
                codes = {r: p.poll() for r, p in self.processes.items()}
                failed = doctor.first_failed(statuses, codes)
                self.stop()
                self._drain()
                if failed is None:  # no word from any: the first non-zero exit
                    failed = min(r for r, c in codes.items() if c not in (None, 0))
                raise doctor.RankFailed(doctor.failure_report(failed, statuses, codes, self.said))
            if all(c is not None for c in codes.values()):
                self._drain()
                return codes
            if now - max(moved.values()) >= self.hang_after:
                self.stop()
                self._drain()
                raise doctor.RanksHang(doctor.hang_report(statuses, codes, self.hang_after))

    def _fresh(self, statuses: dict[int, Any]) -> dict[int, Any]:
        """Each running rank's status written after this moment (its agent writes one every
        INTERVAL), so that no status older than the failure is reported as where it is."""
        since, deadline = time.time(), time.monotonic() + agent.INTERVAL + 2 * POLL
        while True:
            stale = [r for r, p in self.processes.items()
                     if p.poll() is None and (statuses.get(r) or {}).get(rank_status.TIME, 0.0) < since]
            if not stale or time.monotonic() >= deadline:
                return statuses
            time.sleep(POLL)
            statuses = self._statuses.read()

    def _show(self, rank: int, line: str, stream: str) -> None:
        if rank not in self.said and any(w in line for w in doctor.MISMATCH_WORDS):
            self.said[rank] = line  # gloo's abort: read by the report
        self.echo(rank, line, stream)

    def _echo_waiting(self) -> set[int]:
        """Echo the lines that came within POLL seconds; the ranks that wrote them."""
        printed: set[int] = set()
        try:
            rank, line, stream = self._lines.get(timeout=POLL)
        except queue.Empty:
            return printed
        while True:
            self._show(rank, line, stream)
            printed.add(rank)
            try:
                rank, line, stream = self._lines.get_nowait()
            except queue.Empty:
                return printed

    def _drain(self) -> None:
        """The output the ranks wrote before they exited (their pipes close at exit), within
        `_DRAIN` seconds shared by all (a grandchild that left the rank's session may hold a
        pipe open)."""
        deadline = time.monotonic() + _DRAIN
        for reader in self._readers:
            reader.join(timeout=max(deadline - time.monotonic(), 0.0))
        while True:
            try:
                self._show(*self._lines.get_nowait())
            except queue.Empty:
                return

    # --- stopping ---------------------------------------------------------------------------
    def stop(self) -> None:
        """torchrun's stop: SIGTERM to every running rank's process group, one bounded wait
        shared by all, then SIGKILL; what each rank started gone with its session; each step
        said. Idempotent (a second call finds nothing running and says nothing)."""
        running = {r: p for r, p in self.processes.items() if p.poll() is None}
        if running:
            try:  # read by a rank whose main thread is stuck in native code (lifeline.py)
                (Path(self.folder) / lifeline.STOP_FILE).touch()
            except OSError:
                pass
            self.say(f"singlecard_nb: stopping {_ranks(running)}: SIGTERM, then SIGKILL for "
                     f"any still running in {self.grace:g} s.")
            for process in running.values():
                _signal_group(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            for process in running.values():
                _wait(process, deadline - time.monotonic())
            left = {r: p for r, p in running.items() if p.poll() is None}
            if left:
                self.say(f"singlecard_nb: {_ranks(left)} still running after {self.grace:g} s:"
                         " SIGKILL.")
                for process in left.values():
                    _signal_group(process.pid, signal.SIGKILL)
        for rank, process in self.processes.items():
            if not _wait(process, _KILLED):
                self.say(f"singlecard_nb: rank {rank} (pid {process.pid}) did not end "
                         f"{_KILLED:g} s after SIGKILL (stuck in the kernel?).")
            # The session may hold more (DataLoader workers): gone with the group's kill.
            _signal_group(process.pid, signal.SIGKILL)


_KILLED = 5.0  # seconds a SIGKILLed process has to be reaped


def _wait(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(timeout=max(seconds, 0.0))
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal_group(leader: int, signum: int) -> None:
    try:
        os.killpg(leader, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _ranks(processes: dict[int, Any]) -> str:
    return ("rank " if len(processes) == 1 else "ranks ") + ", ".join(map(str, processes))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Lines:
    """A rank's output bytes cut into lines as they come: a line ends at "\n"; a line redrawn
    with "\r" (a progress bar) is given at each redraw as "\r" + its latest state, without
    waiting for its end, and "\r" alone once it ends."""

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self._pending = ""
        self._redrawing = False

    def feed(self, data: bytes, final: bool = False) -> list[str]:
        out: list[str] = []
        text = self._pending + self._decode(data, final)
        *parts, self._pending = re.split(r"(\r\n|\n|\r)", text)
        for piece, end in zip(parts[0::2], parts[1::2]):
            if end == "\r":
                if piece:
                    out.append("\r" + piece)
                self._redrawing = True
            elif self._redrawing:
                if piece:
                    out.append("\r" + piece)
                out.append("\r")
                self._redrawing = False
            else:
                out.append(piece)
        if self._pending and (self._redrawing or final):  # a redraw shows at once
            out.append(("\r" if self._redrawing else "") + self._pending)
            self._pending = ""
        if final and self._redrawing:
            out.append("\r")
            self._redrawing = False
        return out


def _print(rank: int, line: str, stream: str) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    if line == "\r":  # the line redrawn in place ends
        print(file=out, flush=True)
    elif line.startswith("\r"):
        print(f"\r[rank {rank}] {line[1:]}", end="", file=out, flush=True)
    else:
        print(f"[rank {rank}] {line}", file=out, flush=True)
