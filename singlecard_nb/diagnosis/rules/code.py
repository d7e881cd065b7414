"""Rules on code inside a custom forward: view, reshape, broadcasting; and what torch.compile's
tracing met.

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import math
import re

from torch import nn

from ..failure import Failure, ints, search

_SIZE_NAMES = re.compile(r"head|embed|embd|d_model|hidden|dim|size")
_LENGTH_NAMES = ("max_len", "max_length", "max_seq_len", "max_position_embeddings", "n_positions",
                 "block_size", "context_length", "seq_len", "n_ctx")


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
    return text + _size_attributes(f.module)


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
        for name in _LENGTH_NAMES:
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
