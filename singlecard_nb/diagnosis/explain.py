"""Explain an exception raised inside a module's forward: which module, what it got, and why.

    try:
        model(x)
    except Exception as e:
        print(singlecard_nb.explain(e))   # or, in a notebook, singlecard_nb.explain()

Built from the exception's traceback alone (`traceback_calls`: the module calls on it hold the modules
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

from .. import theme
from ..errors import NonFiniteError, loss_hint
from ..job import place
from . import hints
from .compiled import traced_calls, traced_stack, traced_user_line
from .described import Described, describe, describe_row, input_leaves, values_text
from .failure import Failure, counts
from .traceback_calls import (
    Call,
    chain_of,
    child_name,
    join,
    module_calls,
    module_label,
    user_line,
    user_modules,
)

_MAX_ALIASES = 4
_MAX_MESSAGE = 400


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
    # index -> "x∈[-2.1, 3.4] nan!×3" of the inputs small enough to read at once
    values: dict[str, str] = dataclasses.field(default_factory=dict)
    # what the params line says when it lists none: the module's own are not on the stack (a
    # trap in backward), or it has none
    no_params: str = "none of its own"
    param_values: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> "nan!×4"

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
        rows.append(("inputs", "; ".join(describe_row(d, self.values.get(d[0]))
                                         for d in self.inputs) or none))
        rows.append(("params", "; ".join(describe_row(d, self.param_values.get(d[0]))
                                         for d in self.params) or self.no_params))
        if self.hint:
            rows.append(("hint", self.hint))
        return rows

    def _headline(self) -> str:
        rank = f"[rank {self.rank}] " if self.rank is not None else ""
        return f"{rank}singlecard_nb.explain: {self.label} failed"

    def banner(self) -> Banner:
        """The one line to show above the traceback."""
        return Banner(self._headline(), self.hint)

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
        return theme.no_math(  # a `$` in a message must not start MathJax
                f"<div class='singlecard-explain {theme.NO_MATH_CLASSES}' "
                "style='border-left:3px solid #d9534f;"
                "padding:2px 8px;margin:4px 0;font-size:12px'>"
                f"<div><b>{html.escape(self._headline())}</b></div>"
                f"<table style='border-collapse:collapse;margin:0'>{body}</table></div>")


@dataclasses.dataclass(frozen=True)
class Banner:
    """One line shown above the traceback of a failing cell, so the diagnosis is on screen when
    the cell fails; the full explanation follows the traceback."""

    headline: str  # "singlecard_nb.explain: Linear 'head.fc' failed"
    hint: str | None

    @property
    def text(self) -> str:
        said = f": {self.hint}" if self.hint else ""
        return f"{self.headline}{said} (details under the traceback)"

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        said = f": {html.escape(self.hint)}" if self.hint else ""
        return theme.no_math(
                f"<div class='singlecard-explain-banner {theme.NO_MATH_CLASSES}' "
                "style='border-left:3px solid #d9534f;"
                "padding:2px 8px;margin:2px 0;font-size:12px'>"
                f"<b>{html.escape(self.headline)}</b>{said} "
                "<span style='opacity:0.7'>(details under the traceback)</span></div>")


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
    explanation = None
    for candidate in chain_of(exc):
        calls = module_calls(candidate.__traceback__)  # live modules and arguments: local only
        if calls:
            explanation = _explain_calls(exc, candidate, calls)
            break
    else:
        if _non_finite_error(exc) is not None:  # the trap fired in backward: no forward frames
            explanation = _from_non_finite_attributes(exc)
    prior = getattr(_non_finite_error(exc), "prior", None)
    if explanation is not None and prior:  # a cause began before the trap: it comes first
        explanation = dataclasses.replace(explanation, hint=(
            f"Likeliest cause, begun before the trap: {prior}. What the trap saw: "
            f"{explanation.hint or explanation.exception}"))
    return explanation


# --- putting it together -------------------------------------------------------------------


# Wrappers whose `.module` is the model: paths are spelled as the inspector spells them, from
# the model, so "moe.router" and never DDP's "module.moe.router".
_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def _unwrapped(calls: list[Call]) -> list[Call]:
    while (len(calls) > 1 and type(calls[0].module).__name__ in _WRAPPERS
           and getattr(calls[0].module, "module", None) is calls[1].module):
        calls = calls[1:]
    return calls


def _explain_calls(exc: BaseException, raised: BaseException, calls: list[Call]) -> Explanation:
    wrapper = calls[0].module  # DataParallel & co. before unwrapping: the job's shape
    calls = _unwrapped(calls)
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
    leaves = input_leaves(innermost.args, innermost.kwargs)
    own = [*innermost.module.named_parameters(recurse=False),
           *innermost.module.named_buffers(recurse=False)]
    location, source = traced_user_line(stack) if stack else (None, None)
    if location is None:
        location, source = user_line(raised)
    hint = hints.diagnose(Failure(
        exception=raised, module=innermost.module, path=path, label=module_label(module_type, path),
        args=innermost.args, kwargs=innermost.kwargs, inputs=leaves, source=source,
        location=location, registered=registered, non_finite=_non_finite_error(exc),
        traced=bool(stack), root=root, root_inputs=input_leaves(calls[0].args, calls[0].kwargs),
        wrapper=wrapper if wrapper is not root else None,
        callers=[(p, c.module, c.args, c.kwargs) for p, c in zip(paths, calls)],
        neighbours=user_modules(raised)))
    # after a CUDA error the context may be gone, and out of memory reading values would
    # allocate: then shapes only
    cuda_broken = bool(re.search(r"CUDA error|device-side assert|CUBLAS_STATUS|cuDNN error|"
                                 r"out of memory", str(raised)))
    return Explanation(
        module=path, module_type=module_type,
        chain=[(p, type(c.module).__name__) for p, c in zip(paths, calls)],
        inputs=[describe(i, v) for i, v in leaves],
        values={i: text for i, v in leaves
                if not cuda_broken and (text := values_text(v)) is not None},
        params=[describe(n, t) for n, t in own],
        hint=hint, exception=_headline(exc) + (_traced_error(exc) if stack else ""),
        where=f"{location}: {source}" if location and source else location,
        aliases=aliases, rank=_rank(), traced=bool(traced),
    )


def _traced_error(exc: BaseException) -> str:
    """The error torch.compile's tracing met, from its message, as " (RuntimeError: ...)";
    "" when the message does not carry one. torch 2.7+ words it "... got RuntimeError('...')";
    torch 2.6 puts the bare message on the line after "Failed running call_function ...:"."""
    match = re.search(r"got (\w+(?:Error|Exception))\((['\"])(.+?)\2\)", str(exc))
    if match is not None:
        kind, inner = f"{match[1]}: ", match[3]
    elif (match := re.match(r"Failed running [^\n]*:\n([^\n]+)", str(exc))) is not None:
        kind, inner = "", match[1]
    else:
        return ""
    inner = inner if len(inner) <= _MAX_MESSAGE else inner[:_MAX_MESSAGE] + "…"
    return f" ({kind}{inner})"


def _non_finite_error(exc: BaseException) -> NonFiniteError | None:
    return exc if isinstance(exc, NonFiniteError) else None


# The rows the trap reads from one parameter (or buffer) of a module: the explanation lists it
_OF_A_PARAMETER = ("param", "param_grad", "step_grad", "update", "buffer")


def _from_non_finite_attributes(exc: NonFiniteError) -> Explanation:
    """A NonFiniteError raised in backward or after an optimiser step: the module is known, no
    call of it is on the stack; the parameter that trapped is listed."""
    where = repr(exc.module) if exc.module else "the model itself"
    cause = getattr(exc, "cause", None)
    params, values = [], {}
    if exc.io in _OF_A_PARAMETER and exc.index:
        params = [(exc.index, getattr(exc, "shape", None), exc.dtype or "?",
                   getattr(exc, "device", None) or "?")]
        values = {exc.index: "".join(f" {word}!" + (f"×{n}" if n > 1 else "") for word, n in
                                     (("nan", exc.nan), ("inf", exc.inf)) if n).strip()}
    unknown = "not on the stack: the trap fired in backward, where no call of the module runs"
    if exc.io == "loss":  # what loss.backward() was called on: computed outside any module
        ops = cause.split(" ← ") if cause else []
        return Explanation(
            module="", module_type="loss", chain=[], inputs=[], params=[],
            no_params="none: the loss is computed outside any module",
            exception=_headline(exc), rank=_rank(),
            hint=(f"The loss held {counts(exc.nan, exc.inf)} at step {exc.step}, when "
                  f"loss.backward() was called on it" + (f" (its last operations: {cause})"
                                                         if cause else "")
                  + f": {loss_hint(ops)}"))
    if exc.io in ("param", "update"):  # params=True: the optimiser step made it non-finite
        return Explanation(
            module=exc.module, module_type=exc.module_type,
            chain=[(exc.module, exc.module_type)], inputs=[], params=params,
            param_values=values, no_params=unknown.replace(
                "in backward, where no call of the module runs", "after the optimiser step"),
            exception=_headline(exc), rank=_rank(),
            hint=(f"The parameter {exc.index!r} of {where} ({exc.module_type}) held "
                  f"{counts(exc.nan, exc.inf)} after the optimiser step of step {exc.step}: its "
                  "update (gradient × learning rate) was non-finite or too large; lower this "
                  "parameter group's learning rate or clip gradients"
                  + (f"; {cause}" if cause else "")))
    what = (f"parameter {exc.index!r}" if exc.io in ("param_grad", "step_grad")
            else f"the output{exc.index}")
    return Explanation(
        module=exc.module, module_type=exc.module_type, chain=[(exc.module, exc.module_type)],
        inputs=[], params=params, param_values=values, no_params=unknown,
        exception=_headline(exc),
        hint=(f"The gradient of {what} of {where} ({exc.module_type}) held "
              f"{counts(exc.nan, exc.inf)} in backward at step {exc.step}: it was produced by "
              f"the backward of what comes after this module{_after(exc)}; a backward pass has "
              "no module inputs on the stack to show"),
        rank=_rank(),
    )


# operations whose backward can make NaN/Inf of finite values, as the words say them
_RISKY = {"Log": "a log", "Sqrt": "a sqrt", "Div": "a division", "Pow": "a power",
          "Norm": "a norm", "LinalgVectorNorm": "a norm", "Rsqrt": "an rsqrt", "Exp": "an exp"}


def _after(exc: NonFiniteError) -> str:
    """What ran after the module, said from the step's loss: only operations that ran."""
    ops = getattr(exc, "loss_ops", None) or []
    if not ops:
        return " (the next layers or the loss)"
    risky = list(dict.fromkeys(_RISKY[op] for op in ops if op in _RISKY))
    chain = " ← ".join(ops[:6])
    if risky:
        return (f" (the loss's last operations, {chain}, include {' and '.join(risky)}, whose "
                "backward is infinite at 0: check what goes into it)")
    return (f" (the loss's last operations, {chain}, hold no log, sqrt or division: a layer "
            "after this module made it, or values that had grown too large overflowed)")


def _headline(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _rank() -> int | None:
    """The rank to name in an explanation: only in a job of several processes."""
    rank, world = place()
    return rank if world > 1 else None
