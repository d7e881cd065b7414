"""Under torch.compile: the modules its tracing was in, and the user's line it was tracing.

Tracing runs no module call, so the traceback ends at the compiled module; dynamo keeps the
user-code stack it was tracing (`real_stack`), read here.
"""

from __future__ import annotations

import linecache
import re
from typing import Any

from torch import nn

from .traceback_calls import LIBRARY_DIRS, chain_of, join, location, normalised


def traced_stack(exc: BaseException) -> list | None:
    """The user-code stack torch.compile (dynamo) was tracing when `exc` was raised, or None."""
    return next((e.real_stack for e in chain_of(exc) if getattr(e, "real_stack", None)), None)


def traced_calls(stack: list, module: nn.Module, message: str = "") -> list[tuple[str, nn.Module]]:
    """[(path relative to the model, module)] that torch.compile was tracing inside `module`
    when it failed, outermost first.

    Tracing runs no module call, so the traceback ends at the compiled module. Dynamo keeps the
    user-code stack it was tracing (`real_stack`): each frame on it is matched to the submodule
    whose class's forward is that code, told apart by the caller's `self.<name>(` when several
    share a class, else by the parameter shapes the failing operation got (in dynamo's
    message); where that stays ambiguous, the walk stops at the parent.
    """
    shapes = [tuple(int(n) for n in re.findall(r"\d+", size)) for size in
              re.findall(r"Parameter\(FakeTensor\(\.\.\., size=\(([\d, ]*)\)", message)]
    current = getattr(module, "_orig_mod", module)  # a torch.compile wrapper: the user's model
    found: list[tuple[str, nn.Module]] = []
    path, caller = "", None
    for frame in stack:
        filename = normalised(frame.filename)
        if _runs_forward_of(current, frame, filename):
            caller = frame
            continue
        candidates = [(name, m) for name, m in current.named_modules()
                      if name and _runs_forward_of(m, frame, filename)]
        if len(candidates) > 1:
            called = _called_attribute(caller)
            if called is not None:
                candidates = [(n, m) for n, m in candidates if n == called]
            elif shapes:  # e.g. `for layer in self: x = layer(x)`: the weights it got
                candidates = [(n, m) for n, m in candidates if _holds_shapes(m, shapes)]
        if len(candidates) != 1:
            if candidates or frame.name == "forward":
                break  # several modules could be the one: stop at the one that is sure
            caller = frame  # a helper function or method: the same module goes on
            continue
        name, current = candidates[0]
        path = join(path, name)
        found.append((path, current))
        caller = frame
    return found


def traced_user_line(stack: list) -> tuple[str | None, str | None]:
    """(location, source line) of the deepest user frame torch.compile was tracing."""
    for frame in reversed(stack):
        if not normalised(frame.filename).startswith(LIBRARY_DIRS) and frame.lineno is not None:
            source = (frame.line or "").strip() or None
            return location(frame.filename, frame.lineno, frame.name), source
    return None, None


def _runs_forward_of(module: nn.Module, frame: Any, filename: str) -> bool:
    """Whether `frame` (of dynamo's stack; `filename` normalised) runs `module`'s forward."""
    code = getattr(type(module).forward, "__code__", None)
    return (code is not None and frame.name == code.co_name
            and filename == normalised(code.co_filename)
            and frame.lineno is not None
            and code.co_firstlineno <= frame.lineno <= max(
                (line for *_, line in code.co_lines() if line is not None),
                default=code.co_firstlineno))


def _holds_shapes(module: nn.Module, shapes: list[tuple[int, ...]]) -> bool:
    own = [tuple(p.shape) for p in module.parameters(recurse=False)]
    return all(shape in own for shape in shapes)


def _called_attribute(caller: Any) -> str | None:
    """"fc2" when the caller's failing expression is `self.fc2(...)` (or `self.blocks[3](...)`
    as "blocks.3"), else None."""
    if caller is None or caller.lineno is None:
        return None
    line = linecache.getline(caller.filename, caller.lineno)
    colno, end = getattr(caller, "colno", None), getattr(caller, "end_colno", None)
    segment = line[colno:end] if colno is not None and end is not None else line.strip()
    match = re.match(r"\s*self\.([A-Za-z_][\w.]*)(?:\[(\d+)\])?\s*\(", segment)
    if match is None:
        return None
    return f"{match[1]}.{match[2]}" if match[2] else match[1]
