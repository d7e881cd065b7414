"""Single-card mode: code written for several GPUs runs unchanged on the one pinned device.

While single-card mode is on (`enable(device)`, called by `session.pin` with the pinned device):

- `nn.DataParallel` and `nn.parallel.data_parallel(...)` (wrappers.py) run the module on the
  pinned device in the calling thread: no replicas, no scatter/gather threads. The class is kept (its `__init__`
  and `forward` are patched), so `isinstance`, `.module` and the `module.` prefix of
  `state_dict()` keys stay, and wrappers built before single-card mode are covered too.
- `DistributedDataParallel` is the real DDP over a world of one, with its device arguments
  fixed up for the pinned device (none on the CPU): reducer, logger, comm hooks, static graph,
  `no_sync`, `join` and DDP's own errors are torch's. Without a process group it forms one.
  Measured against the former pass-through in benchmarks/ (README, "Multi-GPU code on one card").
- process groups are worlds of one (groups.py); device references follow the pin (remap/);
  `mp.spawn` runs rank 0 in this process (spawn.py); pinned to the CPU, CUDA-minded calls get
  a one-GPU machine's answers (cuda_on_cpu.py); torchrun's variables are provided where unset.

Every change goes through one `borrow.Borrowed` owner; `disable()` gives back the identical
original objects and environment, and closes the groups (and gloo listeners) it formed.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import job
from ..borrow import Borrowed
from ..notices import Notices
from . import (
    accelerator,
    cuda_on_cpu,
    fsdp,
    mesh,
    pinned_memory,
    remap,
    rpc_worlds,
    spawn,
    world_size,
    wrappers,
)
from .cuda_on_cpu import under_cpu
from .groups import Groups
from .guards import Guards

__all__ = ["enable", "disable", "enabled", "unwrap", "report"]

# What torchrun would export for a one-process job; provided only where the variable is unset.
TORCHRUN_ENV = {**{name: value for name, value in job.torchrun_environ(0, 1).items()
                   if name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")},
                "MASTER_ADDR": job.LOCALHOST}

_BOOKKEEPING = "single-card mode state"  # the owner's own clean-up entry, not a patch


# --- what became what (FSDP -> the real FSDP1 on the CPU, a mesh -> a world of one) -----------
class Conversions:
    """`record("FullyShardedDataParallel(device_id=0)", "the real FSDP1 on cpu")`, counted."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, what: str, into: str) -> None:
        with self._lock:
            self._counts[(what, into)] = self._counts.get((what, into), 0) + 1

    def summary(self) -> list[str]:
        """"what → into (×n)", in the order they first happened."""
        with self._lock:
            return [f"{what} → {into} (×{n})" for (what, into), n in self._counts.items()]


@dataclass
class _State:
    owner: Borrowed | None = None
    device: torch.device | None = None
    wrappers: int = 0  # DataParallel / DDP wrappers built while on
    notices: Notices = field(default_factory=Notices)
    groups: Groups | None = None
    world: int = 1  # >1: a rank of a real world whose ranks share the device (groups.py)
    conversions: Conversions = field(default_factory=Conversions)


_state = _State()


# --- public -----------------------------------------------------------------------------------
def enable(device: torch.device | str, *, world: int = 1) -> None:
    """Turn single-card mode on for `device`; calling again with another device switches to it.

    world: 1 (process groups are worlds of one), or the N of a job whose N ranks all run on
        this device (`%singlecard cpu --ranks N`): then `init_process_group` forms the real
        world of N the launcher set up, with gloo where nccl was asked for.
    Never starts CUDA: devices are only touched when user code builds a wrapper or a group.
    """
    device = _normalise(device)
    if _state.owner is not None:
        if _state.device == device and _state.world == world:
            return
        disable()
    if not under_cpu(device) and torch.cuda.is_initialized():
        # A soft re-pin selected its card through the previous session's set_device (which
        # sent it to the old card); select the new one now that the patch is gone.
        torch.cuda.set_device(device.index)
    owner = Borrowed("single-card mode")
    notices = Notices(suffix="said once; `%singlecard status` counts each time"
                      if _in_ipython() else "said once")
    groups = Groups(device, notices, world=world)
    _state.owner, _state.device, _state.notices, _state.groups = owner, device, notices, groups
    _state.world = world
    _state.wrappers = 0
    conversions = _state.conversions = Conversions()
    done = False
    try:
        # Registered first so it runs last, after the patches are gone; it also runs when
        # `borrow.restore_all()` (extension unload) restores this owner without disable().
        owner.on_restore(functools.partial(_forget, owner), _BOOKKEEPING)
        wrappers.install(owner, device, groups, notices,
                         functools.partial(_converted, conversions))
        groups.install(owner)
        remap.install(owner, remap.Remapper(device, notices))
        if under_cpu(device):
            cuda_on_cpu.install(owner, device, notices)
            pinned_memory.install(owner, notices)
        accelerator.install(owner, device, notices)
        Guards(device, notices, world=world).install(owner)
        fsdp.install(owner, device, groups, notices, conversions.record)
        mesh.install(owner, device, notices, conversions.record, world=world)
        spawn.install(owner, notices)
        if world == 1:  # a real world of N (--ranks) is torch's own
            rpc_worlds.install(owner)
        if world == 1 and (size := world_size.from_environ(os.environ)) is not None:
            world_size.say(notices, size, f"WORLD_SIZE={size} (the environment)",
                           stacklevel=world_size.outside_this_package())
        groups.provided_env = _provide_torchrun_env(owner)
        done = True
    finally:
        if not done:  # half-way failure (or Ctrl-C): give back what was already changed
            owner.restore()


