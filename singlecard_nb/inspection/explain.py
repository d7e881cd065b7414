"""Explain an exception raised inside a module's forward: which module, what it got, and why.

    try:
        model(x)
    except Exception as e:
        print(singlecard_nb.explain(e))   # or, in a notebook, singlecard_nb.explain()

Built from the exception's traceback alone. The frames of `Module.__call__` (`_wrapped_call_impl`,
`_call_impl` and its `inner`) hold the module being called and the arguments it was called with,
so nothing is recorded while the model runs: no hooks, no cost until something fails. The
explanation keeps descriptions only (paths, shapes, dtypes, devices, strings): no tensor, module
or frame is referenced once it is built. The diagnosis sentences are in `hints.py`.
"""

from __future__ import annotations

import dataclasses
import html
import linecache
import os
import re
import sys
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module_impl

from . import hints
from .hints import counts as _counts


def _normalised(filename: str) -> str:
    return os.path.normcase(os.path.abspath(filename))


# Frames of Module.__call__'s own machinery: their `self` is the module being called.
_CALL_FRAMES = ("_wrapped_call_impl", "_call_impl", "inner", "_slow_forward")
_MODULE_FILE = _normalised(_module_impl.__file__)
# Code that is not "where the user is": torch's and our own frames are skipped for `where`.
_LIBRARY_DIRS = tuple(os.path.normcase(os.path.dirname(os.path.abspath(p))) + os.sep for p in (
    torch.__file__, os.path.dirname(__file__)))
_MAX_INPUTS = 32  # a Hugging Face cache can hold hundreds of tensors: describe the first ones
_MAX_DEPTH = 4
_MAX_ALIASES = 4
_MAX_MESSAGE = 400

Described = tuple  # (index or name, shape, dtype, device)


@dataclasses.dataclass(frozen=True, repr=False)
class Explanation:
    """Where a forward pass failed. Renders as compact HTML in notebooks and as text elsewhere.

    module: path of the innermost module whose forward raised, relative to the outermost module
    on the stack ("" = that module itself). chain: [(path, type)] from the outermost down.
    inputs: [(index, shape, dtype, device)] of what it was called with (index as in
    `insp.frame()`: "[0]", "[0]['image']", "['attention_mask']"). params: [(name, shape, dtype,
    device)] of its own parameters and buffers. hint: one plain sentence, or None.
    """

    module: str
    module_type: str
    chain: list[tuple[str, str]]
    inputs: list[Described]
    params: list[Described]
    hint: str | None
    exception: str  # "RuntimeError: mat1 and mat2 shapes cannot be multiplied (...)"
    where: str | None = None  # "model.py:31 in forward: x = self.fc(x)", the deepest user line
    aliases: list[str] = dataclasses.field(default_factory=list)  # other paths of a shared module
    rank: int | None = None  # under torchrun (WORLD_SIZE > 1): the process's rank
    traced: bool = False  # found by torch.compile's tracing: no call ran, no inputs are known

    @property
    def label(self) -> str:
        return _label(self.module_type, self.module)

    def rows(self) -> list[tuple[str, str]]:
        """(heading, text) lines shared by the text and HTML renderings."""
        rows = [("error", self.exception)]
        if len(self.chain) > 1:
            rows.append(("chain", " › ".join(
                f"{path} ({kind})" if path else kind for path, kind in self.chain)))
        if self.aliases:
            rows.append(("shared", "also reachable as " + ", ".join(repr(a) for a in self.aliases)))
        if self.where:
            rows.append(("where", self.where))
        none = "not known: torch.compile was tracing, no call ran" if self.traced else "no tensors"
        rows.append(("inputs", "; ".join(_describe_row(d) for d in self.inputs) or none))
        rows.append(("params", "; ".join(_describe_row(d) for d in self.params) or "none of its own"))
        if self.hint:
            rows.append(("hint", self.hint))
        return rows

    def _headline(self) -> str:
        rank = f"[rank {self.rank}] " if self.rank is not None else ""
        return f"{rank}singlecard_nb.explain: {self.label} failed"

    def __repr__(self) -> str:
        rows = self.rows()
        width = max(len(heading) for heading, _ in rows)
        return "\n".join([self._headline()] + [f"  {h:<{width}}  {text}" for h, text in rows])

    __str__ = __repr__

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left;vertical-align:top;padding:1px 8px 1px 0'>"
            f"{html.escape(heading)}</th><td style='text-align:left;padding:1px 0'>"
            + (f"<b>{html.escape(text)}</b>" if heading == "hint" else
               f"<code>{html.escape(text)}</code>") + "</td></tr>"
            for heading, text in self.rows()
        )
        return ("<div class='singlecard-explain' style='border-left:3px solid #d9534f;"
                "padding:2px 8px;margin:4px 0;font-size:12px'>"
                f"<div><b>{html.escape(self._headline())}</b></div>"
                f"<table style='border-collapse:collapse;margin:0'>{body}</table></div>")


