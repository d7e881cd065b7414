"""A failure as the rules read it (`Failure`), and the words they share to describe it.

Ground for the rule modules in `rules/`, for `hints` that runs them and for `explain` that builds
the `Failure`: shapes, dtypes and NaN/Inf counts are written the same way in every sentence.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


@dataclasses.dataclass
class Failure:
    """What a rule may look at. Alive only while the hint is made: it holds the live tensors."""

    exception: BaseException
    module: nn.Module
    path: str
    label: str  # "Linear 'head.fc'"
    args: tuple
    kwargs: dict
    inputs: list[tuple[str, Any]]  # (index, tensor or numpy array), flattened
    source: str | None = None  # the deepest line of user code, e.g. "y = x.view(B, T, C)"
    location: str | None = None  # "model.py:42 in forward"
    registered: bool = True  # False: held in a plain list/dict, not a submodule of its caller
    non_finite: Any = None  # the NonFiniteError, when the trap raised it
    traced: bool = False  # torch.compile was tracing: nothing ran, no inputs on the stack
    root: Any = None  # the outermost module on the traceback (the model), when known
    root_inputs: list[tuple[str, Any]] = dataclasses.field(default_factory=list)  # its inputs

    @property
    def message(self) -> str:
        return str(self.exception)

    def arg(self, position: int, name: str) -> Any:
        """The argument at `position`, or passed as `name=`."""
        return self.args[position] if len(self.args) > position else self.kwargs.get(name)

    def tensor(self, position: int = 0, name: str = "input") -> torch.Tensor | None:
        value = self.arg(position, name)
        return value if isinstance(value, torch.Tensor) else None

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(i, t) for i, t in self.inputs if isinstance(t, torch.Tensor)]

    def own_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Its own parameters and buffers (a container with none: those of its submodules)."""
        own = [*self.module.named_parameters(recurse=False),
               *self.module.named_buffers(recurse=False)]
        return own or [*self.module.named_parameters(), *self.module.named_buffers()]

    def code(self) -> str:
        """The failing line, quoted, for sentences that point at it."""
        if self.source and self.location:
            return f"`{self.source}` ({self.location})"
        return f"`{self.source}`" if self.source else "a line"


Rule = Callable[[Failure], "str | None"]
"""A diagnosis rule: one plain sentence when it recognises the failure, else None."""


# --- words the sentences share --------------------------------------------------------------


def shape_text(shape: Any) -> str:
    """"(8, 3, 32, 32)"; "(shape unknown)" for None (a lazy parameter)."""
    if shape is None:
        return "(shape unknown)"
    return str(tuple(int(s) for s in shape))


def ints(text: str) -> list[int]:
    """The integers in a piece of torch's message: "[8, 3, 32]" -> [8, 3, 32]."""
    return [int(s) for s in re.findall(r"-?\d+", text)]


def search(pattern: str, failure: Failure) -> re.Match | None:
    """`pattern` found in the failure's message."""
    return re.search(pattern, failure.message)


def counts(nan: int, inf: int) -> str:
    """"3 NaN and 1 Inf", "2 Inf"; "NaN/Inf" when neither count is known."""
    parts = [f"{nan} NaN"] * bool(nan) + [f"{inf} Inf"] * bool(inf)
    return " and ".join(parts) or "NaN/Inf"


def moved_dimension(shape: tuple, size: int, skip: int) -> int | None:
    """A dimension other than `skip` (counted from the end: -1 = last) that has `size`."""
    for d, s in enumerate(shape):
        if s == size and d != len(shape) + skip:
            return d
    return None
