"""`%singlecard cpu`: torch.cuda's memory counters where the GPU is the CPU (cuda_on_cpu.py).

Counters read 0 / `{}` (CUDA's allocator holds nothing) and resets do nothing, instead of
failing; said once, pointing to `%singlecard watch` for the process memory. `memory_summary()`
says the same in words; `mem_get_info()` reports the host's available and total memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..borrow import Borrowed
from ..notices import Notices
from .cuda_patch import patch_cuda

ZERO_COUNTERS = ("memory_allocated", "max_memory_allocated", "memory_reserved",
                  "max_memory_reserved", "memory_cached", "max_memory_cached")
RESETS = ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats")
_MEMORY_NOTE = ("singlecard_nb: torch.cuda.{}() under `%singlecard cpu`: CUDA's allocator holds "
                "nothing here, so its counters read 0 and resets do nothing; "
                "`%singlecard watch on` shows this process's memory after each cell.")


def install(owner: Borrowed, notices: Notices) -> None:
    """The memory counters, their resets, `memory_summary` and `mem_get_info`, owned by `owner`."""
    for name in ZERO_COUNTERS:
        patch_cuda(owner, name, lambda original, name=name: _counter(name, 0, notices))
    patch_cuda(owner, "memory_stats", lambda original: _counter("memory_stats", {}, notices, dict))
    for name in RESETS:
        patch_cuda(owner, name, lambda original, name=name: _counter(name, None, notices))
    patch_cuda(owner, "memory_summary", lambda original: _summary(notices))
    patch_cuda(owner, "mem_get_info", lambda original: _mem_get_info(notices))


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
