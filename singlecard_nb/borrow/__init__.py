"""Owners for borrowed global state: monkey-patches, environment variables, hooks, callbacks.

Every change singlecard_nb makes to torch, IPython or the process environment goes through a
`Borrowed` owner, which knows how to undo it. Owners are registered globally so that
`%unload_ext singlecard_nb` (`restore_all`) can give everything back, and `%singlecard status`
can say what is active. Patches nest: when two owners patch the same attribute and the lower one
is restored first, the upper one is rewired to restore the original, not the lower one's value.
An environment variable changed by someone else after we set it is theirs: restoring keeps it.

The owner and its registry are `owner.py`; holding Ctrl-C back meanwhile, `interrupts.py`; one
patch shared by many listeners, `listeners.py`; a patch made when a module is first imported,
`after_import.py`; entries of torch's hook tables we put in and take out by key,
`hook_tables.py`.
"""

from .hook_tables import HookEntries
from .interrupts import uninterrupted
from .listeners import Listeners
from .owner import Borrowed, active_owners, restore_all, wrap_like

__all__ = ["Borrowed", "HookEntries", "Listeners", "active_owners", "restore_all", "uninterrupted",
           "wrap_like"]
