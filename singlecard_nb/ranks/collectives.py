"""In each rank: the script's own torch.distributed calls, counted and placed as they are made.

The n-th collective of every rank must be the same call: when one rank logs a metric with an
`all_reduce` under `if rank == 0`, its n-th is that line and the others' n-th is the next
step's. gloo then waits for ever, or aborts on the mismatched sizes ("Is there a distributed
collective mismatch?"). Each rank keeps its last `KEPT` calls (their number, the call, the
user's own file:line, the first tensor's shape), sent with its status, so the doctor can name
both sides of the first call that differs. Only the script's calls through `torch.distributed`
are seen (DDP's gradient all_reduce is made in C++; the status's stack names it instead).
Recording one is a counter and a short walk up the stack: cheap beside any collective.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..borrow import Borrowed, wrap_like

KEPT = 16  # calls kept per rank (the first that differs is near the end when a job stops)
_CALLS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
          "all_gather_object", "gather", "gather_object", "scatter", "scatter_object_list",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
          "broadcast_object_list", "barrier", "monitored_barrier", "send", "recv", "isend",
          "irecv")
_WALK = 30  # frames looked through for the user's own


class CollectiveLog:
    """The last calls of this rank; `install()` patches torch.distributed's functions."""

    def __init__(self, is_user_file: Callable[[str], bool]):
        self.calls: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEPT)
        self.count = 0
        self._is_user_file = is_user_file

    def install(self, owner: Borrowed, names: Sequence[str] = _CALLS) -> None:
        import torch.distributed as dist

        for name in names:
            original = getattr(dist, name, None)
            if callable(original):
                owner.set_attr(dist, name, self._recording(original, name),
                               "torch.distributed calls counted (ranks)")

    def _recording(self, original: Any, name: str) -> Any:
        def collective(*args: Any, **kwargs: Any) -> Any:
            self._note(name, args[0] if args else None)
            return original(*args, **kwargs)

        return wrap_like(original, collective)

    def _note(self, name: str, first: Any) -> None:
        frame, where = sys._getframe(2), None
        for _ in range(_WALK):
            if frame is None:
                break
            if self._is_user_file(frame.f_code.co_filename):
                where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                break
            frame = frame.f_back
        shape = getattr(first, "shape", None)
        self.calls.append({"n": self.count, "call": name, "where": where,
                           "shape": list(shape) if shape is not None else None})
        self.count += 1

    def snapshot(self) -> list[dict[str, Any]]:
        """The calls kept, oldest first (read by the agent's thread: a copy)."""
        return list(self.calls)
