"""Memory the C library's heap holds free, given back to the system while inspection records.

glibc serves large allocations (torch's CPU tensors) from its heap once it has seen one freed
(it raises its mmap threshold up to 32 MiB). A loop of such tensors can then leave each freed
tensor's place split by a small allocation that lives on, and allocate the next tensor past
it: the heap grows by a tensor a step, all of it free but none of it given back. Seen here on
pytorch/examples' word_language_model, unchanged, under `--inspect`: its evaluation's 25.6 MB
outputs took the process from 0.5 GB to 24 GB and the kernel's OOM killer (at 2.2 GB: heap
1 985 MB, 166 MB of it in use; `malloc_trim(0)` brought the process back to 694 MB), in 2 of 4
runs. The small allocations were the step records' arrays, one per step (store.py's
`_Unfinished` now copies each step's rows into arrays it grows by doubling: 0 of 9 runs since).
This stays as the backstop for any other allocation that lives on: the heap's free memory is
read every `CHECK_EVERY` hand-offs and trimmed when `FREE_LIMIT` more is free than after the
last trim, and more is free than in use. Elsewhere than glibc, nothing is read."""

from __future__ import annotations

import ctypes
import threading

CHECK_EVERY = 8  # hand-offs (recorded steps) between two reads of the heap's free memory (~1 us)
FREE_LIMIT = 256 << 20  # free bytes the heap may hold before it is trimmed


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _glibc() -> ctypes.CDLL | None:
    """The C library where it has mallinfo2 and malloc_trim (glibc 2.33+), else None. Read from
    the symbols the process already has (Python links it): no search for the library file,
    which `ctypes.util.find_library` makes by running ldconfig or a compiler."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError, TypeError):  # TypeError: a platform loading no None
        return None
    return libc


class HeapTrim:
    """Counts hand-offs; every CHECK_EVERY of them, trims the heap if FREE_LIMIT more of it is
    free than after the last trim, and more of it free than in use."""

    def __init__(self) -> None:
        self._libc = _glibc()
        self._count = 0
        self._lock = threading.Lock()
        # free bytes when last trimmed: a trim gives pages back but the chunks stay free, so
        # the next trim waits until FREE_LIMIT more is free (each walks every free chunk)
        self._trimmed_at = 0
        self.trims = 0  # how often it trimmed (read by the tests)

    def step(self) -> None:
        if self._libc is None:
            return
        self._count += 1
        if self._count % CHECK_EVERY or not self._lock.acquire(blocking=False):
            return
        try:
            info = self._libc.mallinfo2()  # ~1 us
            free = info.fordblks
            self._trimmed_at = min(self._trimmed_at, free)  # reused since: counts again
            if free > self._trimmed_at + FREE_LIMIT and free > info.uordblks:
                self._libc.malloc_trim(0)
                self._trimmed_at = self._libc.mallinfo2().fordblks
                self.trims += 1
        finally:
            self._lock.release()


HEAP = HeapTrim()  # one for the process: every inspector's hand-offs count toward it
