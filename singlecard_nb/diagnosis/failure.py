"""A failure as the rules read it (`Failure`), and the words they share to describe it.

Ground for the rule modules in `rules/`, for `hints` that runs them and for `explain` that builds
the `Failure`: shapes, dtypes and NaN/Inf counts are written the same way in every sentence.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .traceback_calls import module_label


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
    # The module calls around it, outermost first, itself last: (path, module, args, kwargs).
    callers: list[tuple[str, nn.Module, tuple, dict]] = dataclasses.field(default_factory=list)
    # Modules in the namespace of the user's failing line, by name (the model next to a loss
    # called in a cell: `loss = criterion(model(x), y)` has only the loss on the stack).
    neighbours: list[tuple[str, nn.Module]] = dataclasses.field(default_factory=list)
    root: Any = None  # the outermost module on the traceback (the model), when known
    wrapper: Any = None  # the DataParallel / DDP / FSDP wrapper around root, when it had one
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

    def outermost(self) -> tuple[str, nn.Module, tuple, dict] | None:
        """The outermost module call on the stack (the model the user called), if not this one."""
        return self.callers[0] if len(self.callers) > 1 else None

    def scope(self) -> list[tuple[str, nn.Module]]:
        """(label, module) of every module of the model on the stack and of the models next to
        the user's failing line, each module once: where a rule may look for the code that made
        an input."""
        seen: set[int] = set()
        found: list[tuple[str, nn.Module]] = []
        roots = [("", self.callers[0][1])] if self.callers else []
        for base, root in roots + self.neighbours:
            for path, module in root.named_modules():
                if id(module) not in seen:
                    seen.add(id(module))
                    name = f"{base}.{path}" if base and path else base or path
                    found.append((module_label(type(module).__name__, name), module))
        return found

    def forward_lines(self, pattern: str) -> list[tuple[str, str]]:
        """(module label, line) of the lines matching `pattern` in the forward of the modules
        in `scope` whose class is the user's (not torch's)."""
        found, read = [], set()
        for label, module in self.scope():
            cls = type(module)
            if cls in read or cls.__module__.startswith("torch."):
                continue
            read.add(cls)
            try:
                lines = inspect.getsourcelines(cls.forward)[0]
            except (OSError, TypeError):  # defined where no source is kept
                continue
            found += [(label, line.strip()) for line in lines if re.search(pattern, line)]
        return found

    def code(self) -> str:
        """The failing line, quoted, for sentences that point at it."""
        if self.source and self.location:
            return f"`{self.source}` ({self.location})"
        return f"`{self.source}`" if self.source else "a line"


Rule = Callable[[Failure], "str | None"]
"""A diagnosis rule: one plain sentence when it recognises the failure, else None."""


# --- words the sentences share --------------------------------------------------------------


LENGTH_NAMES = ("max_len", "max_length", "max_seq_len", "max_position_embeddings", "n_positions",
                "block_size", "context_length", "seq_len", "n_ctx")


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
