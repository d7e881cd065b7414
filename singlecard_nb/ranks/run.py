"""Start the N ranks on torch elastic's engine, bring their output back as it comes, and stop
every one of them.

`RankJob(ranks, folder).run()` starts the ranks with `start_processes` (torch elastic's
multiprocessing: what torchrun itself runs): each rank in its own session (so one signal
reaches the rank and whatever it started, DataLoader workers included), its stdout and stderr
written to torch's log files (`folder/logs/.../attempt_0/k/stdout.log`), which threads here
follow as they grow. In the calling thread it echoes each line prefixed `[rank k]`, watches the
exits (the processes torch started) and the ranks' statuses (rank_status.py), and decides:
- all exited 0: done;
- one exited with an error: stop the others, raise `RankFailed` (which rank, where the others
  waited);
- no rank moved for `hang_after` seconds: stop every rank, raise `RanksHang`;
- Ctrl-C (KeyboardInterrupt in the calling thread): stop every rank, re-raise.
Stopping is torchrun's own, `PContext.close()`, in `finally`, with Ctrl-C held back until it is
done: after a stop file (lifeline.py), SIGTERM to each rank's process group (the rank's
`finally` and atexit run, and it saves its own records), one wait of `lifeline.GRACE` seconds
shared by all ranks, then SIGKILL to any still running, each step said; so no child, socket or
port outlives the run. A failure is reported once the others are stopped, their output drained.
Each rank also dies with the notebook (its parent-death signal), should the notebook be killed.

What torch's engine lacks, or does otherwise than a notebook needs, is added or given back here:
- `PContext.start()` takes SIGTERM, SIGINT, SIGHUP and SIGQUIT in the main thread for good (Ctrl-C
  in every later cell would raise its SignalException): they are saved before and put back in
  the `finally` right after it, so Ctrl-C stays KeyboardInterrupt;
- each rank's environment is the notebook's `os.environ` updated by the plan's, so a variable
  the plan leaves out (the notebook's own pin, its RANK, TORCHELASTIC_RUN_ID) would come back:
  `os.environ` is the plan's own while torch starts them (a borrow, given back in `finally`),
  so each rank has exactly the plan's environment (and torch's TORCHELASTIC_ERROR_FILE);
- torch's tee writes whole lines only: a line redrawn with "\r" (tqdm's bar) would show at its
  end; the log files are followed here instead, each redraw shown as it comes (`Lines`);
- its `wait()` closes every rank at the first failure, before their statuses say where they
  waited: the processes are watched here, and the doctor reads every status before the stop;
- the watch of the notebook and the status beat are the ranks' own (lifeline.py, agent.py).
"""

from __future__ import annotations

import codecs
import logging
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
from typing import Any

from ..borrow import Borrowed, uninterrupted
from . import agent, doctor, lifeline, rank_status
from .launch import Rank

