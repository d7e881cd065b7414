"""The one global module forward hook of an inspector, entered into torch's tables and taken
out of them in an order that is safe at any instant (another thread running a module, a Ctrl-C
in between). The call tracker installs it on a recorded step and removes it at the step's end,
so other models, and steps that `every=N` skips, run on torch's hook-free fast path."""

from __future__ import annotations

from collections.abc import Callable

from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook
from torch.utils.hooks import RemovableHandle

from ...borrow import HookEntries

# torch's handle for register_module_forward_hook(..., with_kwargs=True) does not remove the
# with_kwargs entry it made (torch <= 2.13): the flag is an entry of our own handle.
_GLOBAL_WITH_KWARGS: dict = getattr(_module_globals, "_global_forward_hooks_with_kwargs", {})
# None on a torch without these tables: the hook is then registered through torch's function
_GLOBAL_HOOKS: dict | None = (getattr(_module_globals, "_global_forward_hooks", None)
                              if hasattr(_module_globals, "_global_forward_hooks_with_kwargs")
                              else None)


class GlobalHook:
    """`hook(module, args, kwargs, output)` as torch's global forward hook while installed.

    hook: set by the attachment before the first `install()` (the call tracker's on_forward).
    """

    def __init__(self) -> None:
        self.hook: Callable | None = None
        self._handle: HookEntries | RemovableHandle | None = None
        # (hook, its entries) of every install, made once per hook: the key stays ours (torch
        # hands out each key once), and each recorded step puts them in and takes them out
        self._entries: tuple[Callable, HookEntries] | None = None

    def install(self) -> None:
        """The global forward hook (with_kwargs), entered into torch's tables in an order that
        is safe at any instant: another thread running any module never finds the hook
        without its with_kwargs flag (torch's own register sets the flag second, and such a
        call would pass the hook the wrong arguments), and the handle is ours before the hook
        is in a table, so a Ctrl-C in between leaves nothing that remove() cannot find."""
        if self._handle is not None:
            return
        if _GLOBAL_HOOKS is None:  # a torch without these tables: its own register
            self._handle = register_module_forward_hook(self.hook, with_kwargs=True)
            return
        if self._entries is None or self._entries[0] is not self.hook:
            key = RemovableHandle(_GLOBAL_HOOKS).id  # a key torch gives no other hook
            self._entries = (self.hook, HookEntries([(_GLOBAL_WITH_KWARGS, key, True),  # flag first
                                                     (_GLOBAL_HOOKS, key, self.hook)]))
        self._handle = self._entries[1]
        self._handle.put()

    def remove(self) -> None:
        """The hook out of torch's tables, then its flag; forgotten only once both are gone
        (an interrupted removal is finished by the next call)."""
        handle = self._handle
        if handle is not None:
            handle.remove()
            self._handle = None
