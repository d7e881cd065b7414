"""What an inspector could not do: failures (`insp.errors`) and notes (`insp.notes`), each
warned about once, never raised into the user's forward."""

from __future__ import annotations

import sys

from ..frames import user_frame
from ..notices import Notices


def user_stacklevel() -> int:
    """The warnings stacklevel of the first caller outside singlecard_nb and torch (a warning
    from a hook then points at the user's line that ran the model)."""
    return 1 + user_frame(sys._getframe(1))[1]


class Diagnostics:
    """One inspector's failures and notes, shared by its parts."""

    def __init__(self) -> None:
        self.errors: list[str] = []  # failures inside the inspector, never raised to the user
        self.notes: list[str] = []  # what could not be recorded as asked, said once per kind
        self._notes = Notices()
        self._failures = Notices(category=RuntimeWarning)

    def say(self, kind: str, message: str) -> None:
        """Tell the user once per kind what cannot be recorded as asked (also in insp.notes)."""
        if self._notes.say(kind, f"singlecard_nb: {message}", stacklevel=user_stacklevel()):
            self.notes.append(message)

    def failed(self, error: Exception, path: str) -> None:
        """A recording step failed: listed in insp.errors, warned about the first time."""
        self.errors.append(f"{type(error).__name__} while inspecting {path!r}: {error}")
        del self.errors[:-100]
        self._failures.say("failed", lambda: (
            f"singlecard_nb: {type(error).__name__} while inspecting {path!r}: {error}. The "
            "forward pass goes on unchanged; that tensor is not recorded. Further failures "
            "are only listed in insp.errors."), stacklevel=user_stacklevel())