POLL = 0.1  # seconds between looks at exits and statuses
_FOLLOW = 0.05  # seconds between looks at a rank's log file that had nothing new
_DRAIN = 1.0  # seconds the output of stopped ranks has to be read (their files are complete)
# What torch elastic's PContext.start() takes for good in the main thread (torch >= 2.6)
_TAKEN = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
               if hasattr(signal, name))


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
                 status_every: float = agent.INTERVAL,
                 say: Callable[[str], None] | None = None, grace: float = lifeline.GRACE):
        self.ranks = list(ranks)
        self.folder = folder
        self.hang_after = hang_after
        self.echo = echo or _print
        self.on_status = on_status
        self.status_every = status_every
        self.say = say or _say
        self.grace = grace
        self.processes: dict[int, subprocess.Popen] = {}  # what torch elastic started
        self._context: Any = None  # torch elastic's PContext, closed once
        self._closed = False
        self._lines: queue.Queue[tuple[int, str, str]] = queue.Queue()
        self._readers: list[threading.Thread] = []
        self.said: dict[int, str] = {}  # what a rank printed of a collective mismatch
        self._notices = _OncePerJob()
        self._statuses = rank_status.Statuses(folder, [spec.rank for spec in self.ranks])

    def run(self) -> dict[int, int]:
        """Run to the end; {rank: exit status} (all 0), or raise as the module says."""
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame)
        try:
            self._start()
            return self._watch()
        finally:
            # A second Ctrl-C (people press it again when a stop takes a moment) waits until
            # every rank is killed and reaped; it would otherwise leave ranks running.
            with uninterrupted():
                self.stop()
                self._drain()  # what they said as they stopped (their `finally`'s words)

    # --- starting ---------------------------------------------------------------------------
    def _start(self) -> None:
        """torch elastic's `start_processes`, the notebook's signal handlers, environment and
        stdin given back right after it."""
        from torch.distributed.elastic.multiprocessing import (
            DefaultLogsSpecs,
            Std,
            start_processes,
        )
        from torch.distributed.elastic.multiprocessing.api import SignalException

        program = self.ranks[0].argv[0]
        if any(spec.argv[0] != program for spec in self.ranks):
            raise ValueError("the ranks of one job run one program (torch elastic's entrypoint)")
        envs = {spec.rank: dict(spec.environ) for spec in self.ranks}
        logs = DefaultLogsSpecs(log_dir=str(Path(self.folder) / "logs"), redirects=Std.ALL,
                                tee=Std.NONE)
        with uninterrupted():  # a Ctrl-C meanwhile comes once SIGINT's handler is back
            handlers = {signum: signal.getsignal(signum) for signum in _TAKEN} \
                if threading.current_thread() is threading.main_thread() else {}
            borrowed = Borrowed("the ranks' start: the plan's environment, stdin from /dev/null")
            # torch builds each rank's environment on a copy of os.environ: the plan's own here
            borrowed.set_attr(os, "environ", dict(envs[self.ranks[0].rank]),
                              "os.environ (the ranks' environment, while they start)")
            _stdin_from_devnull(borrowed)  # torch's Popen passes the notebook's stdin on
            try:
                self._context = start_processes(
                    name="rank", entrypoint=program, envs=envs, logs_specs=logs,
                    args={spec.rank: tuple(spec.argv[1:]) for spec in self.ranks})
            except SignalException as e:  # in the moment torch held SIGINT: it closed them
                if e.sigval == signal.SIGINT:
                    raise KeyboardInterrupt from None
                raise
            finally:
                # Given back first, by hand: Borrowed's restore holds Ctrl-C back by swapping
                # SIGINT's handler, and would put torch's back after it
                for signum, handler in handlers.items():
                    if handler is not None:  # None: set outside Python, nothing to put back
                        signal.signal(signum, handler)
                borrowed.restore()
        self.processes = {rank: handler.proc
                          for rank, handler in self._context.subprocess_handlers.items()}
        for spec in self.ranks:
            for name, files in (("stdout", self._context.stdouts),
                                ("stderr", self._context.stderrs)):
                reader = threading.Thread(
                    target=self._follow, args=(spec.rank, files[spec.rank], name),
                    name=f"[rank {spec.rank}] {name}", daemon=True)
                reader.start()
                self._readers.append(reader)

    def _follow(self, rank: int, path: str, name: str) -> None:
        """A rank's log file as it grows (`tail -f`), cut into lines, until the rank ended and
        all it wrote was read."""
        lines = Lines()
        process = self.processes[rank]
        ended = False
        with open(path, "rb", buffering=0) as f:  # what has come, without waiting for more
            while True:
                chunk = f.read(65536)
                if chunk:
                    for line in lines.feed(chunk):
                        self._lines.put((rank, line, name))
                elif ended:
                    break
                else:  # after its exit, what it wrote is all in the file: one more read
                    ended = process.poll() is not None
                    if not ended:
                        time.sleep(_FOLLOW)
        for line in lines.feed(b"", final=True):
            self._lines.put((rank, line, name))

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
        if self._notices.shown(rank, line, stream):
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
        """The output the ranks wrote before they exited (read to the end of their files
        once they exited), within `_DRAIN` seconds shared by all."""
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
        """torchrun's stop, torch elastic's `PContext.close()`: SIGTERM to every running rank's
        process group, one bounded wait shared by all, then SIGKILL; what each rank started
        gone with its session; each step said. Idempotent (a second call finds nothing running
        and says nothing)."""
        running = {r: p for r, p in self.processes.items() if p.poll() is None}
        if running:
            try:  # read by a rank whose main thread is stuck in native code (lifeline.py)
                (Path(self.folder) / lifeline.STOP_FILE).touch()
            except OSError:
                pass
            self.say(f"singlecard_nb: stopping {_ranks(running)}: SIGTERM, then SIGKILL for "
                     f"any still running in {self.grace:g} s.")
        if self._context is not None and not self._closed:
            self._closed = True
            killed = _close(self._context, self.grace)
            left = {r: p for r, p in running.items() if p.pid in killed}
            if left:
                self.say(f"singlecard_nb: {_ranks(left)} still running after {self.grace:g} s:"
                         " SIGKILL.")
        for rank, process in self.processes.items():
            if not _wait(process, _KILLED):
                self.say(f"singlecard_nb: rank {rank} (pid {process.pid}) did not end "
                         f"{_KILLED:g} s after SIGKILL (stuck in the kernel?).")
            # The session may hold more (DataLoader workers): gone with the group's kill.
            _signal_group(process.pid, signal.SIGKILL)


