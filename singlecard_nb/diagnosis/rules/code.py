"""Rules on code inside a custom forward: view, reshape, broadcasting; and what torch.compile's
tracing met.

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import math
import re

from torch import nn

from ...job import launched_world_size
from ..failure import LENGTH_NAMES, Failure, ints, search

_SIZE_NAMES = re.compile(r"head|embed|embd|d_model|hidden|dim|size")


def _size_attributes(module: nn.Module) -> str:
    found = [f"{name}={value}" for name, value in vars(module).items()
             if type(value) is int and not name.startswith("_") and _SIZE_NAMES.search(name)]
    return f" (the module's {', '.join(found[:6])})" if found else ""


def view_non_contiguous(f: Failure) -> str | None:
    if not search(r"view size is not compatible with input tensor's size and stride", f):
        return None
    return (f"In the forward of {f.label}, {f.code()} calls .view on a non-contiguous tensor "
            "(one made by transpose, permute or slicing): use .reshape(...) or "
            ".contiguous().view(...)")


def view_invalid_shape(f: Failure) -> str | None:
    match = search(r"shape '\[([-\d, ]+)\]' is invalid for input of size (\d+)", f)
    if not match:
        return None
    shape, size = ints(match[1]), int(match[2])
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        text = (f"In the forward of {f.label}, {f.code()} reshapes a tensor of {size} elements "
                f"to {shape}, but {size} is not a multiple of {known}")
    else:
        text = (f"In the forward of {f.label}, {f.code()} asks for shape {shape} ({known} "
                f"elements) from a tensor of {size} elements")
    return text + _world_sized(f, shape) + _size_attributes(f.module)


def _world_sized(f: Failure, shape: list[int]) -> str:
    """A size that is the batch this rank got × the job's world size: the global batch."""
    world = launched_world_size()
    named = f.source is not None and re.search(r"world_size|WORLD_SIZE|get_world_size",
                                               f.source)
    batches = {int(t.shape[0]) for _, t in f.tensors() if t.dim() >= 1}
    for s in shape:
        for w in ([world] if world > 1 else []) + ([2, 4, 8] if named else []):
            if s > 0 and s % w == 0 and s // w in batches:
                return (f": {s} is {s // w} × {w}, the global batch (each rank's batch × the "
                        f"world size {w}), while this rank's tensors have batch {s // w}; size "
                        "the view by the tensor itself (x.size(0), or -1), not by the global "
                        "batch")
    return ""


_RESAMPLING = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Upsample)


def cat_sizes(f: Failure) -> str | None:
    match = search(r"Sizes of tensors must match except in dimension (\d+)\. Expected size (\d+) "
                   r"but got size (\d+) for tensor number (\d+) in the list", f)
    if not match:
        return None
    dim, want, got, number = (int(m) for m in match.groups())
    text = (f"In the forward of {f.label}, {f.code()} joins tensors along dimension {dim}, so "
            f"their other dimensions must be equal; tensor {number} in the list has size {got} "
            f"where the first has {want}")
    if abs(want - got) != 1:
        return text
    big, small = max(want, got), min(want, got)
    text += (f": off by one, as when an odd size ({big if big % 2 else small}) is halved by "
             "pooling or a stride-2 layer and doubled back")
    ups = [(name, m) for name, m in f.module.named_modules() if isinstance(m, _RESAMPLING)]
    if len(ups) == 1:
        name, up = ups[0]
        text += f" (its {name}, {type(up).__name__}, makes the doubled size)"
    return text + (": pad or crop one to the other's size before the cat (F.pad(x, ...), or "
                   "F.interpolate(x, size=skip.shape[2:])), or use inputs whose sizes divide by "
                   "2 at every level")


def broadcast_sizes(f: Failure) -> str | None:
    match = search(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                   r"at non-singleton dimension (\d+)", f)
    if not match:
        return None
    a, b = int(match[1]), int(match[2])
    text = (f"In the forward of {f.label}, {f.code()} combines tensors whose dimension "
            f"{match[3]} differ ({a} vs {b})")
    config = getattr(f.module, "config", None)
    for source in (f.module, config):
        for name in LENGTH_NAMES:
            limit = getattr(source, name, None)
            if type(limit) is int and limit in (a, b) and max(a, b) > limit:
                return text + f": the sequence ({max(a, b)}) is longer than {name}={limit}"
    return text


def traced_by_compile(f: Failure) -> str | None:
    if not f.traced:
        return None
    return (f"torch.compile was tracing {f.label} when this failed, so nothing had run and its "
            "inputs are not on the stack; the same code fails without torch.compile: run it "
            "under torch.compiler.set_stance(\"force_eager\") (or call the model before "
            "torch.compile) and explain that error for the inputs and a diagnosis")
