"""What single-card mode did to the user's calls: said once per kind, counted for status.

A device reference remapped, a CUDA call answered by the CPU, a spawn run in this process: each
kind is warned about the first time it happens (a `UserWarning` pointing at the user's line) and
then only counted, so `%singlecard status` can say how often, without a wall of warnings.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

Message = Union[str, Callable[[], str]]  # a callable is only called the first time
_ONCE = "said once; `%singlecard status` counts each time"


@dataclass
class Notice:
    kind: str  # e.g. "to", "torch.load", "spawn"
    message: str  # what was said the first time
    count: int = 1


class Notices:
    """The notices of one single-card session (reset each time single-card mode is turned on)."""

    def __init__(self) -> None:
        self._by_kind: dict[str, Notice] = {}
        self._lock = threading.Lock()  # DataLoader workers and autograd threads call in too

    def say(self, kind: str, message: Message, stacklevel: int = 2) -> None:
        """Count `kind`; the first time, warn with `message` (a string, or a callable making it).

        stacklevel: as `warnings.warn(stacklevel=...)` would take it in the caller of `say`
        (2, the default: the line that called the caller).
        """
        with self._lock:
            notice = self._by_kind.get(kind)
            if notice is not None:
                notice.count += 1
                return
            text = message if isinstance(message, str) else message()
            self._by_kind[kind] = Notice(kind, text)
        warnings.warn(f"{text} [{_ONCE}]", UserWarning, stacklevel=stacklevel + 1)

    def said(self, kind: str) -> bool:
        return kind in self._by_kind

    def summary(self) -> list[str]:
        """One line per kind, in the order they first happened: the message and how often."""
        with self._lock:
            notices = list(self._by_kind.values())
        return [f"{n.message.removeprefix('singlecard_nb: ')} (×{n.count})" for n in notices]
