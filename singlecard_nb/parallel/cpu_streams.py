"""`%singlecard cpu`: torch.cuda's events and streams where the GPU is the CPU (cuda_on_cpu.py).

`torch.cuda.Event(enable_timing=True)` records the CPU's clock, so `elapsed_time` times the work
between two records (CPU work is done when its call returns; `synchronize`, `wait`, `query`
have nothing to wait for). Streams (`Stream`, `current_stream`, `default_stream`, `with
torch.cuda.stream(s)`, `wait_stream`, `record_event`) run in order on the CPU: nothing to wait
for either. Each is said once.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..notices import Notices


class CpuEvent:
    """torch.cuda.Event where the GPU is the CPU: CPU work has finished when its call returns,
    so recording an event reads the clock and waiting for one returns at once."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self._recorded_at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._recorded_at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def elapsed_time(self, end_event: CpuEvent) -> float:
        """Milliseconds from this event's record to `end_event`'s, as CUDA's."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_at - self._recorded_at) * 1e3

    def __repr__(self) -> str:
        return f"<torch.cuda.Event on the CPU (%singlecard cpu), timing={self.enable_timing}>"


class CpuStream:
    """torch.cuda.Stream where the GPU is the CPU: CPU operations run in order and are done
    when they return, so a stream has nothing to wait for."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = CpuEvent() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return "<torch.cuda.Stream on the CPU (%singlecard cpu)>"


def install(owner: Borrowed, notices: Notices) -> None:
    """torch.cuda's events and streams answered by the CPU, owned by `owner`."""
    default = CpuStream()

    def announcing(cls: type, kind: str, note: str) -> type:
        """`cls` as user code sees it: the notice comes with the first object made."""
        class Announcing(cls):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                notices.say(kind, note)
                super().__init__(*args, **kwargs)

        Announcing.__name__ = Announcing.__qualname__ = cls.__name__.replace("Cpu", "")
        return Announcing

    owner.set_attr(torch.cuda, "Event", announcing(CpuEvent, "events", _EVENTS_NOTE),
                   "torch.cuda.Event")
    owner.set_attr(torch.cuda, "Stream", announcing(CpuStream, "streams", _STREAMS_NOTE),
                   "torch.cuda streams")

    def current_stream(device: Any = None) -> CpuStream:
        notices.say("streams", _STREAMS_NOTE)
        return default

    def stream(stream: Any) -> contextlib.AbstractContextManager:
        notices.say("streams", _STREAMS_NOTE)
        return contextlib.nullcontext(stream)

    def set_stream(stream: Any) -> None:
        notices.say("streams", _STREAMS_NOTE)

    for name, fn in (("current_stream", current_stream), ("default_stream", current_stream),
                     ("stream", stream), ("set_stream", set_stream)):
        original = getattr(torch.cuda, name, None)
        if original is not None:  # an older torch may lack one
            owner.set_attr(torch.cuda, name, wrap_like(original, fn), f"torch.cuda.{name}")


_EVENTS_NOTE = ("singlecard_nb: torch.cuda.Event under `%singlecard cpu` records the CPU's clock: "
                "elapsed_time() times the CPU work between two records, and waiting returns at "
                "once (CPU work has finished when its call returns).")
_STREAMS_NOTE = ("singlecard_nb: torch.cuda streams under `%singlecard cpu` are the CPU's one "
                 "stream: operations run in order, and waiting or synchronising returns at once.")
