"""Exceptions more than one wing speaks of (ground floor: imports nothing of ours).

The trap in `inspection/` raises `NonFiniteError`; the explanations in the explain wing read it.
Neither wing imports the other: both import this module.
"""

from __future__ import annotations

import sys


class NonFiniteError(RuntimeError):
    """The first module output or gradient with NaN or Inf, raised by `inspect(..., trap=True)`.

    Attributes: module (path), module_type, io, index, step, call, nan, inf, and inputs_finite
    (True when the module's tensor inputs were all finite: this module produced the NaN/Inf).
    """

    def __init__(self, module: str, module_type: str, io: str, index: str, step: int,
                 call: int, nan: int, inf: int, inputs_finite: bool | None):
        self.module, self.module_type, self.io, self.index = module, module_type, io, index
        self.step, self.call, self.nan, self.inf = step, call, nan, inf
        self.inputs_finite = inputs_finite
        where = repr(module) if module else "the model itself ('')"
        what = f"{io}{index}" if index else io
        origin = {True: " Its inputs were finite, so this module produced them.",
                  False: " Its inputs already held NaN/Inf.", None: ""}[inputs_finite]
        super().__init__(
            f"{nan} NaN and {inf} Inf in {what} of {where} ({module_type}) at step {step}, "
            f"call {call}.{origin} Rows recorded so far are in insp.frame()."
        )


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
