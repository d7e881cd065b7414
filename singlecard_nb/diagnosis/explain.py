"""Explain an exception raised inside a module's forward: which module, what it got, and why.

    try:
        model(x)
    except Exception as e:
        print(singlecard_nb.explain(e))   # or, in a notebook, singlecard_nb.explain()

Built from the exception's traceback alone (`calls`: the module calls on it hold the modules
and the arguments they were called with), so nothing is recorded while the model runs: no hooks,
no cost until something fails. The explanation keeps descriptions only (paths, shapes, dtypes,
devices, strings): no tensor, module or frame is referenced once it is built. The diagnosis
sentence comes from `hints`; under torch.compile, `compiled` reads what its tracing was in.
"""

from __future__ import annotations

import dataclasses
import html
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch

from ..dtypes import dtype_name
from ..errors import NonFiniteError
from ..job import place
from . import hints
from .calls import Call, chain_of, child_name, join, module_calls, module_label, user_line
from .compiled import traced_calls, traced_stack, traced_user_line
from .failure import Failure, counts, shape_text

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
        return module_label(self.module_type, self.module)

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
    for candidate in chain_of(exc):
        calls = module_calls(candidate.__traceback__)  # live modules and arguments: local only
        if calls:
            return _explain_calls(exc, candidate, calls)
    if _non_finite_error(exc) is not None:  # the trap fired in backward: no forward frames
        return _from_non_finite_attributes(exc)
    return None


# --- describing tensors --------------------------------------------------------------------


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
        return name, shape, dtype_name(value.dtype), str(value.device)
    return name, tuple(value.shape), f"numpy {value.dtype}", "numpy"


def _describe_row(described: Described) -> str:
    name, shape, dtype, device = described
    return f"{name} {shape_text(shape)} {dtype} {device}"


# --- putting it together -------------------------------------------------------------------


def _explain_calls(exc: BaseException, raised: BaseException, calls: list[Call]) -> Explanation:
    paths, registered = [""], True
    for parent, child in zip(calls, calls[1:]):
        name, registered = child_name(parent.module, child.module)
        paths.append(join(paths[-1], name))
    base = paths[-1]
    stack = traced_stack(exc)
    traced = traced_calls(stack, calls[-1].module, str(exc)) if stack else []
    for relative, module in traced:  # no frames of their own: named as the model names them
        calls.append(Call(module, (), {}, open=False))
        paths.append(join(base, relative))
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
    location, source = traced_user_line(stack) if stack else (None, None)
    if location is None:
        location, source = user_line(raised)
    hint = hints.diagnose(Failure(
        exception=raised, module=innermost.module, path=path, label=module_label(module_type, path),
        args=innermost.args, kwargs=innermost.kwargs, inputs=leaves, source=source,
        location=location, registered=registered, non_finite=_non_finite_error(exc),
        traced=bool(stack), root=root,
        root_inputs=_input_leaves(calls[0].args, calls[0].kwargs)))
    return Explanation(
        module=path, module_type=module_type,
        chain=[(p, type(c.module).__name__) for p, c in zip(paths, calls)],
        inputs=[describe(i, v) for i, v in leaves],
        params=[describe(n, t) for n, t in own],
        hint=hint, exception=_headline(exc) + (_traced_error(exc) if stack else ""),
        where=f"{location}: {source}" if location and source else location,
        aliases=aliases, rank=_rank(), traced=bool(traced),
    )


def _traced_error(exc: BaseException) -> str:
    """The error torch.compile's tracing met, from its message ("... got RuntimeError('...')"),
    as " (RuntimeError: ...)"; "" when the message does not carry one."""
    match = re.search(r"got (\w+(?:Error|Exception))\((['\"])(.+?)\2\)", str(exc))
    if match is None:
        return ""
    inner = match[3] if len(match[3]) <= _MAX_MESSAGE else match[3][:_MAX_MESSAGE] + "…"
    return f" ({match[1]}: {inner})"


def _non_finite_error(exc: BaseException) -> NonFiniteError | None:
    return exc if isinstance(exc, NonFiniteError) else None


def _from_non_finite_attributes(exc: NonFiniteError) -> Explanation:
    """A NonFiniteError raised in backward: the module is known, its inputs are not on the stack."""
    where = repr(exc.module) if exc.module else "the model itself"
    what = f"parameter {exc.index!r}" if exc.io == "param_grad" else f"the output{exc.index}"
    return Explanation(
        module=exc.module, module_type=exc.module_type, chain=[(exc.module, exc.module_type)],
        inputs=[], params=[], exception=_headline(exc),
        hint=(f"The gradient of {what} of {where} ({exc.module_type}) held "
              f"{counts(exc.nan, exc.inf)} in backward at step {exc.step}: it was produced by "
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
    """The rank to name in an explanation: only in a job of several processes."""
    rank, world = place()
    return rank if world > 1 else None
