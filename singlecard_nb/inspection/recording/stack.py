"""What the interpreter's stack says about the model: how many calls of a module are running in
a thread (after Ctrl-C skipped torch's always-called hooks, and where `inspect_all` finds a
model), and whether autograd's engine is running a backward pass (where gradient
checkpointing recomputes forwards)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_CALL_IMPL = nn.Module._call_impl.__code__


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass (where checkpointing recomputes)."""
    return _graph_task_id() != -1


def calls_on_stack(frame: Any, module: nn.Module) -> int:
    """How many calls of `module` (its nn.Module._call_impl frames) are running in this stack."""
    count = 0
    while frame is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            count += 1
        frame = frame.f_back
    return count
