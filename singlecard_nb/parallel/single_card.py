"""Single-card mode: code written for several GPUs runs unchanged on the one pinned device.

While single-card mode is on (`enable(device)`, called by `session.pin` with the pinned device):

- `nn.DataParallel` runs its module on the pinned device in the calling thread: no replicas, no
  scatter/gather threads. The class itself is kept (its `__init__` and `forward` are patched), so
  `isinstance` holds, `.module` and the `module.` prefix of `state_dict()` keys stay, and wrappers
  built before single-card mode are covered too.
- `DistributedDataParallel` becomes a *pass-through* (the note above `_patch_ddp` says why not a real
  world-size-1 DDP): the same class and attributes, the module on the pinned device, no reducer.
- `torch.distributed.init_process_group` forms a world of one (rank 0) on a fresh store, destroying
  a previous default group first, so re-running a cell neither fails nor hangs.
- `torch.cuda.set_device(any index)` selects the pinned card (a no-op when pinned to the cpu), and
  the torchrun variables (`RANK`, `LOCAL_RANK`, ...) are provided where unset.

Every change goes through one `borrow.Borrowed` owner; `disable()` gives back the identical
original objects and environment.
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import warnings
from collections.abc import Iterator, MutableMapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import PackedSequence

from ..borrow import Borrowed

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
_UNSET = object()  # sentinel: a DDP wrapper that single-card mode did not build


@dataclass
class _State:
    owner: Borrowed | None = None
    device: torch.device | None = None
    wrappers: int = 0  # DataParallel / DDP wrappers built while on
    groups: int = 0  # default process groups formed while on
    group: Any = None  # the default group we formed last, destroyed on disable if still current
    said: set[str] = field(default_factory=set)  # keys of the notices given once per enable


_state = _State()


# --- public -----------------------------------------------------------------------------------
def enable(device: torch.device | str) -> None:
    """Turn single-card mode on for `device`; calling again with another device switches to it.

    Never starts CUDA: devices are only touched when user code builds a wrapper or a group.
    """
    device = _normalise(device)
    if _state.owner is not None:
        if _state.device == device:
            return
        disable()
    owner = Borrowed("single-card mode")
    _state.owner, _state.device = owner, device
    _state.wrappers = _state.groups = 0
    _state.said = set()
    done = False
    try:
        # Registered first so it runs last, after the patches are gone; it also runs when
        # `borrow.restore_all()` (extension unload) restores this owner without disable().
        owner.on_restore(functools.partial(_forget, owner), _BOOKKEEPING)
        _patch_data_parallel(owner)
        _patch_ddp(owner)
        _patch_process_groups(owner)
        _patch_cuda_set_device(owner)
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
    group = _state.group
    _state.owner = _state.device = _state.group = None
    # A group formed on our private store would break the user's next real init_process_group.
    if group is not None and _default_group() is group:
        dist.destroy_process_group()


def enabled() -> bool:
    """Whether single-card mode is on."""
    return _state.owner is not None


def unwrap(model: nn.Module, device: torch.device | None = None) -> nn.Module:
    """The module inside DataParallel / DDP wrappers (nested too), moved to `device`.

    device: where the module goes (default: single-card mode's device; None leaves it in place).
    Works for wrappers built before single-card mode.
    """
    while isinstance(model, (nn.DataParallel, DistributedDataParallel)):
        model = model.module
    device = _state.device if device is None else device
    if device is not None:
        model.to(device)
    return model


def report() -> dict:
    """What single-card mode is doing, for `%singlecard status`."""
    owner = _state.owner
    labels = owner.describe() if owner is not None else []
    return {
        "enabled": owner is not None,
        "device": None if _state.device is None else str(_state.device),
        "patched": [label for label in labels if label != _BOOKKEEPING],
        "wrappers": _state.wrappers,
        "groups": _state.groups,
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

    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            device = _state.device
            # Covers wrappers built before single-card mode, whose module may sit elsewhere.
            _ensure_on(self.module, device)
            return self.module(*_move(inputs, device), **_move(kwargs, device))

    owner.set_attr(data_parallel, "__init__", _wrap_like(data_parallel.__init__, __init__))
    owner.set_attr(data_parallel, "forward", _wrap_like(data_parallel.forward, forward))


# --- DistributedDataParallel ------------------------------------------------------------------
# Pass-through, not a real world-size-1 DDP. With one process the gradient all-reduce is the
# identity, so the model, its gradients and optimiser steps are exactly the bare model's. A real
# DDP would cost an extra copy of every gradient (its buckets) on the one card being debugged, a
# collective per bucket per backward, and it needs an initialised process group; it also rejects
# `device_ids` for CPU modules, which `%singlecard cpu` must accept. What is lost: DDP's own
# complaints (unused parameters without `find_unused_parameters=True`) and the numerics of comm
# hooks (e.g. fp16 compression), which are recorded, not run: there is nothing to communicate.
_DDP_PASSTHROUGH_METHODS = (
    "join",
    "join_hook",
    "register_comm_hook",
    "_register_builtin_comm_hook",
    "_set_static_graph",
    "__getstate__",
)


def _patch_ddp(owner: Borrowed) -> None:
    ddp = DistributedDataParallel
    signature = inspect.signature(ddp.__init__)

    def __init__(self, module, *args, **kwargs):
        # Bind to the installed torch's own signature: same argument errors, any torch version.
        bound = signature.bind(self, module, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        super(ddp, self).__init__()
        _joinable_init(self)
        device_ids = arguments.get("device_ids")
        output_device = arguments.get("output_device")
        # The two checks real DDP makes that hold for one process too (same messages).
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        if not any(p.requires_grad for p in module.parameters()):
            raise RuntimeError(
                "DistributedDataParallel is not needed when a module doesn't have any "
                "parameter that requires a gradient."
            )
        device = _state.device
        # `device_ids` or a GPU module asks for the accelerator, which is now the pinned device;
        # a CPU module without device_ids is a CPU DDP program and stays on the CPU.
        wants_device = (
            bool(device_ids)
            or output_device is not None
            or any(t.device.type != "cpu" for t in _tensors(module))
        )
        if wants_device:
            module.to(device)
        self.module = module
        self._singlecard_passthrough = True
        self._singlecard_inputs_to = device if wants_device else None
        self._singlecard_requested = {"device_ids": device_ids, "output_device": output_device}
        self._singlecard_comm_hooks = []
        on_gpu = wants_device and device.type == "cuda"
        self.device_ids = [device.index] if on_gpu else None
        self.output_device = device.index if on_gpu else None
        self.device = device if wants_device else next(module.parameters()).device
        self.device_type = self.device.type
        self.dim = arguments.get("dim", 0)
        self.process_group = _process_group_for(arguments)
        broadcast_buffers = arguments.get("broadcast_buffers")
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.find_unused_parameters = arguments.get("find_unused_parameters", False)
        self.gradient_as_bucket_view = arguments.get("gradient_as_bucket_view", False)
        self.static_graph = bool(arguments.get("static_graph", False))
        self.mixed_precision = arguments.get("mixed_precision")
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self.require_backward_grad_sync = True  # flipped by DDP's own no_sync(), which we keep
        self.require_forward_param_sync = True
        _state.wrappers += 1

    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DistributedDataParallel.forward"):
            target = self.__dict__.get("_singlecard_inputs_to", _UNSET)
            if target is _UNSET:
                # A real DDP built before single-card mode: run its module directly. Its reducer
                # then stays idle (it only syncs after its own forward prepared a backward).
                target = _state.device if self.device_ids else None
                if target is not None:
                    _ensure_on(self.module, target)
            if target is not None:
                inputs, kwargs = _move(inputs, target), _move(kwargs, target)
            return self.module(*inputs, **kwargs)

    owner.set_attr(ddp, "__init__", _wrap_like(ddp.__init__, __init__))
    owner.set_attr(ddp, "forward", _wrap_like(ddp.forward, forward))
    for name in _DDP_PASSTHROUGH_METHODS:
        original = getattr(ddp, name)
        owner.set_attr(ddp, name, _for_passthrough(original, _PASSTHROUGH[name]))
    owner.set_attr(
        ddp, "__setstate__", _wrap_like(ddp.__setstate__, _ddp_setstate(ddp.__setstate__))
    )


def _joinable_init(module: nn.Module) -> None:
    from torch.distributed.algorithms.join import Joinable

    Joinable.__init__(module)


def _process_group_for(arguments: dict) -> Any:
    if arguments.get("process_group") is not None:
        return arguments["process_group"]
    mesh = arguments.get("device_mesh")
    if mesh is not None:
        return mesh.get_group(mesh_dim=0)
    # Real DDP needs an initialised default group; one process needs none to compute.
    return _default_group()


def _for_passthrough(original, replacement):
    """A method that runs `replacement` for pass-through wrappers, `original` for real DDPs."""

    def method(self, *args, **kwargs):
        if self.__dict__.get("_singlecard_passthrough"):
            return replacement(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    return _wrap_like(original, method)


def _join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
    # One process cannot have uneven inputs: nothing to shadow.
    return nullcontext()


def _join_hook(self, **kwargs):
    from torch.distributed.algorithms.join import JoinHook

    return JoinHook()  # no-op main/post hooks, for `Join([model, optimizer])`


def _register_comm_hook(self, state, hook):
    if not callable(hook):
        raise TypeError(f"register_comm_hook expects a callable hook, got {hook!r}")
    self._singlecard_comm_hooks.append((state, hook))


def _register_builtin_comm_hook(self, comm_hook_type):
    self._singlecard_comm_hooks.append((None, comm_hook_type))


def _set_static_graph(self):
    self.static_graph = True


def _getstate(self):
    # copy.deepcopy / pickle: a process group is neither copyable nor picklable.
    state = dict(self.__dict__)
    state.pop("process_group", None)
    return state


def _ddp_setstate(original):
    def __setstate__(self, state):
        if not state.get("_singlecard_passthrough"):
            return original(self, state)
        nn.Module.__setstate__(self, state)
        self.process_group = _default_group()

    return __setstate__


_PASSTHROUGH = {
    "join": _join,
    "join_hook": _join_hook,
    "register_comm_hook": _register_comm_hook,
    "_register_builtin_comm_hook": _register_builtin_comm_hook,
    "_set_static_graph": _set_static_graph,
    "__getstate__": _getstate,
}


# --- process groups ---------------------------------------------------------------------------
def _patch_process_groups(owner: Borrowed) -> None:
    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    signature = inspect.signature(original)

    def init_process_group(*args, **kwargs):
        requested = signature.bind(*args, **kwargs).arguments
        _say_if_world_ignored(requested.get("world_size", -1))
        # Re-running the cell: torch would refuse a second default group.
        if dist.is_initialized():
            dist.destroy_process_group()
        backend = _choose_backend(requested.get("backend"))
        # A fresh store every time: re-using one after destroy_process_group() can hang.
        options: dict[str, Any] = {
            "backend": backend,
            "store": dist.HashStore(),
            "rank": 0,
            "world_size": 1,
        }
        if requested.get("timeout") is not None:
            options["timeout"] = requested["timeout"]
        if requested.get("pg_options") is not None and backend == requested.get("backend"):
            options["pg_options"] = requested["pg_options"]
        if requested.get("device_id") is not None and _state.device.type == "cuda":
            options["device_id"] = _state.device  # any rank's card is the pinned card
        original(**options)
        _state.groups += 1
        _state.group = dist.group.WORLD

    patched = _wrap_like(original, init_process_group)
    owner.set_attr(distributed_c10d, "init_process_group", patched)
    owner.set_attr(dist, "init_process_group", patched)


def _choose_backend(requested: Any) -> str:
    """nccl on a GPU, gloo on the cpu or where nccl is missing; other explicit choices kept."""
    nccl_usable = _state.device.type == "cuda" and dist.is_nccl_available()
    if requested is None:
        return "nccl" if nccl_usable else "gloo"
    requested = str(requested).lower()
    if "nccl" in requested and not nccl_usable:
        why = (
            "single-card mode is pinned to the cpu"
            if _state.device.type != "cuda"
            else "this torch build has no nccl"
        )
        _say_once("gloo", f"singlecard_nb: init_process_group uses gloo instead of nccl: {why}.")
        return "gloo"
    return requested


def _say_if_world_ignored(world_size: int) -> None:
    launcher = os.environ.get("WORLD_SIZE", "1")
    if (world_size not in (-1, 1, None)) or launcher != "1":
        asked = world_size if world_size not in (-1, None) else launcher
        _say_once(
            "world",
            f"singlecard_nb: world size {asked} requested; single-card mode runs this process "
            "as a world of one (rank 0). `%singlecard off` to run real multi-process code.",
        )


# --- torch.cuda.set_device and the torchrun environment ---------------------------------------
def _patch_cuda_set_device(owner: Borrowed) -> None:
    original = torch.cuda.set_device

    def set_device(device):
        # Every rank's card is the pinned card: cuda:0 under a hard pin (CUDA_VISIBLE_DEVICES),
        # cuda:N under a soft pin. Pinned to the cpu there is no card to select.
        if _state.device.type == "cuda":
            original(_state.device.index)

    owner.set_attr(torch.cuda, "set_device", _wrap_like(original, set_device))


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


def _default_group() -> Any:
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


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


def _wrap_like(original, replacement):
    """`replacement` carrying `original`'s name and docstring (help() and tracebacks stay clear)."""
    return functools.update_wrapper(replacement, original)


def _say_once(key: str, message: str) -> None:
    if key not in _state.said:
        _state.said.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)  # the user's init_process_group call
