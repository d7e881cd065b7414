"""Exceptions more than one wing speaks of (ground floor: imports nothing of ours).

The trap in `inspection/` raises `NonFiniteError`; the explanations in the explain wing read it.
Neither wing imports the other: both import this module.
"""

from __future__ import annotations


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