def disable() -> None:
    """Turn single-card mode off, restoring every patched torch object and variable exactly."""
    if _state.owner is not None:
        _state.owner.restore()  # runs _forget last


def _converted(conversions: Conversions, what: str, became: str) -> None:
    """A DataParallel or DDP wrapper was built while on: counted, and said in status."""
    _state.wrappers += 1
    conversions.record(what, became)


def _forget(owner: Borrowed) -> None:
    if _state.owner is not owner:  # a stale owner: its state was replaced already
        return
    groups = _state.groups
    _state.owner = _state.device = _state.groups = None
    if groups is not None:
        groups.close()


def enabled() -> bool:
    """Whether single-card mode is on."""
    return _state.owner is not None


def unwrap(model: nn.Module, device: torch.device | None = None) -> nn.Module:
    """The module inside DataParallel / DDP / DeepSpeed engine wrappers (nested too), moved to
    `device`.

    device: where the module goes (default: single-card mode's device; None leaves it in place).
    Works for wrappers built before single-card mode.
    """
    while isinstance(model, (nn.DataParallel, DistributedDataParallel)) or (
            type(model).__name__ == "DeepSpeedEngine" and isinstance(model.module, nn.Module)):
        model = model.module  # DeepSpeed's engine by name: deepspeed is not imported to ask
    device = _state.device if device is None else device
    if device is not None:
        model.to(device)
    return model


def report() -> dict:
    """What single-card mode is doing, for `%singlecard status`.

    Keys: enabled, device, patched (labels), wrappers, groups (formed), listeners ("host:port"
    of gloo sockets our groups opened that are still open), notices (one line per kind),
    converted ("what → what it became (×n)": DataParallel, DDP, FSDP, meshes).
    """
    owner, groups = _state.owner, _state.groups
    labels = list(dict.fromkeys(owner.describe())) if owner is not None else []  # once each
    return {
        "enabled": owner is not None,
        "device": None if _state.device is None else str(_state.device),
        "patched": [label for label in labels if label != _BOOKKEEPING],
        "wrappers": _state.wrappers,
        "groups": 0 if groups is None else groups.formed,
        "listeners": [] if groups is None else groups.open_listeners(),
        "notices": _state.notices.summary() if owner is not None else [],
        "converted": _state.conversions.summary() if owner is not None else [],
    }


# --- the torchrun environment -----------------------------------------------------------------
def _provide_torchrun_env(owner: Borrowed,
                          environ: MutableMapping[str, str] | None = None) -> frozenset[str]:
    """torchrun's variables for a world of one, where unset; the names set."""
    environ = os.environ if environ is None else environ
    provided = set()
    for name, value in TORCHRUN_ENV.items():
        if name not in environ:
            owner.set_env(name, value, environ)
            provided.add(name)
    if "MASTER_PORT" not in environ:
        owner.set_env("MASTER_PORT", str(job.free_port()), environ)
        provided.add("MASTER_PORT")
    return frozenset(provided)


def _in_ipython() -> bool:
    """Whether an IPython shell runs this (`%singlecard status` exists there, not in a terminal
    run of `python -m singlecard_nb`)."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


# --- helpers ----------------------------------------------------------------------------------
def _normalise(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # Asking torch for the current device would start CUDA; the pin is always explicit.
        device = torch.device("cuda", 0)
    return device
