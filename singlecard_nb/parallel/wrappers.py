"""Single-card mode's wrappers: DataParallel runs the module on the pinned device, DDP is the
real one over a world of one (single_card.py says what each promises).

- `nn.DataParallel` and `nn.parallel.data_parallel(...)` run the module on the pinned device in
  the calling thread: no replicas, no scatter/gather threads. The class is kept (its `__init__`
  and `forward` are patched), so `isinstance`, `.module` and the `module.` prefix of
  `state_dict()` keys stay, and wrappers built before single-card mode are covered too.
- `DistributedDataParallel` is the real DDP over a world of one, with its device arguments
  fixed up for the pinned device (none on the CPU). Without a process group it forms one.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import PackedSequence

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from .cuda_on_cpu import under_cpu
from .groups import Groups

Made = Callable[[str, str], None]  # made(what was asked, what it became): a wrapper was built


def install(owner: Borrowed, device: torch.device, groups: Groups, notices: Notices,
            made: Made) -> None:
    """DataParallel and DDP for `device`, owned by `owner`; `made` hears of each wrapper."""
    _patch_data_parallel(owner, device, made)
    _patch_ddp(owner, device, groups, notices, made)


# --- DataParallel -----------------------------------------------------------------------------
def _patch_data_parallel(owner: Borrowed, device: torch.device, made: Made) -> None:
    data_parallel = nn.DataParallel

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super(data_parallel, self).__init__()
        self.module = module.to(device)
        self.dim = dim
        # What DataParallel itself records on a machine with just this device, so code reading
        # these attributes (or DataParallel's own forward, after single-card mode ends) agrees.
        self.device_ids = [] if under_cpu(device) else [device.index]
        self.output_device = None if under_cpu(device) else device.index
        self.src_device_obj = device
        self._singlecard_requested = {"device_ids": device_ids, "output_device": output_device}
        made(f"DataParallel(device_ids={device_ids!r})",
             f"the module on {device}, in the calling thread")

    def forward(self, *inputs, **kwargs):
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            return _run_on(device, self.module, inputs, kwargs)

    owner.set_attr(data_parallel, "__init__", wrap_like(data_parallel.__init__, __init__))
    owner.set_attr(data_parallel, "forward", wrap_like(data_parallel.forward, forward))

    # The functional form, `nn.parallel.data_parallel(module, inputs, device_ids)`.
    functional = sys.modules["torch.nn.parallel.data_parallel"]
    original = functional.data_parallel

    def data_parallel_function(module, inputs, device_ids=None, output_device=None, dim=0,
                               module_kwargs=None):
        if not isinstance(inputs, tuple):
            inputs = (inputs,) if inputs is not None else ()
        return _run_on(device, module, inputs, module_kwargs or {})

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
def _patch_ddp(owner: Borrowed, device: torch.device, groups: Groups, notices: Notices,
               made: Made) -> None:
    ddp = DistributedDataParallel
    original = ddp.__init__
    signature = inspect.signature(original)

    def __init__(self, module, *args, **kwargs):
        # Bind to the installed torch's own signature: same argument errors, any torch version.
        call = signature.bind(self, module, *args, **kwargs)
        arguments = call.arguments
        requested = arguments.get("device_ids")
        _fix_devices(module, arguments, device, notices)
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
        made(f"DistributedDataParallel(device_ids={requested!r})",
             f"the real DDP on {device}, a world of one")

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
    on_gpu = not under_cpu(device)
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



# --- helpers ----------------------------------------------------------------------------------
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

