"""`%inspect` / `%%inspect`: placeholder until the inspection engine lands (owner: lead)."""

from __future__ import annotations

from IPython.core.magic import Magics, magics_class


@magics_class
class InspectMagics(Magics):
    pass
