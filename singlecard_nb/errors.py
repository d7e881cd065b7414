"""Exceptions more than one wing speaks of (ground floor: imports nothing of ours).

The trap in `inspection/` raises `NonFiniteError`; the explanations in the explain wing read it.
Neither wing imports the other: both import this module.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


class NonFiniteError(RuntimeError):
    """The first module output or gradient with NaN or Inf, raised by `inspect(..., trap=True)`.

    Attributes: module (path), module_type, io, index, step, call, nan, inf, inputs_finite
    (True when the module's tensor inputs were all finite), dtype, shape and device (of the
    tensor that held them), bad_params (its own parameters that were already non-finite),
    cause (words on the first parameter that went wrong, when the inspector saw it) and prior
    (the ranking's likeliest cause begun by this step: a param group's lr, an input, a
    growth; the explanation says it first).
    """

    def __init__(self, module: str, module_type: str, io: str, index: str, step: int,
                 call: int, nan: int, inf: int, inputs_finite: bool | None, *,
                 dtype: str | None = None, bad_params: list[str] | None = None,
                 cause: str | None = None, shape: tuple | None = None,
                 device: str | None = None, prior: str | None = None,
                 loss_ops: list[str] | None = None):
        self.module, self.module_type, self.io, self.index = module, module_type, io, index
        self.step, self.call, self.nan, self.inf = step, call, nan, inf
        self.inputs_finite, self.dtype = inputs_finite, dtype
        self.shape, self.device = shape, device
        self.bad_params, self.cause = list(bad_params or ()), cause
        self.prior = prior  # the ranking's likeliest cause begun by this step, in words
        # the last autograd operations of the step's loss (a gradient's trap: what ran after)
        self.loss_ops = list(loss_ops or ())
        where = repr(module) if module else "the model itself ('')"
        # "output", "input[0]", "grad[1]"; a parameter's name apart: "param 'weight'"
        what = f"{io}{index}" if not index or index.startswith("[") else f"{io} {index!r}"
        if io == "param":  # params=True: caught right after the optimiser step
            origin = (" The optimiser step made it non-finite (its update: gradient × learning "
                      "rate)" + (f"; {cause}." if cause else "."))
        elif self.bad_params:  # said first: finite inputs do not make this module the origin
            names = ", ".join(repr(p) for p in self.bad_params)
            origin = (f" Its own parameter{'s' * (len(self.bad_params) > 1)} {names} already "
                      "held NaN/Inf: they were corrupted by an earlier optimiser step"
                      + (f"; {cause}." if cause else "."))
        else:
            origin = {True: " Its inputs were finite, so this module produced them.",
                      False: " Its inputs already held NaN/Inf.", None: ""}[inputs_finite]
            if inputs_finite and dtype in ("float16", "bfloat16") and inf:
                origin += f" It computes in {dtype}: a {dtype} overflow."
        if io == "loss":  # what loss.backward() was called on: no module computed it
            ops = cause.split(" ← ") if cause else []
            last = f" Its last operations: {cause}: {loss_hint(ops)}." if cause else ""
            first = f" Likeliest cause, begun before it: {prior}." if prior else ""
            super().__init__(f"{nan} NaN and {inf} Inf in the loss (what loss.backward() was "
                             f"called on) at step {step}.{last}{first} {TRAP_ROWS.hint}")
            return
        super().__init__(
            f"{nan} NaN and {inf} Inf in {what} of {where} ({module_type}) at step {step}, "
            f"call {call}.{origin} {TRAP_ROWS.hint}"
        )


def loss_hint(ops: list[str]) -> str:
    """What made a loss non-finite, from its last autograd operations (loss first): an
    operation is named only when it ran."""
    first = ops[:6]
    if any(op.startswith("Log") and op != "LogSoftmax" for op in first):
        return ("a log of 0 (or of a negative number) in the loss: clamp what goes into the log "
                "(p.clamp_min(1e-12)) or compute the loss from logits (F.cross_entropy, "
                "F.binary_cross_entropy_with_logits, log_softmax)")
    if any(op.startswith(("Sqrt", "Pow")) for op in first):
        return ("a sqrt or power in the loss: of 0 or a negative number, or of values so large "
                "the result overflowed")
    if any(op.startswith("Div") for op in first):
        return "a division by ~0 in the loss"
    return "the values it was computed from were not finite, or overflowed in it"


class TrapRows:
    """Where the trap's message says the rows recorded so far are: `insp.frame()` in a
    notebook; the terminal form says its --save file while its script runs
    (`with TRAP_ROWS.saying(cli.at_exit.rows_hint(save)):` in cli/__init__.py)."""

    def __init__(self) -> None:
        self.hint = "Rows recorded so far are in insp.frame()."

    @contextlib.contextmanager
    def saying(self, hint: str) -> Iterator[None]:
        before, self.hint = self.hint, hint
        try:
            yield
        finally:
            self.hint = before


TRAP_ROWS = TrapRows()



class _TrapFrame:
    """The value of `__tracebackhide__` in the trap's own frames (the hooks a NonFiniteError is
    raised from): IPython's tracebacks and debugger hide such frames ("[... skipping hidden 3
    frame]"), so the user's code and torch's call of the module end the traceback. Under
    `%xmode verbose` (the mode for reading everything) they are shown; `%xmode --show` shows
    them in every mode. Read when the traceback is formatted; IPython is never imported here."""

    def __bool__(self) -> bool:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        return getattr(getattr(shell, "InteractiveTB", None), "mode", None) != "Verbose"

    def __repr__(self) -> str:
        return "singlecard_nb.errors.TRAP_FRAME"


TRAP_FRAME = _TrapFrame()


def without_our_frames(error: NonFiniteError) -> None:
    """Cut the package's frames off the traceback of `error`, caught in the hook torch called,
    which then re-raises it with a bare `raise` (that adds no frame of its own): the traceback
    ends at the user's frame and torch's call of the hook, also where python prints every frame
    (TRAP_FRAME hides them from IPython only). Under `%xmode verbose` every frame is kept. Only
    for our NonFiniteError: torch's exceptions pass untouched."""
    if TRAP_FRAME:
        error.__traceback__ = None