def _close(context: Any, grace: float) -> set[int]:
    """`context.close()` (SIGTERM, `grace` seconds shared by all, SIGKILL); the pids it had to
    SIGKILL. Its log lines are heard here, not printed: the caller says each step in its own."""
    from torch.distributed.elastic.multiprocessing import api

    heard = _Heard()
    started = time.monotonic()
    quiet = Borrowed("the ranks' stop: torch elastic's words heard, said in ours")
    quiet.on_restore(lambda: api.logger.removeHandler(heard), "torch elastic's log: heard")
    api.logger.addHandler(heard)
    quiet.set_attr(api.logger, "propagate", False, "torch elastic's log: not printed")
    try:
        context.close(death_sig=signal.SIGTERM, timeout=grace)
    finally:
        quiet.restore()
    if time.monotonic() - started >= grace:  # its words unheard (another version's)
        heard.killed |= {h.proc.pid for h in context.subprocess_handlers.values()
                         if h.proc.returncode == -signal.SIGKILL}
    for handler in context.subprocess_handlers.values():  # the log files it did not close
        for file in (getattr(handler, "_stdout", None), getattr(handler, "_stderr", None)):
            if file is not None:
                file.close()
    return heard.killed


class _Heard(logging.Handler):
    """torch elastic's stop, as it logs it: the processes it had to SIGKILL."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.killed: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Unable to shutdown process") and record.args:
            self.killed.add(record.args[0])  # type: ignore[index]


def _stdin_from_devnull(owner: Borrowed) -> None:
    """fd 0 is /dev/null until `owner` is restored: the ranks read no notebook's terminal."""
    try:
        saved = os.dup(0)
    except OSError:  # no stdin at all: none to pass on
        return
    null = os.open(os.devnull, os.O_RDONLY)
    owner.on_restore(lambda: (os.dup2(saved, 0), os.close(saved)), "stdin (fd 0)")
    os.dup2(null, 0)
    os.close(null)


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


class _OncePerJob:
    """Our notices said once for the job, not once per rank: the ranks run one script, so each
    would say the same words at the same line (4 ranks, 4 copies of every notice). The first
    rank's is shown; the same warning from another rank, with the source line Python prints
    under it, is not."""

    _WARNING = re.compile(r"^.*:\d+: \w+: (singlecard_nb: .*)$")

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._hiding: set[tuple[int, str]] = set()  # (rank, stream) whose next source line goes

    def shown(self, rank: int, line: str, stream: str) -> bool:
        if (rank, stream) in self._hiding:
            self._hiding.discard((rank, stream))
            if line.startswith("  "):
                return False
        notice = self._WARNING.match(line)
        if notice is None:
            return True
        if notice.group(1) in self._said:
            self._hiding.add((rank, stream))
            return False
        self._said.add(notice.group(1))
        return True


def _print(rank: int, line: str, stream: str) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    if line == "\r":  # the line redrawn in place ends
        print(file=out, flush=True)
    elif line.startswith("\r"):
        print(f"\r[rank {rank}] {line[1:]}", end="", file=out, flush=True)
    else:
        print(f"[rank {rank}] {line}", file=out, flush=True)
