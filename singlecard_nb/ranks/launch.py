"""The commands of a job of N ranks on one device: what torchrun would start, planned.

Each rank is `python -m singlecard_nb --device TARGET --ranks-dir DIR [inspect options]
script.py args` with the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, a free MASTER_PORT each run; OMP_NUM_THREADS=1
where unset, as torchrun does). Planning starts nothing: `plan()` is a pure function of its
arguments, so the commands can be checked without a process.
"""

from __future__ import annotations

import json
import os
import site
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..job import TORCHRUN_VARIABLES, free_port, torchrun_environ
from . import lifeline

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # holds singlecard_nb/

NOTEBOOK_PATH = "SINGLECARD_NB_SYS_PATH"  # the notebook's sys.path, as JSON


@dataclass(frozen=True)
class Rank:
    rank: int
    argv: tuple[str, ...]
    environ: Mapping[str, str]


def notebook_path(path: Sequence[str], cwd: str | None = None) -> list[str]:
    """The notebook's sys.path as a rank's script should see it: the notebook's folder first,
    then what the kernel has, in its order ("" is that folder)."""
    cwd = os.getcwd() if cwd is None else cwd
    entries = [cwd] + [os.path.abspath(p) if p else cwd for p in path]
    return list(dict.fromkeys(entries))


def adopt_notebook_path(environ: Mapping[str, str] | None = None) -> None:
    """In a rank: sys.path becomes the notebook's (its first entry, the script's folder,
    is set when the script runs)."""
    text = (os.environ if environ is None else environ).get(NOTEBOOK_PATH)
    if text:
        sys.path[1:] = json.loads(text)


def _installed(root: str) -> bool:
    try:
        sites = [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # a virtualenv's old site module
        return False
    return os.path.abspath(root) in {os.path.abspath(p) for p in sites}


def plan(ranks: int, target: str, folder: str, program: Sequence[str],
         inspect_options: Sequence[str] = (), environ: Mapping[str, str] | None = None,
         port: int | None = None, python: str = sys.executable,
         parent: int | None = None, path: Sequence[str] | None = None) -> list[Rank]:
    """The N ranks' commands.

    target: the device every rank pins ("cpu", a GPU or MIG UUID).
    program: what follows `python` for the script: ("train.py", *args) or ("-m", "pkg", *args).
    inspect_options: `python -m singlecard_nb` options (`--params`, `--save PATH`, ...).
    environ: the notebook's environment (default os.environ); port: MASTER_PORT (default free).
    parent: the pid each rank dies with (default this process's: the one that starts them).
    path: the notebook's sys.path (default this process's), which each rank's script sees.
    """
    if ranks < 2:
        raise ValueError(f"a job of ranks needs at least 2, got {ranks}")
    base = {k: v for k, v in (os.environ if environ is None else environ).items()
            if k not in TORCHRUN_VARIABLES}
    # The children import this very package, whatever the notebook's working folder is; an
    # installed one (in site-packages) they find as the notebook did, the standard library first
    own = None if _installed(_PACKAGE_ROOT) else _PACKAGE_ROOT
    base["PYTHONPATH"] = os.pathsep.join(p for p in (own, base.get("PYTHONPATH", "")) if p)
    # the script imports as it would in the notebook (`from mylib import ...` beside it)
    base[NOTEBOOK_PATH] = json.dumps(notebook_path(sys.path if path is None else path))
    base.setdefault("OMP_NUM_THREADS", "1")  # what torchrun does for more than one process
    if target == "cpu":  # accelerate and HF Trainer form their world of N on the CPU (gloo)
        base.setdefault("ACCELERATE_USE_CPU", "true")  # with no GPU they run N worlds of one
    base["PYTHONUNBUFFERED"] = "1"  # output reaches the cell line by line, as it comes
    base[lifeline.PARENT] = str(os.getpid() if parent is None else parent)
    port = port or free_port()  # a value the notebook has (single-card mode's RANK=0) replaced
    argv = (python, "-m", "singlecard_nb", "--device", target, "--ranks-dir", folder,
            *inspect_options, *(("--",) if program and program[0] != "-m" else ()), *program)
    return [Rank(k, argv, {**base, **torchrun_environ(k, ranks, port)}) for k in range(ranks)]
