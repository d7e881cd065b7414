"""What single-card mode turned into what (FSDP → the real FSDP1 on the CPU, mesh → a world
of one), counted, for `%singlecard status`."""

from __future__ import annotations

import threading


class Conversions:
    """`record("FullyShardedDataParallel(device_id=0)", "the real FSDP1 on cpu")`, counted."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, what: str, into: str) -> None:
        with self._lock:
            self._counts[(what, into)] = self._counts.get((what, into), 0) + 1

    def summary(self) -> list[str]:
        """"what → into (×n)", in the order they first happened."""
        with self._lock:
            return [f"{what} → {into} (×{n})" for (what, into), n in self._counts.items()]
