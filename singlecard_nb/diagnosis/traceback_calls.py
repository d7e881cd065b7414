"""The module calls on an exception's traceback, where the user's code failed, and how the model
names each module.

The frames of `Module.__call__` (`_wrapped_call_impl`, `_call_impl` and its `inner`) hold the
module being called and the arguments it was called with. What is read here is alive only
while an explanation is built.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys
from collections.abc import Iterator
from types import FrameType, TracebackType

from torch import nn
from torch.nn.modules import module as _module_impl

from ..frames import library_roots


def normalised(filename: str) -> str:
    return os.path.normcase(os.path.abspath(filename))


# Frames of Module.__call__'s own machinery: their `self` is the module being called.
_CALL_FRAMES = ("_wrapped_call_impl", "_call_impl", "inner", "_slow_forward")
_MODULE_FILE = normalised(_module_impl.__file__)
# Code that is not "where the user is": torch's and our own (all of singlecard_nb: the trap
# raises in inspection/'s hooks) frames are skipped for `where`.
LIBRARY_DIRS = library_roots()  # torch's and ours, each ending in the path separator


# --- reading the traceback -----------------------------------------------------------------


@dataclasses.dataclass
class Call:
    """One module call on the traceback, alive only while the explanation is built."""

    module: nn.Module
    args: tuple
    kwargs: dict
    open: bool = True  # no frame of its forward seen yet: deeper call frames are still its own


def chain_of(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or while handling (`raise X from e` inside a forward)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def _frames(tb: TracebackType | None) -> Iterator[tuple[FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _is_call_frame(frame: FrameType) -> bool:
    code = frame.f_code
    return (code.co_name in _CALL_FRAMES
            and normalised(code.co_filename) == _MODULE_FILE)


def _self_module(frame: FrameType) -> nn.Module | None:
    code = frame.f_code
    if not (code.co_varnames[:1] == ("self",) or "self" in code.co_freevars):
        return None
    module = frame.f_locals.get("self")
    return module if isinstance(module, nn.Module) else None


def module_calls(tb: TracebackType | None) -> list[Call]:
    """Module calls on the traceback, outermost first."""
    calls: list[Call] = []
    for frame, _ in _frames(tb):
        module = _self_module(frame)
        if module is None:
            continue
        last = calls[-1] if calls else None
        if _is_call_frame(frame):
            local = frame.f_locals
            args, kwargs = local.get("args", ()), local.get("kwargs", {})
            if last is not None and last.open and last.module is module:
                last.args, last.kwargs = args, kwargs  # deeper: after forward pre-hooks ran
            else:
                calls.append(Call(module, tuple(args), dict(kwargs)))
        elif last is not None and last.module is module:
            last.open = False  # its forward (or a method it calls)
        elif frame.f_code.co_name == "forward":
            # `self.block.forward(x)` called directly, without Module.__call__
            calls.append(Call(module, *_arguments(frame), open=False))
    return calls


def _arguments(frame: FrameType) -> tuple[tuple, dict]:
    """A forward frame's parameters as (args, kwargs); they may have been reassigned since."""
    code, local = frame.f_code, frame.f_locals
    count = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[1:count]
    args = tuple(local.get(n) for n in code.co_varnames[1:code.co_argcount])
    kwargs = {n: local.get(n) for n in names[code.co_argcount - 1:]}
    flags = code.co_flags
    if flags & 0x04:  # *args
        args += tuple(local.get(code.co_varnames[count], ()))
        count += 1
    if flags & 0x08:  # **kwargs
        kwargs.update(local.get(code.co_varnames[count], {}))
    return args, kwargs


def user_line(exc: BaseException) -> tuple[str | None, str | None]:
    """(location, source line) of the deepest frame outside torch and singlecard_nb."""
    found = None
    for frame, lineno in _frames(exc.__traceback__):
        if not normalised(frame.f_code.co_filename).startswith(LIBRARY_DIRS):
            found = (frame.f_code.co_filename, lineno, frame.f_code.co_name, frame.f_globals)
    if found is None:
        return None, None
    filename, lineno, function, module_globals = found
    source = linecache.getline(filename, lineno, module_globals).strip() or None
    return location(filename, lineno, function), source


_MAX_NEIGHBOURS = 64


def user_modules(exc: BaseException) -> list[tuple[str, nn.Module]]:
    """The modules named in the namespace of the deepest frame outside torch and singlecard_nb
    (a cell's variables, a training function's locals), the first few."""
    found = None
    for frame, _ in _frames(exc.__traceback__):
        if not normalised(frame.f_code.co_filename).startswith(LIBRARY_DIRS):
            found = frame
    if found is None:
        return []
    return [(name, value) for name, value in list(found.f_locals.items())
            if isinstance(value, nn.Module) and not name.startswith("_")][:_MAX_NEIGHBOURS]


def location(filename: str, lineno: int, function: str) -> str:
    """"In[5], line 3 in forward" for a notebook cell, else "model.py:31 in forward"."""
    cell = _notebook_cell(filename)
    if cell is not None:
        return f"{cell}, line {lineno} in {function}"
    name = os.path.basename(filename) if os.path.isfile(filename) else filename
    return f"{name}:{lineno} in {function}"


def _notebook_cell(filename: str) -> str | None:
    """"In[5]" for code of a notebook cell, as IPython's own tracebacks name it (else None)."""
    if "IPython" not in sys.modules:  # never import IPython here: scripts and torchrun run without
        return None
    compiler = getattr(sys.modules["IPython"].get_ipython(), "compile", None)
    format_code_name = getattr(compiler, "format_code_name", None)
    if format_code_name is not None:
        named = format_code_name(filename)
        return named[1] if named else None
    # Early IPython 8 releases have no format_code_name; their tracebacks read this map
    # (cell file -> execution count) instead.
    number = getattr(compiler, "_filename_map", {}).get(filename)
    return f"In[{number}]" if number is not None else None


# --- naming modules ------------------------------------------------------------------------


def child_name(parent: nn.Module, child: nn.Module) -> tuple[str, bool]:
    """How `parent` names `child`: (relative path, registered). The shortest registered path
    wins (a shared module called from this parent is named as this parent knows it)."""
    best = None
    for name, module in parent.named_modules(remove_duplicate=False):
        if module is child and name and (best is None or name.count(".") < best.count(".")):
            best = name
    if best is not None:
        return best, True
    # Not a submodule: held in a plain list or dict (a classic bug: .to() and the optimiser
    # never see it), or made inside forward.
    for attr, value in vars(parent).items():
        if value is child:
            return attr, False
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if item is child:
                    return f"{attr}[{i}]", False
        elif isinstance(value, dict):
            for key, item in value.items():
                if item is child:
                    return f"{attr}[{key!r}]", False
    return f"<{type(child).__name__}>", False


def join(parent: str, name: str) -> str:
    """A child's path below its parent's ("" is the outermost module)."""
    return f"{parent}.{name}" if parent else name


def module_label(module_type: str, path: str) -> str:
    """"Linear 'head.fc'"; the type alone for the outermost module ("") and for one with no name
    ("<Linear>": made inside its caller's forward)."""
    named = path and not path.rpartition(".")[2].startswith("<")
    return f"{module_type} '{path}'" if named else module_type
