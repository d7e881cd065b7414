"""Factory functions' `device=` (`torch.zeros(..., device="cuda:3")`, `x.new_ones(...)`) follows
the pin; TorchScript keeps seeing each patched function as its aten op."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...borrow import Borrowed, wrap_like
from ..cuda_on_cpu import under_cpu
from ..pinned_memory import unpinned
from .remapper import Remapper, compiling

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


def patch_factories(owner: Borrowed, remapper: Remapper) -> None:
    """`device=` of every factory in the torch namespace and of `Tensor.new_*`."""
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


def _factory(original: Callable, remapper: Remapper, name: str) -> Callable:
    call = name + "(..., device={})"

    def factory(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and not compiling():
            new = remapper.target(device)
            if new is not None:
                remapper.say("device=", call, device)
                kwargs["device"] = new
        if kwargs.get("pin_memory") and under_cpu(remapper.device) and not compiling():
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