def explain(exc: BaseException | None = None) -> Explanation | None:
    """Explain `exc` (default: the last exception of this session, `sys.last_value`).

    Returns None, and says so, when it was not raised inside a module's forward.
    """
    if exc is None:
        exc = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
        if exc is None:
            print("singlecard_nb.explain: no exception has been raised in this session yet; "
                  "pass one: explain(exc).")
            return None
    explanation = build(exc)
    if explanation is None:
        print(f"singlecard_nb.explain: {_headline(exc)} was not raised inside a module's "
              "forward (no nn.Module call on its traceback), so there is nothing to explain.")
    return explanation


def build(exc: BaseException) -> Explanation | None:
    """The explanation of `exc`, or None when no module call is on its traceback (silent)."""
    for candidate in _chain_of(exc):
        calls = _module_calls(candidate.__traceback__)  # live modules and arguments: local only
        if calls:
            return _explain_calls(exc, candidate, calls)
    if _non_finite_error(exc) is not None:  # the trap fired in backward: no forward frames
        return _from_non_finite_attributes(exc)
    return None


# --- reading the traceback -----------------------------------------------------------------


@dataclasses.dataclass
class _Call:
    """One module call on the traceback, alive only while the explanation is built."""

    module: nn.Module
    args: tuple
    kwargs: dict
    open: bool = True  # no frame of its forward seen yet: deeper call frames are still its own


def _chain_of(exc: BaseException) -> Iterator[BaseException]:
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
            and _normalised(code.co_filename) == _MODULE_FILE)


def _self_module(frame: FrameType) -> nn.Module | None:
    code = frame.f_code
    if not (code.co_varnames[:1] == ("self",) or "self" in code.co_freevars):
        return None
    module = frame.f_locals.get("self")
    return module if isinstance(module, nn.Module) else None


def _module_calls(tb: TracebackType | None) -> list[_Call]:
    """Module calls on the traceback, outermost first."""
    calls: list[_Call] = []
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
                calls.append(_Call(module, tuple(args), dict(kwargs)))
        elif last is not None and last.module is module:
            last.open = False  # its forward (or a method it calls)
        elif frame.f_code.co_name == "forward":
            # `self.block.forward(x)` called directly, without Module.__call__
            calls.append(_Call(module, *_arguments(frame), open=False))
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


def _where(exc: BaseException) -> tuple[str | None, str | None]:
    """(location, source line) of the deepest frame outside torch and singlecard_nb."""
    found = None
    for frame, lineno in _frames(exc.__traceback__):
        if not _normalised(frame.f_code.co_filename).startswith(_LIBRARY_DIRS):
            found = (frame.f_code.co_filename, lineno, frame.f_code.co_name, frame.f_globals)
    if found is None:
        return None, None
    filename, lineno, function, module_globals = found
    source = linecache.getline(filename, lineno, module_globals).strip() or None
    return _location(filename, lineno, function), source


def _location(filename: str, lineno: int, function: str) -> str:
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
    shell = sys.modules["IPython"].get_ipython()
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    named = format_code_name(filename) if format_code_name is not None else None
    return named[1] if named else None


# --- naming modules ------------------------------------------------------------------------


def _child_name(parent: nn.Module, child: nn.Module) -> tuple[str, bool]:
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


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _label(module_type: str, path: str) -> str:
    # "" is the outermost module; "<Type>" one with no name (made inside its caller's forward)
    named = path and not path.rpartition(".")[2].startswith("<")
    return f"{module_type} '{path}'" if named else module_type


