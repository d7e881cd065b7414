"""Our mark on each model found: an always-called forward hook that puts the finder back when
the model's call returns. A pickle (torch.save) of the model never holds it; a deep copy (EMA's
`copy.deepcopy`) does, and that is how a copy shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ...borrow import uninterrupted
from ..recording import Uncopied


class Marks:
    """The marks of one finder: `rearm(module, args, output)`, a bound method of the finder
    (which deep-copies as itself, so a copy's mark is still the finder's)."""

    def __init__(self, rearm: Callable[[Any, Any, Any], None],
                 copied: Callable[[nn.Module], dict | None] | None = None):
        self._rearm = rearm
        self._finder = rearm.__self__
        self._handles: list = []
        # our marks, left out of pickles; `copied(module)` at each pickle or deep copy, the
        # attributes it returns given to a pickle (copies.py)
        self._uncopied = Uncopied(copied)

    def add(self, module: nn.Module) -> None:
        """Put the finder back when `module`'s call returns (always called: also after an
        exception). The hook is ours on a module we know, so a copy of it shows as a copy."""
        if not self._carries_one(module):
            with uninterrupted():  # taken back by remove (the finder's owner runs it)
                handle = module.register_forward_hook(self._rearm, always_call=True)
                self._handles.append(handle)
            # a pickle (torch.save) of the model never holds it; a deep copy does: a copy
            self._uncopied.hook(module, handle, deep_copies_keep=True)

    def on_copy(self, model: nn.Module) -> bool:
        """Whether `model` (or a module inside it) carries our mark: a copy of a model found."""
        inner = getattr(model, "_orig_mod", model)
        return any(self._carries_one(sub) for sub in inner.modules())

    def remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._uncopied.give_back()

    def _carries_one(self, module: nn.Module) -> bool:
        return any(getattr(hook, "__self__", None) is self._finder
                   for hook in module._forward_hooks.values())
