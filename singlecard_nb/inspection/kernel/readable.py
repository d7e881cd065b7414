"""Which tensors statistics can be taken of, and how they are read.

Subclasses are read through their data (`plain`): a Parameter's, a DTensor's local shard, a
MaskedTensor's unmasked values; a wrapper without memory of its own (a FakeTensor) is never read
(its `data_ptr()` is 0: the kernel would read address 0). A tensor whose elements fill one dense
block (`one_block`) is read by the kernel as a vector; others are copied first.
"""

from __future__ import annotations

import torch

from ... import borrow

_REDUCIBLE = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
})


def reducible(t: torch.Tensor) -> bool:
    """Whether statistics can be taken; sparse, quantized, nested and meta tensors cannot."""
    return (t.dtype in _REDUCIBLE and t.layout is torch.strided and not t.is_nested
            and not t.is_meta)


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The float type reductions run in: float64 keeps float64 and 32/64-bit integers (token
    ids and counts stay exact); half, bfloat16, small ints and bool accumulate in float32."""
    return torch.float64 if dtype in (torch.float64, torch.int32, torch.int64) else torch.float32


def as_real(x: torch.Tensor) -> torch.Tensor | None:
    """A float tensor to reduce, or None when `x` already is one."""
    if x.is_complex():
        return x.abs()  # magnitudes
    dtype = real_dtype(x.dtype)
    return None if x.dtype == dtype else x.to(dtype)


def plain(t: torch.Tensor) -> torch.Tensor | None:
    """The dense tensor with memory of its own whose values `t` holds: `t` itself, a
    Parameter's data, a DTensor's local shard (`to_local()`), a MaskedTensor's unmasked values,
    a subclass's plain view; None where there is none to read (a FakeTensor, other wrapper
    subclasses: their `data_ptr()` is 0)."""
    if type(t) is torch.Tensor:
        return t
    if callable(getattr(t, "to_local", None)) and hasattr(t, "placements"):  # DTensor
        # to_local() and get_data() are differentiable: no_grad, with Ctrl-C held back from
        # its entry to its exit (one in its __exit__ would leave grad mode off for the user)
        with borrow.uninterrupted(), torch.no_grad():
            local = t.to_local()
            wait = getattr(local, "wait", None)  # an AsyncCollectiveTensor
            local = wait() if callable(wait) and type(local) is not torch.Tensor else local
        return plain(local)
    if callable(getattr(t, "get_data", None)) and callable(getattr(t, "get_mask", None)):
        with borrow.uninterrupted(), torch.no_grad():
            data, mask = t.get_data(), t.get_mask()  # MaskedTensor: the values it holds
        if type(data) is torch.Tensor and type(mask) is torch.Tensor:
            return data.detach()[mask]
        return None
    d = t.detach()  # no graph: nothing needs no_grad here
    if type(d) is not torch.Tensor:
        try:
            d = d.as_subclass(torch.Tensor)  # a subclass made by _make_subclass: real memory
        except (RuntimeError, TypeError):
            return None
    if d.numel() and not _has_memory(d):
        return None
    return d


def _has_memory(t: torch.Tensor) -> bool:
    try:
        return t.untyped_storage().data_ptr() != 0 or is_zerotensor(t)
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def one_block(t: torch.Tensor) -> bool:
    """Whether the elements fill one dense block of memory from `data_ptr()`, in any order
    (contiguous, channels_last, transposed views): then a kernel can read them as a vector.
    The kernel only reads memory, so a tensor that requires grad needs no `detach()`."""
    if type(t) is not torch.Tensor or t.is_neg():
        return False  # subclasses (Parameter too) and lazily negated views: torch reads them
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def contiguous_in_place(t: torch.Tensor) -> bool:
    """Whether `t`'s values lie contiguous from `data_ptr()`, where a kernel may read (or copy)
    them as they are, a Parameter's too: strided, not nested, not lazily negated, with memory
    (a ZeroTensor's data_ptr() is 0). The recorder's path per module call makes the same
    checks inline (recorder._record_dense), where a call more costs."""
    return (t.layout is torch.strided and not t.is_nested and t.is_contiguous()
            and not t.is_neg() and t.data_ptr() != 0)


def is_zerotensor(t: torch.Tensor) -> bool:
    """torch's ZeroTensor (an efficient all-zero gradient) has no storage: data_ptr() is 0."""
    is_zero = getattr(t, "_is_zerotensor", None)
    return is_zero is not None and is_zero()


