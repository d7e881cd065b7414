"""Where this process stands in a torch.distributed job (ground floor: imports nothing of ours).

One answer for every part that labels records, files or explanations with a rank: the process
group once one is formed, else the variables torchrun sets before the script forms it.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

# What torchrun (torch elastic's agent) sets in each worker; a launcher replaces them all
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
LOCALHOST = "127.0.0.1"


def torchrun_environ(rank: int, ranks: int, port: int | None = None) -> dict[str, str]:
    """The variables torchrun sets in worker `rank` of `ranks` on one node; with `port`, also
    the rendezvous they meet at (MASTER_ADDR, MASTER_PORT) and the restart count."""
    environ = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
               "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
               "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(ranks)}
    if port is not None:
        environ.update(MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port),
                       TORCHELASTIC_RESTART_COUNT="0")
    return environ


def free_port(host: str = LOCALHOST) -> int:
    """A port nothing listens on now (the rendezvous' TCP store takes it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def place() -> tuple[int, int]:
    """(rank, world size) of this process: the launcher's (torchrun's RANK and WORLD_SIZE)
    where it set them, else the process group's once one is formed; (0, 1) outside a job.

    The launcher's first: under single-card mode each process of a torchrun job forms a world of
    one, whose get_rank() is 0 on every rank, and the same process's rows must carry the same
    rank before and after `destroy_process_group()`."""
    launched = _launched()
    if launched is not None:
        return launched
    if group_formed():  # read once per recorded step (store.py): no import statement there
        import torch.distributed as dist

        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def group_formed() -> bool:
    """Whether this process is in a process group now, without importing torch.distributed (a
    script that never imported it formed none); safe from another thread while the script
    imports torch (False then)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # a torch half imported, while the script imports it
        return False


def _launched() -> tuple[int, int] | None:
    """torchrun's RANK (and WORLD_SIZE, 1 when unset); None when RANK is unset or no number."""
    rank = os.environ.get("RANK")
    if rank is None:
        return None
    try:
        return max(int(rank), 0), max(int(os.environ.get("WORLD_SIZE", "1") or 1), 1)
    except ValueError:
        return None


def launched_world_size(environ: Any = None) -> int:
    """The WORLD_SIZE the script was launched with (torchrun's variable; 1 when unset or no
    number), whether or not a process group exists yet."""
    environ = os.environ if environ is None else environ
    try:
        return max(int(environ.get("WORLD_SIZE", "1") or 1), 1)
    except ValueError:
        return 1


def launched_ranks(environ: Any = None) -> int:
    """N where a launcher started this process as one of N > 1 ranks with a rendezvous to
    meet at (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT); 1
    otherwise, also where only WORLD_SIZE was set by hand (a world of N would wait for N-1
    ranks nobody started)."""
    environ = os.environ if environ is None else environ
    needed = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return launched_world_size(environ) if all(environ.get(k) for k in needed) else 1


def rank() -> int:
    """This process's rank (0 outside a job)."""
    return place()[0]


class LastRanksRun:
    """What the last `%run` of N ranks in this process recorded, for `scn.compare_ranks()` with
    no argument (inspection/runs/comparison.py reads it). Written by the notebook layer:
    notebook/ranks_run.py when the ranks' files are read back, notebook/inspect_all.py when a
    `%run` records in this process instead."""

    def __init__(self) -> None:
        self.records: Any = None  # {model: a frame of all its ranks}, a str (why none), None
        self.note: str | None = None  # what a comparison must say first (no group formed)

    def remember(self, records: Any, note: str | None = None) -> None:
        self.records, self.note = records, note


LAST_RANKS_RUN = LastRanksRun()
