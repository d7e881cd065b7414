"""Statistics: the reductions a step's tensors get (`stats`; what can be read, `readable`; a
tensor's RAW row by torch and RAW rows to VALUES, `reductions`), the one-read C kernel loaded
from its cache or built in the background (`native`, from `onepass.c`) with its compilation
beside it (`build`). Imports nothing else of inspection.

The room's face: other rooms import these names from here, never its files.
"""

from .readable import contiguous_in_place, plain, reducible
from .reductions import VALUES
from .stats import StepStats, finish_rows

__all__ = ["VALUES", "StepStats", "contiguous_in_place", "finish_rows", "plain", "reducible"]
