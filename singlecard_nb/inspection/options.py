"""inspect()'s arguments, checked; and how the Inspector reads and sets an option kept by the
one part of it that uses it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def check_arguments(model: Any, every: Any, max_rows: Any, steps: Any,
                    inputs: Any) -> tuple[nn.Module, nn.Module | None]:
    """The module to inspect and the torch.compile wrapper it came in (or None); raises
    TypeError / ValueError naming a bad argument and what would be accepted."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"inspect() needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            f"inspect() got a TorchScript module ({type(model).__name__}, from torch.jit."
            "script, trace or load): it runs as TorchScript, not Python, so no hook can see "
            "the modules inside it. inspect the nn.Module before scripting or tracing it "
            "(scn.inspect(model), then torch.jit.trace(model, ...) when you are done).")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive integer, got {every!r}")
    if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
    if steps not in ("forward", "manual"):
        raise ValueError(f"steps must be 'forward' or 'manual', got {steps!r}")
    if inputs not in (True, False, "root"):
        raise ValueError(f"inputs must be True, False or 'root', got {inputs!r}")
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, nn.Module):  # a torch.compile(...) wrapper: it runs the original
        return original, model
    return model, None


def check_memory(memory: Any) -> bool:
    """memory=: True or False (a name like "on" is a mistake worth naming)."""
    if not isinstance(memory, bool):
        raise ValueError(f"memory must be True or False, got {memory!r}")
    return memory


class Kept:
    """An option or count kept by the one part of the inspector that uses it, read and set
    through the Inspector: `every = Kept("_calls")` makes `insp.every` its call tracker's."""

    def __init__(self, part: str):
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, insp: Any, owner: type | None = None) -> Any:
        if insp is None:
            return self
        return getattr(getattr(insp, self.part), self.name)

    def __set__(self, insp: Any, value: Any) -> None:
        setattr(getattr(insp, self.part), self.name, value)
