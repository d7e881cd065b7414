"""`%singlecard cpu`: the CUDA calls of CUDA-minded scripts answered by a one-GPU machine whose
GPU happens to be the CPU.

Each decision, and why (also in the README, "Multi-GPU code on one card"):

- `torch.cuda.synchronize()`: returns at once. CPU operations have finished when they return,
  so there is nothing to wait for; that is what synchronize promises.
- `torch.cuda.manual_seed(n)` / `manual_seed_all(n)`: seed the CPU generator, which is the one
  that draws the numbers for tensors the script meant for the GPU. (torch's own calls of these,
  from `torch.manual_seed`, are left as they are: torch seeds the CPU itself.)
- memory counters (`memory_allocated`, `max_memory_allocated`, `memory_reserved`, ...,
  `memory_stats`, `reset_peak_memory_stats`, ...): report 0 / `{}` (CUDA's allocator holds
  nothing) and resets do nothing, instead of failing; said once, pointing to
  `%singlecard watch` for the process memory. `memory_summary()` says the same in words.
  `mem_get_info()` reports the host's available and total memory (the device is the host).
- `torch.autocast("cuda", dtype)` and `torch.cuda.amp.autocast`: autocast on the CPU with the
  same dtype (float16 when none is given, as on a GPU), instead of torch's "CUDA is not
  available, disabling".
- `torch.amp.GradScaler("cuda")` and `torch.cuda.amp.GradScaler`: a CPU GradScaler that really
  scales, instead of a disabled one.
- Not changed: `torch.cuda.empty_cache()` (already does nothing while CUDA is not started),
  `torch.backends.cudnn` flags (accepted; there is no cuDNN on the CPU), and
  `torch.cuda.is_available()` / `device_count()`, which keep saying False / 0 so that libraries
  (Lightning, Hugging Face, accelerate) take their CPU paths; scripts that derive a world size
  from `device_count()` get one from `mp.spawn` (spawn.py) and `init_process_group` (a world of
  one), with a notice.

Every answer is said once per kind and counted in `%singlecard status`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..borrow import Borrowed
from .notices import Notices

_ZERO_COUNTERS = ("memory_allocated", "max_memory_allocated", "memory_reserved",
                  "max_memory_reserved", "memory_cached", "max_memory_cached")
_RESETS = ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats")
_MEMORY_NOTE = ("singlecard_nb: torch.cuda.{}() under `%singlecard cpu`: CUDA's allocator holds "
                "nothing here, so its counters read 0 and resets do nothing; "
                "`%singlecard watch on` shows this process's memory after each cell.")


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """Answer CUDA-minded calls for `device` (the CPU), owned by `owner`."""
    _patch(owner, "synchronize", lambda original: _synchronize(notices))
    for name in ("manual_seed", "manual_seed_all"):
        _patch(owner, name, lambda original, name=name: _seed(original, name, notices))
    for name in _ZERO_COUNTERS:
        _patch(owner, name, lambda original, name=name: _counter(name, 0, notices))
    _patch(owner, "memory_stats", lambda original: _counter("memory_stats", {}, notices, dict))
    for name in _RESETS:
        _patch(owner, name, lambda original, name=name: _counter(name, None, notices))
    _patch(owner, "memory_summary", lambda original: _summary(notices))
    _patch(owner, "mem_get_info", lambda original: _mem_get_info(notices))
    _patch_autocast(owner, device, notices)
    _patch_grad_scaler(owner, device, notices)


def _patch(owner: Borrowed, name: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(torch.cuda, name, None)
    if original is None:  # an older torch without this call
        return
    label = ("torch.cuda memory counters" if name.startswith(("memory", "max_memory", "reset"))
             else f"torch.cuda.{name}")
    owner.set_attr(torch.cuda, name, functools.update_wrapper(make(original), original), label)


def _synchronize(notices: Notices) -> Callable:
    def synchronize(device: Any = None) -> None:
        notices.say("synchronize", "singlecard_nb: torch.cuda.synchronize() under `%singlecard "
                    "cpu` returns at once: CPU operations have finished when they return.")

    return synchronize


def _seed(original: Callable, name: str, notices: Notices) -> Callable:
    def seed(seed: int) -> None:
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
            return original(seed)  # torch.manual_seed seeds the CPU generator itself
        notices.say("manual_seed", lambda: (
            f"singlecard_nb: torch.cuda.{name}({seed!r}) under `%singlecard cpu` seeds the CPU "
            "generator, which draws the numbers for the tensors meant for the GPU."))
        torch.default_generator.manual_seed(int(seed))

    return seed


def _counter(name: str, value: Any, notices: Notices, make: Callable | None = None) -> Callable:
    def counter(*args: Any, **kwargs: Any) -> Any:
        notices.say("memory", _MEMORY_NOTE.format(name))
        return make() if make is not None else value

    return counter


def _summary(notices: Notices) -> Callable:
    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        notices.say("memory", _MEMORY_NOTE.format("memory_summary"))
        return ("singlecard_nb: no CUDA memory to summarise: `%singlecard cpu` runs this code on "
                "the CPU (`%singlecard watch on` shows the process memory).")

    return memory_summary


def _mem_get_info(notices: Notices) -> Callable:
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        notices.say("mem_get_info", "singlecard_nb: torch.cuda.mem_get_info() under `%singlecard "
                    "cpu` reports the host's available and total memory: the device is the host.")
        return _host_memory()

    return mem_get_info


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        kib = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if k in
               ("MemAvailable", "MemTotal")}
        return kib["MemAvailable"], kib["MemTotal"]
    except (OSError, KeyError, ValueError):  # not Linux: total only, from sysconf
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total


def _patch_autocast(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            dtype = torch.float16 if dtype is None else dtype  # CUDA's default autocast dtype
            notices.say("autocast", lambda: (
                f"singlecard_nb: torch.autocast('cuda', {dtype}) under `%singlecard cpu` runs "
                f"as torch.autocast('{device.type}', {dtype})."))
            device_type = device.type
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    owner.set_attr(cls, "__init__", functools.update_wrapper(__init__, original),
                   "torch.autocast")


def _patch_grad_scaler(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.GradScaler
    original = cls.__init__

    pinned = device

    def __init__(self, device: str = "cuda", *args, **kwargs):
        if device == "cuda":
            notices.say("GradScaler", lambda: (
                "singlecard_nb: torch.amp.GradScaler('cuda') under `%singlecard cpu` scales on "
                f"the {pinned.type} (GradScaler('{pinned.type}'))."))
            device = pinned.type
        original(self, device, *args, **kwargs)

    owner.set_attr(cls, "__init__", functools.update_wrapper(__init__, original),
                   "torch.amp.GradScaler")
