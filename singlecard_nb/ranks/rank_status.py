"""A rank's status file, `rank<k>.json` in the run's folder: the one contract between a rank
and the notebook, its fields defined here once, beside its writer (`write`) and its reader
(`read`, `Statuses`).

Written in the rank by its agent's thread (agent.py: where it stands, how it left) and by the
command line's beat (cli/at_exit.py: what was recorded); read in the notebook by the job's
watch (run.py: has it moved?), the hang doctor (doctor.py: how it left, where it waits) and the
cell's output (notebook/ranks_progress.py, ranks_run.py: records so far). A rank killed in
native code leaves faulthandler's dump in `rank<k>.fault`, which `read()` adds as `fault`.
Standard library only, but for where.py's reading of a stack.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from .where import locate


class Place(TypedDict):
    """Where a rank's main thread is: the user's innermost `file:line` (None: none of the
    stack is the user's), its function, and the torch.distributed call made from it."""

    where: str | None
    function: str | None
    collective: str | None


class Raised(Place):
    """The script raised (said before its traceback is printed)."""

    error: str  # "ValueError: ...", cut to 500 characters
    at: float  # time.time()
    traceback: str  # as python prints it, from the script's first frame on


class Left(Place):
    """The script ended: `sys.exit(status)` (where it was called) or ran to its end (0)."""

    status: Any  # what sys.exit was given
    at: float


class Fault(Place):
    """Where a rank died in native code, from faulthandler's dump."""

    error: str  # "Aborted", "Segmentation fault"


class Call(TypedDict):
    """One torch.distributed call of the script (collectives.py), oldest first."""

    n: int  # its number among all the rank's calls
    call: str
    where: str | None
    shape: list[int] | None


class RankStatus(TypedDict, total=False):
    rank: int
    pid: int
    progress: int  # moves when the stack or the CPU time moves: a rank that does not is stuck
    time: float  # time.time() of this sample
    where: str | None  # the sample's Place, flat
    function: str | None
    collective: str | None
    formed: bool  # a process group was seen: the ranks formed one job
    collectives: list[Call]
    raised: Raised
    left: Left
    exit: int  # the exit status the rank ends with (lifeline.TERMINATED: ended by SIGTERM)
    ended: str  # why the agent's thread ended a rank whose main thread never came back
    agent_error: str  # the status thread (or a beat) failed: the rank may have moved unseen
    records: dict[str, int]  # {model: steps recorded} (the command line's beat)
    latest: dict[str, Any]  # {model: views/latest.py's snapshot of its latest steps}
    fault: Fault  # added by read(), from rank<k>.fault


# The fields by name, for the readers: status.get(PROGRESS), never a string typed twice
RANK, PID, PROGRESS, TIME = "rank", "pid", "progress", "time"
WHERE, FUNCTION, COLLECTIVE = "where", "function", "collective"
FORMED, COLLECTIVES, RAISED, LEFT, EXIT, ENDED = (
    "formed", "collectives", "raised", "left", "exit", "ended")
AGENT_ERROR, RECORDS, LATEST, FAULT = "agent_error", "records", "latest", "fault"
FIELDS = frozenset(RankStatus.__annotations__)


def path(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


def fault_path(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.fault"


def write(target: Path, status: RankStatus) -> None:
    """The whole status at once: written beside and moved into place, so the notebook never
    reads half a file (the caller holds the lock that orders its writers)."""
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(status))
    os.replace(temporary, target)


def read(folder: str | os.PathLike, rank: int) -> RankStatus | None:
    """Rank `rank`'s latest status (None before its first); with `fault` where the rank died
    in native code (faulthandler's dump: the error, where its main thread was)."""
    try:
        status = json.loads(path(folder, rank).read_text())
    except (OSError, ValueError):
        return None
    try:
        dump = fault_path(folder, rank).read_text(errors="replace")
    except OSError:
        dump = ""
    if dump.strip():
        status[FAULT] = fault(dump)
    return status


class Statuses:
    """Every rank's latest status, each file read again only when it changed (the notebook
    looks ten times a second, a rank writes twice)."""

    def __init__(self, folder: str | os.PathLike, ranks: Sequence[int]):
        self.folder, self.ranks = Path(folder), list(ranks)
        self._seen: dict[int, tuple[Any, RankStatus | None]] = {}

    def read(self) -> dict[int, RankStatus | None]:
        for rank in self.ranks:
            stamp = (_stamp(path(self.folder, rank)), _stamp(fault_path(self.folder, rank)))
            if rank not in self._seen or self._seen[rank][0] != stamp:
                self._seen[rank] = (stamp, read(self.folder, rank))
        return {rank: self._seen[rank][1] for rank in self.ranks}


def _stamp(target: Path) -> tuple[int, int, int] | None:
    try:
        stat = target.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size  # os.replace gives a new inode


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$', re.MULTILINE)


def fault(dump: str) -> Fault:
    """faulthandler's dump as {"error": "Aborted", "where", "function", "collective"} of the main
    thread (the one `python -m singlecard_nb` started in: runpy at its bottom)."""
    first = dump.strip().splitlines()[0]
    error = first.split(":", 1)[1].strip() if first.startswith("Fatal Python error:") else first
    blocks = [_FRAME.findall(block) for block in _THREAD.split(dump)[1:]]
    frames = [[(f, int(line), fn) for f, line, fn in block] for block in blocks]
    main = next((b for b in frames if any(fn == "_run_module_as_main" for _, _, fn in b)),
                frames[0] if frames else [])
    return {"error": error[:200], **locate(main)}
