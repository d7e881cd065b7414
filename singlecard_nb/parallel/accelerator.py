"""`torch.accelerator` answers as `torch.cuda` does under the pin.

Newer code asks `torch.accelerator` (`is_available`, `device_count`, `current_accelerator`,
`current_device_index`, `set_device_index`, `device_index`) instead of `torch.cuda`:

- under every pin, `set_device_index(rank)` and `device_index(rank)` select the pinned card, as
  `torch.cuda.set_device` does (remap/selection.py); under `cpu` there is no card to select,
  so nothing is;
- under `cpu`, the one-GPU machine whose GPU is the CPU: `is_available()` stays False and
  `device_count()` 0, exactly as `torch.cuda` says (libraries take their CPU paths), while
  `current_accelerator()` is `device("cpu")` and `current_device_index()` is 0, as
  `torch.cuda.current_device()` is, so `torch.device(f"{acc}:{rank}")` and `acc.type` name the
  CPU instead of failing on None. `current_stream()` is the CPU's one stream, `synchronize()`
  returns at once, memory counters read 0 (cuda_on_cpu.py says why).
  torch's own callers (`optimizer.step`, `device_count()` itself) get torch's answers: they
  decide on them whether to touch streams that the CPU does not have.
Said once per kind; counted in `%singlecard status`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from . import cpu_streams
from .cuda_on_cpu import under_cpu

_CPU_NOTE = ("singlecard_nb: torch.accelerator.{}() under `%singlecard cpu` is {}: this "
             "session's one device is the CPU (torch and the libraries are told "
             "is_available() False and device_count() 0, as torch.cuda says).")


def available() -> bool:
    """Whether this torch has `torch.accelerator` (2.6 and later)."""
    return hasattr(torch, "accelerator") and hasattr(torch.accelerator, "set_device_index")


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """Patch torch.accelerator for the pinned `device`, owned by `owner`."""
    if not available():
        return
    _patch_selection(owner, device, notices)
    if not under_cpu(device):
        return
    acc = torch.accelerator
    cpu = torch.device("cpu")
    _for_user(owner, "current_accelerator", lambda *a, **k: cpu, notices, "device('cpu')")
    for name in ("current_device_index", "current_device_idx"):
        _for_user(owner, name, lambda *a, **k: 0, notices, "0")
    stream = cpu_streams.CpuStream()
    _for_user(owner, "current_stream", lambda *a, **k: stream, notices,
              "the CPU's one stream (waiting returns at once)")
    _for_user(owner, "set_stream", lambda *a, **k: None, notices,
              "the CPU's one stream (waiting returns at once)")
    _for_user(owner, "synchronize", lambda *a, **k: None, notices,
              "done at once (CPU work has finished when its call returns)")
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats", "empty_cache"):
        if hasattr(acc, name):
            answer = None if name.startswith(("reset", "empty")) else 0
            _for_user(owner, name, lambda *a, answer=answer, **k: answer, notices,
                      "0 (CUDA's allocator holds nothing here; `%singlecard watch on` shows this "
                      "process's memory)" if answer == 0 else "a no-op")


def _for_user(owner: Borrowed, name: str, answer: Callable, notices: Notices, said: str) -> None:
    """torch.accelerator.`name` answering `answer()` to code outside torch."""
    original = getattr(torch.accelerator, name, None)
    if original is None:
        return

    def patched(*args: Any, **kwargs: Any) -> Any:
        if _from_torch(sys._getframe(1)):
            return original(*args, **kwargs)
        notices.say(f"accelerator.{name}", _CPU_NOTE.format(name, said))
        return answer(*args, **kwargs)

    owner.set_attr(torch.accelerator, name, wrap_like(original, patched),
                   "torch.accelerator (cpu answers)")


def _patch_selection(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    acc = torch.accelerator
    on_gpu = not under_cpu(device)

    def say(call: str, requested: Any) -> None:
        notices.say("accelerator.select", lambda: (
            f"singlecard_nb: torch.accelerator.{call}({requested!r}) selects {device}, this "
            "session's one device" + ("" if on_gpu else " (the CPU: nothing to select)")
            + ", and so will every device selection while single-card mode is on."), stacklevel=4)

    for name in ("set_device_index", "set_device_idx"):
        original = getattr(acc, name, None)
        if original is None:
            continue

        def select(requested: Any, /, _original=original, _name=name) -> None:
            if _index(requested) != (device.index if on_gpu else None):
                say(_name, requested)
            if on_gpu:
                _original(device.index)

        owner.set_attr(acc, name, wrap_like(original, select), "torch.accelerator.set_device_index")

    cls = getattr(acc, "device_index", None)  # the context manager came in torch 2.8
    if cls is None:
        return
    original_init = cls.__init__

    def __init__(self, requested: Any, /) -> None:
        original_init(self, requested)
        if requested is None:
            return
        if _index(requested) != (device.index if on_gpu else None):
            say("device_index", requested)
        self.idx = device.index if on_gpu else None  # None: torch's own "no switching"

    owner.set_attr(cls, "__init__", wrap_like(original_init, __init__),
                   "torch.accelerator.device_index")


def _index(requested: Any) -> Any:
    if isinstance(requested, (str, torch.device)):
        return torch.device(requested).index
    return requested


def _from_torch(frame: Any) -> bool:
    return frame is not None and frame.f_globals.get("__name__", "").startswith("torch.")