# --- describing tensors --------------------------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _leaves(obj: Any, index: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(index, tensor or numpy array) inside an argument; other values are skipped."""
    if isinstance(obj, torch.Tensor) or (type(obj).__module__ == "numpy" and hasattr(obj, "shape")):
        yield index, obj
    elif depth >= _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, field.name, None), f"{index}.{field.name}", depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, item in zip(obj._fields, obj):
            yield from _leaves(item, f"{index}.{name}", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj[:_MAX_INPUTS]):
            yield from _leaves(item, f"{index}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        for key, item in list(obj.items())[:_MAX_INPUTS]:
            yield from _leaves(item, f"{index}[{key!r}]", depth + 1)


def _input_leaves(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for i, arg in enumerate(args):
        leaves += _leaves(arg, f"[{i}]")
    for key, value in kwargs.items():
        leaves += _leaves(value, f"[{key!r}]")
    return leaves[:_MAX_INPUTS]


def describe(name: str, value: Any) -> Described:
    """(name, shape, dtype, device) of a tensor or numpy array; nothing of it is kept."""
    if isinstance(value, torch.Tensor):
        try:
            shape = tuple(value.shape)
        except (RuntimeError, ValueError):  # an uninitialised lazy parameter has no shape yet
            shape = None
        return name, shape, _dtype_name(value.dtype), str(value.device)
    return name, tuple(value.shape), f"numpy {value.dtype}", "numpy"


def _describe_row(described: Described) -> str:
    name, shape, dtype, device = described
    return f"{name} {hints.shape_text(shape)} {dtype} {device}"


# --- putting it together -------------------------------------------------------------------


def _explain_calls(exc: BaseException, raised: BaseException, calls: list[_Call]) -> Explanation:
    paths, registered = [""], True
    for parent, child in zip(calls, calls[1:]):
        name, registered = _child_name(parent.module, child.module)
        paths.append(_join(paths[-1], name))
    base = paths[-1]
    stack = _traced_stack(exc)
    traced = _traced_calls(stack, calls[-1].module, str(exc)) if stack else []
    for relative, module in traced:  # no frames of their own: named as the model names them
        calls.append(_Call(module, (), {}, open=False))
        paths.append(_join(base, relative))
        registered = True
    innermost, path = calls[-1], paths[-1]
    root = calls[0].module
    aliases = [p for p, m in root.named_modules(remove_duplicate=False)
               if m is innermost.module and p and p != path
               and p.replace("_orig_mod.", "") != path][:_MAX_ALIASES]  # torch.compile's wrapper
    module_type = type(innermost.module).__name__
    leaves = _input_leaves(innermost.args, innermost.kwargs)
    own = [*innermost.module.named_parameters(recurse=False),
           *innermost.module.named_buffers(recurse=False)]
    location, source = _traced_where(stack) if stack else (None, None)
    if location is None:
        location, source = _where(raised)
    hint = hints.diagnose(hints.Failure(
        exception=raised, module=innermost.module, path=path, label=_label(module_type, path),
        args=innermost.args, kwargs=innermost.kwargs, inputs=leaves, source=source,
        location=location, registered=registered, non_finite=_non_finite_error(exc),
        traced=bool(stack)))
    return Explanation(
        module=path, module_type=module_type,
        chain=[(p, type(c.module).__name__) for p, c in zip(paths, calls)],
        inputs=[describe(i, v) for i, v in leaves],
        params=[describe(n, t) for n, t in own],
        hint=hint, exception=_headline(exc) + (_traced_error(exc) if stack else ""),
        where=f"{location}: {source}" if location and source else location,
        aliases=aliases, rank=_rank(), traced=bool(traced),
    )


# --- under torch.compile: the modules its tracing was in -----------------------------------


def _traced_stack(exc: BaseException) -> list | None:
    """The user-code stack torch.compile (dynamo) was tracing when `exc` was raised, or None."""
    return next((e.real_stack for e in _chain_of(exc) if getattr(e, "real_stack", None)), None)


def _traced_calls(stack: list, module: nn.Module, message: str = "") -> list[tuple[str, nn.Module]]:
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
        filename = _normalised(frame.filename)
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
        path = _join(path, name)
        found.append((path, current))
        caller = frame
    return found


def _traced_where(stack: list) -> tuple[str | None, str | None]:
    """(location, source line) of the deepest user frame torch.compile was tracing."""
    for frame in reversed(stack):
        if not _normalised(frame.filename).startswith(_LIBRARY_DIRS) and frame.lineno is not None:
            source = (frame.line or "").strip() or None
            return _location(frame.filename, frame.lineno, frame.name), source
    return None, None


def _traced_error(exc: BaseException) -> str:
    """The error torch.compile's tracing met, from its message ("... got RuntimeError('...')"),
    as " (RuntimeError: ...)"; "" when the message does not carry one."""
    match = re.search(r"got (\w+(?:Error|Exception))\((['\"])(.+?)\2\)", str(exc))
    if match is None:
        return ""
    inner = match[3] if len(match[3]) <= _MAX_MESSAGE else match[3][:_MAX_MESSAGE] + "…"
    return f" ({match[1]}: {inner})"


def _runs_forward_of(module: nn.Module, frame: Any, filename: str) -> bool:
    """Whether `frame` (of dynamo's stack; `filename` normalised) runs `module`'s forward."""
    code = getattr(type(module).forward, "__code__", None)
    return (code is not None and frame.name == code.co_name
            and filename == _normalised(code.co_filename)
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


def _non_finite_error(exc: BaseException) -> Any:
    from ..errors import NonFiniteError

    return exc if isinstance(exc, NonFiniteError) else None


def _from_non_finite_attributes(exc: Any) -> Explanation:
    """A NonFiniteError raised in backward: the module is known, its inputs are not on the stack."""
    where = repr(exc.module) if exc.module else "the model itself"
    what = f"parameter {exc.index!r}" if exc.io == "param_grad" else f"the output{exc.index}"
    return Explanation(
        module=exc.module, module_type=exc.module_type, chain=[(exc.module, exc.module_type)],
        inputs=[], params=[], exception=_headline(exc),
        hint=(f"The gradient of {what} of {where} ({exc.module_type}) held "
              f"{_counts(exc.nan, exc.inf)} in backward at step {exc.step}: it was produced by "
              "the backward of what comes after this module (the next layers or the loss: sqrt "
              "or norm at 0, log of 0, a division by ~0); a backward pass has no module inputs "
              "on the stack to show"),
        rank=_rank(),
    )


def _headline(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _rank() -> int | None:
    try:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        pass
    return None
