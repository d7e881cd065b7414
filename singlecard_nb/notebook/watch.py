"""`%singlecard watch on|off`: after each cell, one line with that cell's peak and net memory.

On a GPU the figures come from PyTorch's CUDA caching allocator (what tensors hold, not what
the allocator has reserved), read only when torch has already started CUDA itself: a watched
cell must never be the one that starts the driver. The allocator's peak counters
(`torch.cuda.max_memory_allocated`, `memory_stats()["allocated_bytes.all.peak"]`) belong to the
user and are never reset: a cell that sets a new high has its exact peak there; a cell that
stays below an earlier high gets the highest value a background thread sampled, labelled as
sampled (a lower bound), and the first such report says why. On the CPU the figure is the process's
resident set size (RSS). Linux keeps the peak RSS in `VmHWM`, which can be reset per cell by
writing `5` to `/proc/self/clear_refs`; where that is refused the peak is sampled by a
background thread and labelled as sampled (a lower bound), never passed off as exact.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from IPython.display import display

from .. import borrow
from ..capacity import size_text

_PROC_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_SAMPLE_INTERVAL_S = 0.005

# id(shell) -> the watcher registered on it
_watchers: dict[int, _Watcher] = {}


def start(shell: Any) -> None:
    """Report peak and net memory after every cell run in `shell` (idempotent)."""
    if id(shell) in _watchers:
        return
    watcher = _Watcher(shell)
    watcher.register()
    _watchers[id(shell)] = watcher


def stop(shell: Any) -> None:
    """Stop the per-cell reports in `shell` (harmless when not watching)."""
    watcher = _watchers.pop(id(shell), None)
    if watcher is not None:
        watcher.owner.restore()


def is_watching(shell: Any) -> bool:
    """Whether `start(shell)` is in effect."""
    return id(shell) in _watchers


# --- figures -------------------------------------------------------------------------------


def _fmt_delta(n: float) -> str:
    return ("+" if n >= 0 else "-") + size_text(abs(n))


@dataclass(frozen=True)
class CellMemory:
    """Memory used by one cell on one device; renders as one line.

    `peak_exact` is False when the peak was sampled (then it is a lower bound).
    """

    device: str  # "cuda:0" or "cpu"
    kind: str  # "CUDA allocated" or "RSS"
    peak: int
    net: int
    now: int
    peak_exact: bool
    seconds: float
    note: str = ""

    def __repr__(self) -> str:
        peak = size_text(self.peak) if self.peak_exact else f"≥{size_text(self.peak)} (sampled)"
        text = (f"[singlecard watch] {self.device} {self.kind}: peak {peak}, "
                f"net {_fmt_delta(self.net)}, now {size_text(self.now)} · {self.seconds:.2f} s")
        return text + (f" · {self.note}" if self.note else "")

    def _repr_html_(self) -> str:
        import html

        from .. import theme

        return (f'<div class="{theme.NO_MATH_CLASSES}" style="font-family:monospace;'
                f'font-size:11px;color:{theme.MUTED}">{theme.no_math(html.escape(repr(self)))}</div>')


def _read_status_kib(field: str) -> int | None:
    try:
        with open(_PROC_STATUS) as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux ≥ 4.0); False if refused.

    Side effect, stated once here: `VmHWM` and `getrusage().ru_maxrss` then mean "since the
    start of this cell" for the rest of the process's life, which is what a watched notebook
    wants and cannot be undone.
    """
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Sampler:
    """Samples `read()` (the RSS, or CUDA memory allocated) in a daemon thread until stopped;
    the max is a lower bound of the peak."""

    def __init__(self, read: Callable[[], int | None], interval: float = _SAMPLE_INTERVAL_S):
        self._read = read
        self._interval = interval
        self._stop = threading.Event()
        self.peak = read() or 0
        self._thread = threading.Thread(target=self._run, name="singlecard-watch-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            value = self._read()
            if value is not None and value > self.peak:
                self.peak = value

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _torch_cuda_started() -> bool:
    # torch.cuda.is_initialized() never starts CUDA, and True implies the driver is running;
    # torch not imported at all means no CUDA memory can be held by it.
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _pinned_device() -> Any:
    """The pinned torch.device, or None when nothing is pinned."""
    from .. import session

    state = session.current()
    return None if state is None else state.torch_device


# --- the watcher ---------------------------------------------------------------------------


class _Watcher:
    """Holds one shell's pre/post_run_cell callbacks and the snapshot taken before a cell."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.owner = borrow.Borrowed("%singlecard watch")
        self._before: dict[str, Any] | None = None
        self._sampler: _Sampler | None = None
        self._said_sampled = False  # the first sampled CUDA peak says why it is sampled

    def register(self) -> None:
        events = self.shell.events
        # Keep the bound methods: EventManager.unregister needs the very same objects.
        pre, post = self._pre_run_cell, self._post_run_cell
        events.register("pre_run_cell", pre)
        self.owner.on_restore(lambda: events.unregister("pre_run_cell", pre), "pre_run_cell: watch")
        events.register("post_run_cell", post)
        self.owner.on_restore(lambda: events.unregister("post_run_cell", post),
                              "post_run_cell: watch")
        self.owner.on_restore(self._stop_sampler, "watch sampler thread")
        # restore_all() on unload must also forget this shell, or `watch on` would be a no-op later
        self.owner.on_restore(lambda: _watchers.pop(id(self.shell), None), "watch registry")

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    def _cuda_device(self) -> Any:
        """The CUDA device to report on, or None to report the CPU RSS."""
        device = _pinned_device()
        if device is not None and device.type != "cuda":
            return None
        if not _torch_cuda_started():
            return None
        import torch

        return device if device is not None else torch.device("cuda", torch.cuda.current_device())

    def _pre_run_cell(self, info: Any = None) -> None:
        self._stop_sampler()
        before: dict[str, Any] = {"t": time.perf_counter(), "cuda_started": _torch_cuda_started()}
        device = self._cuda_device()
        if device is not None:
            import torch

            # The peak counters are the user's: read, never reset (see the module docstring).
            before["cuda"] = (device, torch.cuda.memory_allocated(device),
                              torch.cuda.max_memory_allocated(device))
            self._sampler = _Sampler(lambda: torch.cuda.memory_allocated(device))
        before["rss"] = _read_status_kib("VmRSS")
        before["hwm_reset"] = _reset_rss_peak()
        if device is None and not before["hwm_reset"] and before["rss"] is not None:
            self._sampler = _Sampler(lambda: _read_status_kib("VmRSS"))
        self._before = before

    def _post_run_cell(self, result: Any = None) -> None:
        before, self._before = self._before, None
        if before is None:  # the cell that ran `watch on` had no snapshot
            return
        report = self.measure(before)
        if report is not None:
            display(report)

    def measure(self, before: dict[str, Any]) -> CellMemory | None:
        seconds = time.perf_counter() - before["t"]
        sampled_peak = self._sampler.stop() if self._sampler is not None else None
        self._sampler = None
        device = self._cuda_device()
        if device is not None:
            import torch

            # Started during this cell: the allocator's peak counts from its start, inside the cell.
            _, start, high_before = before.get("cuda", (device, 0, 0))
            now = torch.cuda.memory_allocated(device)
            high = torch.cuda.max_memory_allocated(device)
            notes = [] if before["cuda_started"] else ["CUDA started in this cell"]
            if high > high_before:  # a new high, so reached in this cell: exact
                peak, exact = high, True
            else:
                peak, exact = max(sampled_peak or 0, start, now), False
                if high < high_before:  # the cell reset the counters: `high` is since then
                    peak = max(peak, high)
                if not self._said_sampled:
                    self._said_sampled = True
                    notes.append("this cell stayed below an earlier peak, so its peak is "
                                 "sampled; torch's peak counters are left as they are (yours)")
            return CellMemory(str(device), "CUDA allocated", peak, now - start, now, exact,
                              seconds, "; ".join(notes))
        rss_before, rss_now = before["rss"], _read_status_kib("VmRSS")
        if rss_before is None or rss_now is None:
            return None  # no /proc (not Linux): nothing honest to say
        note = ""
        pinned = _pinned_device()
        if pinned is not None and pinned.type == "cuda":
            note = f"{pinned} pinned but CUDA not started: host memory shown"
        if before["hwm_reset"]:
            peak = _read_status_kib("VmHWM") or rss_now
            exact = True
        else:
            peak = max(sampled_peak or 0, rss_now, rss_before)
            exact = False
        return CellMemory("cpu", "RSS", peak, rss_now - rss_before, rss_now, exact, seconds, note)
