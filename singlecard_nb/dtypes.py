"""The one table of dtype names (ground floor: imports nothing of ours).

Rows, explanations and the kernel's entry points all call a dtype what torch prints without
its "torch." (float32, bfloat16, complex64). A dict, because a row is made per recorded tensor.
"""

from __future__ import annotations

from typing import Any

import torch

NAMES: dict[Any, str] = {dtype: str(dtype).removeprefix("torch.") for dtype in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


def dtype_name(dtype: Any) -> str:
    """torch.float32 -> "float32" (any dtype, also ones outside NAMES)."""
    name = NAMES.get(dtype)
    return name if name is not None else str(dtype).removeprefix("torch.")
