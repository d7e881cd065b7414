"""One torch.cuda function replaced under an owner, labelled by kind for `%singlecard status`
(the `%singlecard cpu` answers of cuda_on_cpu.py, cpu_memory.py and cpu_random.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..borrow import Borrowed, wrap_like


def patch_cuda(owner: Borrowed, name: str, make: Callable[[Callable], Callable]) -> None:
    """torch.cuda.`name` replaced by `make(original)`; nothing where this torch has no `name`."""
    original = getattr(torch.cuda, name, None)
    if original is None:  # an older torch without this call
        return
    label = ("torch.cuda memory counters" if name.startswith(("memory", "max_memory", "reset"))
             else "torch.cuda random state" if "seed" in name or "rng" in name
             else f"torch.cuda.{name}")
    owner.set_attr(torch.cuda, name, wrap_like(original, make(original)), label)
