"""A model's step methods (`training_step`, `validation_step`, ...) while inspected: each call of
one is a step."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol


class _Calls(Protocol):  # what a step method asks of the CallTracker
    def open(self, kind: str) -> tuple[int, int] | None: ...

    def close(self, opened: tuple[int, int]) -> None: ...


class StepMethod:
    """A model's training_step (or validation_step...) while inspected: each call is a step.

    Set on the model instance (and removed by the inspector's owner). A copy of the model made
    meanwhile (deepcopy by an EMA or SWA callback, pickling) gets the plain method of the copy.
    """

    def __init__(self, calls: _Calls, method: Callable):
        self._calls = calls
        functools.update_wrapper(self, method)  # __wrapped__: Lightning's is_overridden, inspect

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opened = self._calls.open("method")
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            if opened is not None:
                self._calls.close(opened)

    def __reduce__(self):
        method = self.__wrapped__
        return getattr, (method.__self__, method.__name__)

    def __deepcopy__(self, memo: dict) -> Any:
        method = self.__wrapped__
        copied = memo.get(id(method.__self__), method.__self__)
        return getattr(type(copied), method.__name__).__get__(copied)
