"""Said once per kind, then counted: the one way singlecard_nb tells the user something.

A device reference remapped, a CUDA call answered by the CPU, a module inspection cannot
record, a kernel that could not be built: each kind is warned about the first time it happens
(a warning pointing at the user's line) and then only counted, so `%singlecard status` and
`insp.notes` can say what happened and how often, without a wall of warnings. A warning is
never raised into the user's code, also where warnings are turned into errors: many notices are
said from inside a forward pass. Ground floor: imports nothing of ours.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

Message = Union[str, Callable[[], str]]  # a callable is only called the first time


@dataclass
class Notice:
    kind: str  # e.g. "to", "torch.load", "spawn"
    message: str  # what was said the first time
    count: int = 1


class Notices:
    """The notices of one owner: a single-card session, an inspector, the kernel build.

    suffix: added to each warning (e.g. where the count can be read); category: the warning's.
    """

    def __init__(self, suffix: str = "", category: type[Warning] = UserWarning) -> None:
        self._by_kind: dict[str, Notice] = {}
        self._suffix = f" [{suffix}]" if suffix else ""
        self._category = category
        self._lock = threading.Lock()  # DataLoader workers and autograd threads call in too

    def say(self, kind: str, message: Message, stacklevel: int = 2) -> bool:
        """Count `kind`; the first time, warn with `message` (a string, or a callable making it).
        Returns True when it was said now.

        stacklevel: as `warnings.warn(stacklevel=...)` would take it in the caller of `say`
        (2, the default: the line that called the caller).
        """
        with self._lock:
            notice = self._by_kind.get(kind)
            if notice is not None:
                notice.count += 1
                return False
            text = message if isinstance(message, str) else message()
            self._by_kind[kind] = Notice(kind, text)
        try:
            warnings.warn(f"{text}{self._suffix}", self._category, stacklevel=stacklevel + 1)
        except Warning:  # warnings turned into errors: a notice never breaks the user's code
            pass
        return True

    def said(self, kind: str) -> bool:
        return kind in self._by_kind

    def messages(self) -> list[str]:
        """What was said, in the order it first happened."""
        with self._lock:
            return [n.message for n in self._by_kind.values()]

    def summary(self) -> list[str]:
        """One line per kind, in the order they first happened: the message and how often."""
        with self._lock:
            notices = list(self._by_kind.values())
        return [f"{n.message.removeprefix('singlecard_nb: ')} (×{n.count})" for n in notices]
