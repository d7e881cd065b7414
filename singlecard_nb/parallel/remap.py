"""Device references follow the pin: every way code names a CUDA device reaches the pinned one.

Multi-GPU code names its card everywhere: `.to(local_rank)`, `.cuda(rank)`, `device=f"cuda:{rank}"`,
`torch.load(path, map_location=f"cuda:{rank}")`, `torch.cuda.set_device(rank)`,
`with torch.cuda.device(rank):`. While single-card mode is on, each of these is sent to the
pinned device: under a hard GPU pin (the card is cuda:0) only other ordinals change; under a soft
pin to cuda:N every other ordinal becomes N; pinned to the CPU, every CUDA device is the CPU.

Mechanism: targeted patches of the calls that take a device, chosen by measurement over a
`TorchFunctionMode` (benchmarks/: a mode adds Python work to every torch operation, these add a
dictionary look-up to the calls that name a device and nothing to the others). Each remapping is
said once per kind (`Notices`) and counted for `%singlecard status`.

Not covered (they fail as torch makes them fail): `torch.device(0)` on a torch without CUDA,
`torch.Generator(device="cuda")`, CUDA streams and events, factory functions imported by name
before single-card mode was turned on, and code inside `torch.compile`d regions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from .pinned_memory import unpinned
from .under_cpu import under_cpu

# Functions in the torch namespace that take `device=` (keyword-only in all of them).
FACTORIES = (
    "arange", "as_tensor", "asarray", "bartlett_window", "blackman_window", "empty",
    "empty_like", "empty_permuted", "empty_strided", "eye", "from_file", "full", "full_like",
    "hamming_window", "hann_window", "kaiser_window", "linspace", "logspace", "normal", "ones",
    "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "randperm", "range", "scalar_tensor", "sparse_bsc_tensor", "sparse_bsr_tensor",
    "sparse_compressed_tensor", "sparse_coo_tensor", "sparse_csc_tensor", "sparse_csr_tensor",
    "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
)
TENSOR_FACTORIES = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor",
                    "new_zeros")
_DEVICE_TYPES = (str, int, torch.device)  # exact types: bool is no device, a dtype never is
NO_ARGUMENT = object()  # `.cuda()` called with no device


class Remapper:
    """Where a device reference goes while single-card mode is on `device`."""

    def __init__(self, device: torch.device, notices: Notices):
        self.device = device
        self.notices = notices
        self._memo: dict[tuple[type, Any], torch.device | None] = {}

    def target(self, requested: Any) -> torch.device | None:
        """The device to use instead of `requested`, or None to leave `requested` as it is."""
        key = (type(requested), requested)
        try:
            return self._memo[key]
        except KeyError:
            decided = self._memo[key] = self._decide(requested)
            return decided
        except TypeError:  # unhashable: not a device reference
            return None

    def _decide(self, requested: Any) -> torch.device | None:
        if type(requested) is int:
            index: int | None = requested  # an int device is a CUDA ordinal
        elif type(requested) in (str, torch.device):
            if isinstance(requested, str) and not requested.startswith("cuda"):
                return None
            try:
                requested = torch.device(requested)
            except RuntimeError:
                return None  # torch will say what is wrong with it
            if requested.type != "cuda":
                return None
            index = requested.index
        else:
            return None
        if under_cpu(self.device):
            return self.device  # pinned to the CPU: it is the one device there is
        if index is None or index == self.device.index:
            return None  # "cuda" is the current device, which single-card mode keeps pinned
        return self.device

    def say(self, kind: str, call: str, requested: Any, stacklevel: int = 3) -> None:
        """Count a remapping of `requested` in `call`; the first of its kind is warned about."""
        self.notices.say(
            kind,
            lambda: (f"singlecard_nb: {call.format(_argument(requested))} uses {self.device}, and "
                     f"so will every {_KINDS.get(kind, kind)} that names a CUDA device other "
                     "than the pinned one while single-card mode is on."),
            stacklevel=stacklevel,
        )


_KINDS = {".to": ".to()", ".cuda": ".cuda()", "device=": "device= of a factory function",
          "torch.load": "torch.load", "set_device": "torch.cuda.set_device()",
          "cuda.device": "torch.cuda.device()", "set_default_device": "torch.set_default_device()"}


def _argument(requested: Any) -> str:
    return "" if requested is NO_ARGUMENT else repr(requested)


def install(owner: Borrowed, remapper: Remapper) -> None:
    """Patch every call that takes a device so that it follows `remapper` (owned by `owner`)."""
    _patch_to(owner, remapper, torch.Tensor, "Tensor.to", "tensor.to({})")
    _patch_to(owner, remapper, nn.Module, "Module.to", "module.to({})")
    _patch_tensor_cuda(owner, remapper)
    _patch_storage_cuda(owner, remapper)
    for name in FACTORIES:
        if hasattr(torch, name):
            original = getattr(torch, name)
            patched = _factory(original, remapper, f"torch.{name}")
            owner.set_attr(torch, name, patched, "torch factory functions (device=)")
            _script_as_builtin(owner, patched, original)
    for name in TENSOR_FACTORIES:
        if hasattr(torch.Tensor, name):
            owner.set_attr(torch.Tensor, name,
                           _factory(getattr(torch.Tensor, name), remapper, f"tensor.{name}"),
                           "Tensor.new_* (device=)")
    _patch_load(owner, remapper)
    _patch_set_device(owner, remapper)
    _patch_cuda_device(owner, remapper)
    _patch_set_default_device(owner, remapper)


# --- .to() / .cuda() --------------------------------------------------------------------------
def _compiling() -> bool:
    # Inside torch.compile the original runs untouched: the remapping would break the graph.
    return torch.compiler.is_compiling()


def _patch_to(owner: Borrowed, remapper: Remapper, cls: type, label: str, call: str) -> None:
    original = cls.to

    def to(self, *args, **kwargs):
        if args:
            if type(args[0]) in _DEVICE_TYPES and not _compiling():
                new = remapper.target(args[0])
                if new is not None:
                    remapper.say(".to", call, args[0])
                    args = (new, *args[1:])
        elif kwargs.get("device") is not None and not _compiling():
            new = remapper.target(kwargs["device"])
            if new is not None:
                remapper.say(".to", call.replace("{}", "device={}"), kwargs["device"])
                kwargs["device"] = new
        return original(self, *args, **kwargs)

    owner.set_attr(cls, "to", wrap_like(original, to), label)


def _patch_tensor_cuda(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.Tensor.cuda
    to = torch.Tensor.to  # already patched: moving to remapper.device is never remapped again

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        if _compiling():
            return original(self, device, non_blocking, memory_format=memory_format)
        if under_cpu(remapper.device):  # pinned to the CPU: .cuda() means "the device"
            remapper.say(".cuda", "tensor.cuda({})", NO_ARGUMENT if device is None else device)
            return to(self, remapper.device, non_blocking=non_blocking,
                      memory_format=memory_format)
        if device is not None:
            new = remapper.target(device)
            if new is not None:
                remapper.say(".cuda", "tensor.cuda({})", device)
                device = new
        return original(self, device, non_blocking, memory_format=memory_format)

    owner.set_attr(torch.Tensor, "cuda", wrap_like(original, cuda), "Tensor.cuda")


def _patch_storage_cuda(owner: Borrowed, remapper: Remapper) -> None:
    # map_location=lambda storage, loc: storage.cuda(gpu) is how older scripts resume.
    from torch.storage import _StorageBase

    for cls, label in ((_StorageBase, "UntypedStorage.cuda"), (torch.TypedStorage,
                                                               "TypedStorage.cuda")):
        original = cls.cuda

        def cuda(self, device=None, non_blocking=False, _original=original):
            if under_cpu(remapper.device):
                remapper.say(".cuda", "storage.cuda({})", NO_ARGUMENT if device is None else device)
                return self.to(device=remapper.device, non_blocking=non_blocking)
            if device is not None:
                new = remapper.target(device)
                if new is not None:
                    remapper.say(".cuda", "storage.cuda({})", device)
                    device = new.index
            return _original(self, device, non_blocking)

        owner.set_attr(cls, "cuda", wrap_like(original, cuda), label)


# --- factories --------------------------------------------------------------------------------
def _factory(original: Callable, remapper: Remapper, name: str) -> Callable:
    call = name + "(..., device={})"

    def factory(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and not _compiling():
            new = remapper.target(device)
            if new is not None:
                remapper.say("device=", call, device)
                kwargs["device"] = new
        if kwargs.get("pin_memory") and under_cpu(remapper.device) and not _compiling():
            unpinned(kwargs, name, remapper.notices)  # the host is the device: as .pin_memory()
        return original(*args, **kwargs)

    return wrap_like(original, factory)


def _script_as_builtin(owner: Borrowed, patched: Callable, original: Callable) -> None:
    """Let TorchScript see `patched` as the aten op `original` is.

    TorchScript knows torch functions by identity (torch.jit._builtins, private but the only
    way): without this, scripting anything that calls torch.zeros while single-card mode is on
    fails (torch.distributed.optim scripts such code when first imported). Scripted code calls
    the op directly, so it is not remapped.
    """
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()
    op = table.get(id(original))
    if op is None:
        return
    table[id(patched)] = op

    def forget() -> None:
        # `patched` is alive until here (this closure holds it), so its id was not reused.
        if table.get(id(patched)) == op:
            del table[id(patched)]

    owner.on_restore(forget, "TorchScript builtin table")


# --- torch.load -------------------------------------------------------------------------------
def _patch_load(owner: Borrowed, remapper: Remapper) -> None:
    import torch.serialization as serialization

    original = torch.load
    signature = inspect.signature(original)
    default_restore = serialization.default_restore_location

    def load(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        map_location = bound.arguments.get("map_location")
        bound.arguments["map_location"] = _map_location(map_location, remapper, default_restore)
        return original(*bound.args, **bound.kwargs)

    patched = wrap_like(original, load)
    owner.set_attr(torch, "load", patched)
    if serialization.load is original:
        owner.set_attr(serialization, "load", patched)


def _map_location(map_location: Any, remapper: Remapper, default_restore: Callable) -> Any:
    """`map_location` for torch.load that sends every CUDA storage to the pinned device."""
    if type(map_location) in _DEVICE_TYPES:
        new = remapper.target(map_location)
        if new is None:
            return map_location
        remapper.say("torch.load", "torch.load(..., map_location={})", map_location, 4)
        return new

    def restore(storage, location):
        # torch's own rules for each form first, then the storage's place follows the pin.
        if callable(map_location):
            result = map_location(storage, location)
            if result is not None:
                return result
        elif isinstance(map_location, dict):
            location = map_location.get(location, location)
        new = remapper.target(location)
        if new is None:
            return default_restore(storage, location)
        what = "map_location={}" if map_location is not None else "a storage saved on {}"
        remapper.say("torch.load", f"torch.load(..., {what})",
                     map_location if isinstance(map_location, dict) else location, 3)
        return default_restore(storage, str(new))

    return restore


# --- torch.cuda.set_device / torch.cuda.device / torch.set_default_device ---------------------
def _patch_set_device(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.cuda.set_device

    def set_device(device):
        # Every rank's card is the pinned card: cuda:0 under a hard pin (CUDA_VISIBLE_DEVICES),
        # cuda:N under a soft pin. Pinned to the CPU there is no card to select.
        pinned = remapper.device
        if under_cpu(pinned):
            remapper.say("set_device", "torch.cuda.set_device({})", device)
            return
        if remapper.target(device) is not None:
            remapper.say("set_device", "torch.cuda.set_device({})", device)
        original(pinned.index)

    owner.set_attr(torch.cuda, "set_device", wrap_like(original, set_device))


def _patch_cuda_device(owner: Borrowed, remapper: Remapper) -> None:
    cls = torch.cuda.device
    original = cls.__init__

    def __init__(self, device):
        pinned = remapper.device
        if under_cpu(pinned):
            # Nothing to select: entering and leaving change nothing (and never start CUDA).
            self.idx = self.prev_idx = -1
            if device is not None and not (type(device) is int and device < 0):
                remapper.say("cuda.device", "torch.cuda.device({})", device)
            return
        original(self, device)
        if self.idx is not None and self.idx >= 0 and self.idx != pinned.index:
            self.idx = pinned.index
            remapper.say("cuda.device", "torch.cuda.device({})", device)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__), "torch.cuda.device")


def _patch_set_default_device(owner: Borrowed, remapper: Remapper) -> None:
    original = torch.set_default_device

    def set_default_device(device):
        new = remapper.target(device) if device is not None else None
        if new is not None:
            remapper.say("set_default_device", "torch.set_default_device({})", device)
            device = new
        return original(device)

    owner.set_attr(torch, "set_default_device", wrap_like(original, set_default_device))

