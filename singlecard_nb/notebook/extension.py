"""IPython extension lifecycle: what `%load_ext` registers and `%unload_ext` gives back."""

from __future__ import annotations

import os
from typing import Any

from .. import borrow

# shell -> the Magics instances registered on it, so unload removes exactly those
_registered: dict[int, list[Any]] = {}


def load(shell: Any) -> None:
    """Register the magics; pin at kernel start when SINGLECARD_NB_DEVICE is set.

    Runs in kernel start-up (profiles, kernel.json), so a bad SINGLECARD_NB_DEVICE or machine
    file is printed, never raised. Loading is all or nothing: if registering fails, what was
    registered is removed again, so IPython's "loaded" and our magics never disagree.
    """
    from .inspect_magics import InspectMagics
    from .magics import SingleCardMagics, pin_at_load

    if id(shell) in _registered:
        return
    instances = [SingleCardMagics(shell), InspectMagics(shell)]
    _registered[id(shell)] = instances
    committed = False
    try:
        for instance in instances:
            shell.register_magics(instance)
        committed = True
    finally:
        if not committed:
            for instance in _registered.pop(id(shell)):
                _unregister_magics(shell, instance)

    from . import explain_cells

    explain_cells.start(shell)  # explain failing cells by default; `%singlecard explain off`

    target = os.environ.get("SINGLECARD_NB_DEVICE", "").strip()
    if target:
        pin_at_load(shell, target)


def unload(shell: Any) -> None:
    """Restore torch, the environment and the shell, then remove our magics."""
    try:
        borrow.restore_all()
    finally:
        for instance in _registered.pop(id(shell), []):
            _unregister_magics(shell, instance)


def _unregister_magics(shell: Any, instance: Any) -> None:
    manager = shell.magics_manager
    for kind, names in instance.magics.items():
        table = manager.magics[kind]
        for name in names:
            bound = table.get(name)
            if getattr(bound, "__self__", None) is instance:
                del table[name]
    if manager.registry.get(type(instance).__name__) is instance:
        del manager.registry[type(instance).__name__]
