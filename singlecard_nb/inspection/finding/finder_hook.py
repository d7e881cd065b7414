"""The finder's one global forward pre-hook, in and out of torch's table: out while a known
model's call runs (the calls inside it then cost what they cost under `inspect(model)` alone),
back when that call returns, so code that calls no module never meets it twice."""

from __future__ import annotations

from collections.abc import Callable

from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_pre_hook

from ...borrow import Borrowed

_GLOBAL_PRE_HOOKS: dict = _module_globals._global_forward_pre_hooks


class FinderHook:
    """`hook(module, args)` as a global forward pre-hook, registered under an owner, then taken
    out of torch's table (`disarm`) and put back (`arm`, only while `active()`)."""

    def __init__(self, hook: Callable, active: Callable[[], bool]):
        self._hook = hook  # one bound object: in and out of torch's table
        self._active = active
        self._id: int | None = None

    def register(self, owner: Borrowed) -> None:
        handle = owner.add_hook(lambda: register_module_forward_pre_hook(self._hook),
                                "global forward pre-hook finding models")
        self._id = handle.id

    def arm(self) -> None:
        if self._id is not None and self._active():
            _GLOBAL_PRE_HOOKS[self._id] = self._hook

    def disarm(self) -> None:
        if self._id is not None:
            _GLOBAL_PRE_HOOKS.pop(self._id, None)
