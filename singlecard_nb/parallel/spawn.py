"""`torch.multiprocessing.spawn` / `start_processes` in single-card mode: rank 0, in this process.

A script launched as `mp.spawn(main, args=(world_size, ...), nprocs=world_size)` runs
`main(0, world_size, ...)` here, as rank 0 of a world of one: the worker's
`init_process_group(rank=rank, world_size=world_size)` forms that world (single_card.py), its
`.to(rank)` lands on the pinned device (remap/). Running in this process is also the only way
that works from a notebook: functions defined in `__main__` cannot be pickled into spawned
children. The worker's exceptions reach the caller unchanged (no `ProcessRaisedException`), so
`%debug` sees the real frame. What a child's changes to its environment variables and torch's
thread count would do (vanish with the child) is kept: both are put back after the worker
(Lightning's launcher, for one, sets OMP_NUM_THREADS and torch's threads in its workers). A notice says so once; asking for several processes (or none: a
world size from `torch.cuda.device_count()` under `%singlecard cpu` is 0) is said once too.

torch elastic's `elastic_launch(config, fn)(*args)` (what `accelerate.notebook_launcher(fn,
num_processes=N)` and torchrun-from-Python call) runs `fn(*args)` here the same way, with
torchrun's variables for rank 0 of a world of one, and returns `{0: result}` as elastic does:
its agent would start its workers through the patched `start_processes`, in this process, where
they wait for that agent further down the same stack, for good. A command entrypoint (a script
to start) is left to elastic.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from ..borrow import Borrowed, wrap_like
from ..frames import user_frame
from ..job import torchrun_environ
from ..notices import Notices
from . import world_size


class RanInThisProcess:
    """What `start_processes(..., join=False)` returns: the worker has already finished."""

    def __init__(self) -> None:
        self.processes: list = []  # no child processes, as ProcessContext.processes would list

    def pids(self) -> list[int]:
        return []

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return True


def install(owner: Borrowed, notices: Notices) -> None:
    """Patch `spawn` and `start_processes` (package and submodule), owned by `owner`."""
    module = sys.modules["torch.multiprocessing.spawn"]
    for name in ("spawn", "start_processes"):
        original = getattr(mp, name)
        patched = _in_this_process(original, name, notices)
        owner.set_attr(mp, name, patched, f"torch.multiprocessing.{name}")
        if getattr(module, name) is original:
            owner.set_attr(module, name, patched, f"torch.multiprocessing.spawn.{name}")
    _patch_elastic_launch(owner, notices)


def _in_this_process(original: Callable, name: str, notices: Notices) -> Callable:
    signature = inspect.signature(original)

    def run(*args: Any, **kwargs: Any) -> RanInThisProcess | None:
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        fn, fn_args = call.arguments["fn"], tuple(call.arguments["args"])
        nprocs = call.arguments["nprocs"]
        what = getattr(fn, "__name__", repr(fn))
        notices.say("spawn", lambda: (
            f"singlecard_nb: torch.multiprocessing.{name}({what}, nprocs={nprocs}) runs "
            f"{what}(0, ...) in this process, as rank 0 of a world of one (single-card mode)."))
        if nprocs == 0:
            notices.say("spawn-nprocs", lambda: (
                f"singlecard_nb: {name} was asked for 0 processes (torch.cuda.device_count() is "
                "0 when no GPU is visible, e.g. under `%singlecard cpu`); single-card mode runs "
                "rank 0 of a world of one anyway."))
        elif nprocs != 1:
            notices.say("spawn-nprocs", lambda: (
                f"singlecard_nb: {name} was asked for {nprocs} processes; single-card mode runs "
                f"rank 0 only. `%singlecard off` (and a script, not a notebook: its functions "
                f"cannot be pickled) runs {nprocs} real ones."))
            world_size.say(notices, nprocs, f"torch.multiprocessing.{name}(nprocs={nprocs})")
        environ, threads = dict(os.environ), torch.get_num_threads()
        try:
            fn(0, *fn_args)
        finally:
            _put_back(environ)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        return None if call.arguments["join"] else RanInThisProcess()

    return wrap_like(original, run)


def _patch_elastic_launch(owner: Borrowed, notices: Notices) -> None:
    try:
        from torch.distributed.launcher import api
    except ImportError:  # a torch without torch.distributed
        return
    original = api.launch_agent

    def launch_agent(config: Any, entrypoint: Any, args: list, *rest: Any, **kwargs: Any) -> Any:
        if not callable(entrypoint):  # a command: elastic starts real processes
            return original(config, entrypoint, args, *rest, **kwargs)
        nprocs = config.nproc_per_node * max(config.max_nodes, 1)
        what = getattr(entrypoint, "__name__", repr(entrypoint))
        level = _users_line(sys._getframe(1))
        notices.say("elastic", lambda: (
            f"singlecard_nb: elastic_launch(nproc_per_node={config.nproc_per_node}) of {what} "
            f"(accelerate's notebook_launcher) runs {what}(...) in this process, as rank 0 of a "
            "world of one. More: docs/single-card.md, \"torch.multiprocessing.spawn\"."),
            stacklevel=level)
        if nprocs != 1:
            world_size.say(notices, nprocs, f"elastic_launch(nproc_per_node={nprocs})",
                           stacklevel=level + 1)  # said one call deeper
        environ, threads = dict(os.environ), torch.get_num_threads()
        os.environ.update(_RANK_0_OF_1)
        try:
            return {0: entrypoint(*args)}
        finally:
            _put_back(environ)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    owner.set_attr(api, "launch_agent", wrap_like(original, launch_agent),
                   "torch.distributed.launcher.api.launch_agent (elastic_launch)")


_LAUNCHERS = ("accelerate", "lightning", "pytorch_lightning")


def _users_line(frame: Any) -> int:
    """The stacklevel, for a notice said in the function whose caller is `frame`, of the first
    frame outside torch, the launching libraries and this package: the user's call."""
    users, steps = user_frame(frame, also=_LAUNCHERS)
    return 2 + steps if users is not None else 2


_RANK_0_OF_1 = torchrun_environ(0, 1)  # what torchrun sets for each worker, here for the one


def _put_back(environ: dict[str, str]) -> None:
    """os.environ as in `environ`, touching only the variables that differ."""
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
