"""What an explanation says of a module's inputs and parameters: (index, shape, dtype, device)
and, where reading them is cheap, their values (lovely-tensors style). Nothing of a tensor is kept.

Indexes are those of `insp.frame()`: "[0]", "[0]['image']", "['attention_mask']", "[1].hidden".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from ..dtypes import dtype_name
from .failure import shape_text

_MAX_INPUTS = 32  # a Hugging Face cache can hold hundreds of tensors: describe the first ones
_MAX_DEPTH = 4
Described = tuple  # (index or name, shape, dtype, device)


def _leaves(obj: Any, index: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(index, tensor or numpy array) inside an argument; other values are skipped."""
    if isinstance(obj, torch.Tensor) or (type(obj).__module__ == "numpy" and hasattr(obj, "shape")):
        yield index, obj
    elif depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, field.name, None), f"{index}.{field.name}", depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, item in zip(obj._fields, obj):
            yield from _leaves(item, f"{index}.{name}", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj[:_MAX_INPUTS]):
            yield from _leaves(item, f"{index}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        for key, item in list(obj.items())[:_MAX_INPUTS]:
            yield from _leaves(item, f"{index}[{key!r}]", depth + 1)


def input_leaves(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for i, arg in enumerate(args):
        leaves += _leaves(arg, f"[{i}]")
    for key, value in kwargs.items():
        leaves += _leaves(value, f"[{key!r}]")
    return leaves[:_MAX_INPUTS]


def describe(name: str, value: Any) -> Described:
    """(name, shape, dtype, device) of a tensor or numpy array; nothing of it is kept."""
    if isinstance(value, torch.Tensor):
        try:
            shape = tuple(value.shape)
        except (RuntimeError, ValueError):  # an uninitialised lazy parameter has no shape yet
            shape = None
        return name, shape, dtype_name(value.dtype), str(value.device)
    return name, tuple(value.shape), f"numpy {value.dtype}", "numpy"


def describe_row(described: Described, values: str | None = None) -> str:
    name, shape, dtype, device = described
    text = f"{name} {shape_text(shape)} {dtype} {device}"
    return f"{text} {values}" if values else text


_MAX_SUMMARISED = 1 << 22  # elements: reading min/max of more would cost more than the failure


def values_text(value: Any) -> str | None:
    """"x∈[-2.1, 3.4]", "x∈[0, 99]", "x∈[-1, 2] nan!×3 inf!", "nan!×8" (lovely-tensors
    style) for a tensor small enough to read at once; None for others (meta, fake, complex,
    empty, huge) or when reading fails."""
    if (type(value) is not torch.Tensor or value.numel() == 0 or value.numel() > _MAX_SUMMARISED
            or value.device.type == "meta" or value.is_complex()):
        return None
    try:
        t = value.detach()
        if t.dtype == torch.bool:
            return f"{int(t.sum())} True"
        if not t.is_floating_point():
            low, high = torch.aminmax(t.reshape(-1))
            return f"x∈[{int(low)}, {int(high)}]"
        t = t.float()
        finite = torch.isfinite(t)
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        flags = "".join(f" {word}!" + (f"×{n}" if n > 1 else "")
                        for word, n in (("nan", nan), ("inf", inf)) if n)
        if nan + inf == t.numel():
            return flags.strip()
        low, high = torch.aminmax(t[finite])
        return f"x∈[{float(low):.3g}, {float(high):.3g}]{flags}"
    except Exception:  # an exotic tensor (a subclass, a broken device): the shape is enough
        return None
