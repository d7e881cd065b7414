"""Finding the tensors inside whatever a module takes or returns.

Module inputs and outputs are any structure: tensors, tuples with None, lists, dicts,
namedtuples, dataclasses (Hugging Face ModelOutput), ints, strings. `walk_tensors` yields every tensor
with its index in the notation of `insp.frame()` (`[0]`, `['logits']`, `.last_hidden_state`)
and skips everything else; it never raises into the user's forward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

MAX_DEPTH = 8  # nesting depth walked inside one output structure
MAX_TENSORS_PER_OUTPUT = 256  # a list of thousands of tensors is summarised by its first ones
MAX_OBJECTS_PER_OUTPUT = 4096  # objects looked at in one structure (lists of ints included)


class Found(list):
    """(index, tensor) pairs found in a structure; `truncated` when a bound cut the walk short."""

    truncated = False


def walk_tensors(obj: Any, index: str = "") -> Found:
    """(index, tensor) for the tensors inside a structure; everything else is skipped.

    Each container is visited once (a structure sharing references is walked in linear time),
    and at most MAX_TENSORS_PER_OUTPUT tensors and MAX_OBJECTS_PER_OUTPUT objects are looked at.
    """
    found = Found()
    _visit(obj, index, 0, found, set(), [MAX_OBJECTS_PER_OUTPUT])
    return found


def _visit(obj: Any, index: str, depth: int, found: Found, seen: set[int],
           budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        found.truncated = True
        return
    if isinstance(obj, torch.Tensor):
        if len(found) < MAX_TENSORS_PER_OUTPUT:
            found.append((index, obj))
        else:
            found.truncated = True
        return
    if depth >= MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if id(obj) in seen:
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Hugging Face ModelOutput is a dataclass too: fields read as `.last_hidden_state`.
        items = [(f"{index}.{f.name}", getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple, PackedSequence
        items = [(f"{index}.{name}", item) for name, item in zip(obj._fields, obj)]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{index}[{i}]", item) for i, item in enumerate(obj[:budget[0] + 1])]
    elif isinstance(obj, dict):
        items = []
        for key, item in obj.items():
            if len(items) > budget[0]:
                break
            items.append((f"{index}[{key!r}]", item))
    else:
        return
    seen.add(id(obj))
    for item_index, item in items:
        _visit(item, item_index, depth + 1, found, seen, budget)


def odd_shape(t: torch.Tensor) -> tuple:
    """The shape of a tensor without one regular shape (nested): ragged sizes are None."""
    try:
        return tuple(size if isinstance(size, int) else None for size in t.shape)
    except RuntimeError:  # a strided nested tensor refuses .shape; ask size by size
        sizes = []
        for dim in range(t.dim()):
            try:
                sizes.append(t.size(dim))
            except RuntimeError:
                sizes.append(None)
        return tuple(sizes)
