"""Single-card mode: code written for several GPUs runs unchanged on the one pinned device.

While single-card mode is on (`enable(device)`, called by `session.pin` with the pinned device):

- `nn.DataParallel` and `nn.parallel.data_parallel(...)` run the module on the pinned device in
  the calling thread: no replicas, no scatter/gather threads. The class is kept (its `__init__`
  and `forward` are patched), so `isinstance`, `.module` and the `module.` prefix of
  `state_dict()` keys stay, and wrappers built before single-card mode are covered too.
- `DistributedDataParallel` is the real DDP over a world of one, with its device arguments
  fixed up for the pinned device (none on the CPU): reducer, logger, comm hooks, static graph,
  `no_sync`, `join` and DDP's own errors are torch's. Without a process group it forms one.
  Measured against the former pass-through in benchmarks/ (README, "Multi-GPU code on one card").
- process groups are worlds of one (groups.py); device references follow the pin (remap.py);
  `mp.spawn` runs rank 0 in this process (spawn.py); pinned to the CPU, CUDA-minded calls get
  a one-GPU machine's answers (cuda_on_cpu.py); torchrun's variables are provided where unset.

Every change goes through one `borrow.Borrowed` owner; `disable()` gives back the identical
original objects and environment, and closes the groups (and gloo listeners) it formed.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import sys
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import PackedSequence

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from . import accelerator, cuda_on_cpu, fsdp, mesh, pinned_memory, remap, spawn, world_size
from .conversions import Conversions
from .groups import Groups
from .guards import Guards

__all__ = ["enable", "disable", "enabled", "unwrap", "report"]

# What torchrun would export for a one-process job; provided only where the variable is unset.
TORCHRUN_ENV = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}

_BOOKKEEPING = "single-card mode state"  # the owner's own clean-up entry, not a patch


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
    if device.type == "cuda" and torch.cuda.is_initialized():
        # A soft re-pin selected its card through the previous session's set_device (which
        # sent it to the old card); select the new one now that the patch is gone.
        torch.cuda.set_device(device.index)
    owner = Borrowed("single-card mode")
    notices = Notices(suffix="said once; `%singlecard status` counts each time")
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
        _patch_data_parallel(owner)
        _patch_ddp(owner, groups, notices)
        groups.install(owner)
        remap.install(owner, remap.Remapper(device, notices))
        if device.type != "cuda":
            cuda_on_cpu.install(owner, device, notices)
            pinned_memory.install(owner, notices)
        accelerator.install(owner, device, notices)
        Guards(device, notices).install(owner)
        fsdp.install(owner, device, groups, notices, conversions)
        mesh.install(owner, device, notices, conversions)
        spawn.install(owner, notices)
        if world == 1 and (size := world_size.from_environ(os.environ)) is not None:
            world_size.say(notices, size, f"WORLD_SIZE={size} (the environment)",
                           stacklevel=world_size.outside_this_package())
        _provide_torchrun_env(owner)
        done = True
    finally:
        if not done:  # half-way failure (or Ctrl-C): give back what was already changed
            owner.restore()


def disable() -> None:
    """Turn single-card mode off, restoring every patched torch object and variable exactly."""
    if _state.owner is not None:
        _state.owner.restore()  # runs _forget last


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


# --- DataParallel -----------------------------------------------------------------------------
def _patch_data_parallel(owner: Borrowed) -> None:
    data_parallel = nn.DataParallel

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super(data_parallel, self).__init__()
        device = _state.device
        self.module = module.to(device)
        self.dim = dim
        # What DataParallel itself records on a machine with just this device, so code reading
        # these attributes (or DataParallel's own forward, after single-card mode ends) agrees.
        self.device_ids = [device.index] if device.type == "cuda" else []
        self.output_device = device.index if device.type == "cuda" else None
        self.src_device_obj = device
        self._singlecard_requested = {"device_ids": device_ids, "output_device": output_device}
        _state.wrappers += 1
        _state.conversions.record(f"DataParallel(device_ids={device_ids!r})",
                                  f"the module on {device}, in the calling thread")

    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            return _run_on(_state.device, self.module, inputs, kwargs)

    owner.set_attr(data_parallel, "__init__", wrap_like(data_parallel.__init__, __init__))
    owner.set_attr(data_parallel, "forward", wrap_like(data_parallel.forward, forward))

    # The functional form, `nn.parallel.data_parallel(module, inputs, device_ids)`.
    functional = sys.modules["torch.nn.parallel.data_parallel"]
    original = functional.data_parallel

    def data_parallel_function(module, inputs, device_ids=None, output_device=None, dim=0,
                               module_kwargs=None):
        if not isinstance(inputs, tuple):
            inputs = (inputs,) if inputs is not None else ()
        return _run_on(_state.device, module, inputs, module_kwargs or {})

    patched = wrap_like(original, data_parallel_function)
    owner.set_attr(functional, "data_parallel", patched, "nn.parallel.data_parallel")
    if getattr(nn.parallel, "data_parallel", None) is original:
        owner.set_attr(nn.parallel, "data_parallel", patched, "nn.parallel.data_parallel")


def _run_on(device: torch.device, module: nn.Module, inputs: tuple, kwargs: dict) -> Any:
    # Covers modules that sit elsewhere (wrappers built before single-card mode).
    _ensure_on(module, device)
    return module(*_move(inputs, device), **_move(kwargs, device))


# --- DistributedDataParallel ------------------------------------------------------------------
# The real DDP over a world of one, not a pass-through: libraries (Lightning, Hugging Face,
# accelerate) reach for its reducer, logger, _get_ddp_logging_data(), bucket_bytes_cap, comm
# hooks and static graph, and users expect its complaint about unused parameters. Its cost (the
# reducer's gradient buckets, DDP's forward bookkeeping) is measured in benchmarks/.
def _patch_ddp(owner: Borrowed, groups: Groups, notices: Notices) -> None:
    ddp = DistributedDataParallel
    original = ddp.__init__
    signature = inspect.signature(original)

    def __init__(self, module, *args, **kwargs):
        # Bind to the installed torch's own signature: same argument errors, any torch version.
        call = signature.bind(self, module, *args, **kwargs)
        arguments = call.arguments
        requested = arguments.get("device_ids")
        _fix_devices(module, arguments, _state.device, notices)
        if arguments.get("process_group") is None and arguments.get("device_mesh") is None \
                and not dist.is_initialized() and groups.world == 1:
            notices.say("ddp-group", "singlecard_nb: DistributedDataParallel built without "
                                     "init_process_group: single-card mode formed a world of one "
                                     "(rank 0) for it.")
            groups.form()
        try:
            original(*call.args, **call.kwargs)
        except BaseException:
            # Ctrl-C or an error half-way: the wrapper is never handed out, but a traceback
            # keeps it, and with it the group and its gloo listener, alive. Let go of both now.
            groups.release(self)
            raise
        groups.track(self)
        _state.wrappers += 1
        _state.conversions.record(
            f"DistributedDataParallel(device_ids={requested!r})",
            f"the real DDP on {_state.device}, a world of one")

    owner.set_attr(ddp, "__init__", wrap_like(original, __init__))

    original_setstate = ddp.__setstate__

    def __setstate__(self, state):
        original_setstate(self, state)  # copy.deepcopy / pickle: bound to the default group
        groups.track(self)

    owner.set_attr(ddp, "__setstate__", wrap_like(original_setstate, __setstate__))


def _fix_devices(module: nn.Module, arguments: dict, device: torch.device,
                 notices: Notices) -> None:
    """DDP's device arguments (and the module) for the pinned device.

    On a GPU: `device_ids=[any]` / `output_device=any` become the pinned card, and a module on
    another card moves to it. On the CPU there are no device ids (real DDP rejects them for a
    CPU module), and a module left on a GPU moves to the CPU. More than one id is left for
    DDP to refuse, with its own message.
    """
    device_ids, output_device = arguments.get("device_ids"), arguments.get("output_device")
    if device_ids is not None and len(device_ids) > 1:
        return
    on_gpu = device.type == "cuda"
    if on_gpu:
        if device_ids or output_device is not None or _on_cuda(module):
            _ensure_on(module, device)
        new_ids = [device.index] if device_ids else device_ids
        new_output = None if output_device is None else device.index
    else:
        if _on_cuda(module):
            module.to(device)
        new_ids, new_output = None, None
    if list(new_ids or []) != [_index(d) for d in device_ids or []] or (
            output_device is not None and new_output != _index(output_device)):
        notices.say("ddp-devices", lambda: (
            f"singlecard_nb: DistributedDataParallel(device_ids={device_ids!r}"
            + (f", output_device={output_device!r}" if output_device is not None else "")
            + f") runs on {device}" + (" (a CPU module takes no device ids)" if not on_gpu
                                      else "") + "."), stacklevel=3)
    if "device_ids" in arguments or new_ids is not None:
        arguments["device_ids"] = new_ids
    if "output_device" in arguments or new_output is not None:
        arguments["output_device"] = new_output


def _index(device: Any) -> Any:
    if isinstance(device, torch.device):
        return device.index
    if isinstance(device, str):
        return torch.device(device).index
    return device


def _on_cuda(module: nn.Module) -> bool:
    return any(t.device.type == "cuda" for t in _tensors(module))


# --- the torchrun environment -----------------------------------------------------------------
def _provide_torchrun_env(owner: Borrowed, environ: MutableMapping[str, str] | None = None) -> None:
    environ = os.environ if environ is None else environ
    for name, value in TORCHRUN_ENV.items():
        if name not in environ:
            owner.set_env(name, value, environ)
    if "MASTER_PORT" not in environ:
        owner.set_env("MASTER_PORT", str(_free_port()), environ)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- helpers ----------------------------------------------------------------------------------
def _normalise(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # Asking torch for the current device would start CUDA; the pin is always explicit.
        device = torch.device("cuda", 0)
    return device


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    return chain(module.parameters(), module.buffers())


def _ensure_on(module: nn.Module, device: torch.device) -> None:
    if any(t.device != device for t in _tensors(module)):
        module.to(device)


def _move(obj: Any, device: torch.device) -> Any:
    """Move tensors in nested tuples / lists / dicts to `device`, as DataParallel's scatter does."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device)
    if isinstance(obj, PackedSequence):  # its batch_sizes must stay on the CPU
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(item, device) for item in obj))
    if isinstance(obj, tuple):
        return tuple(_move(item, device) for item in obj)
    if isinstance(obj, list):
        return [_move(item, device) for item in obj]
    if isinstance(obj, dict) and obj:
        return type(obj)((key, _move(value, device)) for key, value in obj.items())
    return obj

