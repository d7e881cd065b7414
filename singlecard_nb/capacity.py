"""What memory there is and who holds it (ground floor: imports nothing of ours).

Two facts that several wings speak of without importing each other: the pinned card's capacity
(`session` provides it: the pin knows the card, described machines included) and the per-module
memory tables that inspectors with `memory=True` keep (`MEMORY_TABLES`, read by diagnosis's
out-of-memory rule).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Card:
    """The memory of the device a step runs on. total/free: bytes, None when unknown."""

    label: str  # "GPU 0 (NVIDIA A100-SXM4-80GB)", "cpu"
    device: str  # "cuda:0", "cpu"
    total: int | None
    free: int | None
    source: str  # "nvml", "described: <path>", "torch", "/proc/meminfo"


_provider: Callable[[], Card | None] | None = None


def provide(provider: Callable[[], Card | None] | None) -> None:
    """Set what `pinned_card()` asks (session does, when it is imported)."""
    global _provider
    _provider = provider


def pinned_card() -> Card | None:
    """The pinned card as the session describes it; None when nothing is pinned."""
    return _provider() if _provider is not None else None


def host_card() -> Card:
    """The CPU's memory: MemAvailable of /proc/meminfo (None where it cannot be read)."""
    total = free = None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    source = "/proc/meminfo"
    limit = _data_limit()
    if limit is not None:  # a limit set on this process (ulimit -d, resource.setrlimit)
        soft, used = limit
        total = soft if total is None else min(total, soft)
        free = max(soft - used, 0) if free is None else min(free, max(soft - used, 0))
        source = "RLIMIT_DATA"
    return Card("cpu", "cpu", total, free, source)


def _data_limit() -> tuple[int, int] | None:
    """(RLIMIT_DATA soft limit, VmData used) where a data-segment limit is set, else None."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData"))
        return soft, used
    except (ImportError, OSError, ValueError, StopIteration):
        return None


class MemoryTables:
    """What each module of a model holds, by model: published by an inspector with
    memory=True (inspection/memory/table.py) while it runs, read by the out-of-memory
    explanation (diagnosis/rules/memory.py). Models are held weakly."""

    def __init__(self) -> None:
        # model -> a callable giving its inspector's table (module path -> {kind: bytes})
        self._tables: weakref.WeakKeyDictionary[Any, Callable[[], dict]] = (
            weakref.WeakKeyDictionary())

    def publish(self, model: Any, table: Callable[[], dict]) -> None:
        try:
            self._tables[model] = table
        except TypeError:  # not weak-referenceable: nothing to publish
            pass

    def withdraw(self, model: Any, table: Callable[[], dict]) -> None:
        if model is not None and self._tables.get(model) is table:
            del self._tables[model]

    def of(self, model: Any) -> dict | None:
        """The table published for `model` (None: no inspector with memory=True runs on it)."""
        table = self._tables.get(model)
        return table() if table is not None else None


MEMORY_TABLES = MemoryTables()


def size_text(n: float | None) -> str:
    """Bytes as a person reads them: "1.5 GiB", "320.0 MiB"."""
    if n is None or n != n:
        return "?"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"
