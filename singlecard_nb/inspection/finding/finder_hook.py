"""The finder's one global forward pre-hook, in and out of torch's table: out while a known
model's call runs (the calls inside it then cost what they cost under `inspect(model)` alone),
back when that call returns, so code that calls no module never meets it twice."""

from __future__ import annotations

from collections.abc import Callable

from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_pre_hook

from ...borrow import Borrowed, HookEntries

_GLOBAL_PRE_HOOKS: dict = _module_globals._global_forward_pre_hooks


class FinderHook:
    """`hook(module, args)` as a global forward pre-hook, registered under an owner, then taken
    out of torch's table (`disarm`) and put back (`arm`, only while `active()`)."""

    def __init__(self, hook: Callable, active: Callable[[], bool]):
        self._hook = hook  # one bound object: in and out of torch's table
        self._active = active
        self._entry: HookEntries | None = None  # the hook's entry, under torch's handle's key

    def register(self, owner: Borrowed) -> None:
        handle = owner.add_hook(lambda: register_module_forward_pre_hook(self._hook),
                                "global forward pre-hook finding models")
        self._entry = HookEntries([(_GLOBAL_PRE_HOOKS, handle.id, self._hook)])

    def arm(self) -> None:
        if self._entry is not None and self._active():
            self._entry.put()

    def disarm(self) -> None:
        if self._entry is not None:
            self._entry.remove()
