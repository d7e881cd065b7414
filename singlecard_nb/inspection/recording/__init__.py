"""Recording: the hooks and patches on a model (`attach`, with `global_hook`, `optimizer_steps`,
`eagerly`), the open call and step (`calls`: what the stack says, the step methods'
wrapper), each call's tensors to rows (`recorder`, `structures`), the steps kept (`store`),
what a copy of an inspected module carries (`copies`), and torch.compile of an inspected model
(`compile_watch`).

The room's face: other rooms import these names from here, never its files.
"""

from .attach import STEP_METHODS, Attachment
from .calls import CallTracker, calls_on_stack, step_clock
from .compile_watch import compile_listeners
from .copies import Uncopied
from .recorder import Recorder
from .store import COLUMNS, DEFAULT_MAX_ROWS, StepRecord, Store, to_frame

__all__ = ["COLUMNS", "DEFAULT_MAX_ROWS", "STEP_METHODS", "Attachment", "CallTracker", "Recorder",
           "StepRecord", "Store", "Uncopied", "calls_on_stack", "compile_listeners", "step_clock",
           "to_frame"]
