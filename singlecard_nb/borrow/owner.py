"""`Borrowed`: the owner of a group of changes to global state (attributes, mapping items,
environment variables, hooks, callbacks), which it undoes together; every live owner is known
here, so that `restore_all()` gives everything back and `active_owners()` says what is held.
Patches nest: when two owners patch the same attribute and the lower one is restored first,
the upper one is rewired to restore the original, not the lower one's value. An environment
variable changed by someone else after we set it is theirs: restoring keeps it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

from .after_import import AfterImport
from .interrupts import uninterrupted

_Handle = TypeVar("_Handle")

_MISSING = object()  # sentinel: the attribute or variable did not exist before the change

_lock = threading.RLock()
# (kind, id(target), name) -> stack of live _Change entries on that slot, lowest first
_stacks: dict[tuple[str, int, str], list[_Change]] = {}
# Owners holding at least one change, strongly referenced so nothing borrowed is ever orphaned.
_owners: dict[int, Borrowed] = {}
_next_owner_id = 0


class _Change:
    """One saved slot: what was there before, and how to put a value back.

    `read`, when given, reads the slot now: restoring then leaves alone a slot that no longer
    holds `new` (the value this change wrote), because someone changed it since.
    """

    __slots__ = ("key", "old", "new", "put", "read", "label")

    def __init__(self, key, old, new, put: Callable[[Any], None], label: str,
                 read: Callable[[], Any] | None = None):
        self.key = key
        self.old = old
        self.new = new
        self.put = put  # put(value_or_MISSING) writes the slot
        self.read = read
        self.label = label

    def give_back(self) -> None:
        if self.read is not None and self.read() != self.new:
            return  # changed by someone else after us: theirs now, keep it
        self.put(self.old)


def _read_slot(obj: Any, name: str) -> Any:
    # Read from the object's own namespace so that restoring puts back exactly what the object
    # itself held (a class attribute inherited from a base must be deleted again, not copied).
    namespace = getattr(obj, "__dict__", None)
    if namespace is not None and not isinstance(obj, type):
        return namespace.get(name, _MISSING)
    if isinstance(obj, type):
        return obj.__dict__.get(name, _MISSING)
    return getattr(obj, name, _MISSING)


def _attr_writer(obj: Any, name: str) -> Callable[[Any], None]:
    def put(value: Any) -> None:
        if value is _MISSING:
            if _read_slot(obj, name) is not _MISSING:
                delattr(obj, name)
        else:
            setattr(obj, name, value)

    return put


def _env_writer(environ: MutableMapping[str, str], name: str) -> Callable[[Any], None]:
    def put(value: Any) -> None:
        if value is _MISSING:
            environ.pop(name, None)
        else:
            environ[name] = value

    return put


class Borrowed:
    """Owner of a group of changes to global state, undone together in reverse order.

    Use as a context manager or call `restore()`; restoring twice is harmless.
    `name` says who owns the changes (shown by `%singlecard status`).
    """

    def __init__(self, name: str):
        global _next_owner_id
        self.name = name
        self._undo: list[tuple[str, Callable[[], None]]] = []
        with _lock:
            self._id = _next_owner_id
            _next_owner_id += 1

    # --- making changes -------------------------------------------------------------------
    def set_attr(self, obj: Any, name: str, value: Any, label: str | None = None) -> None:
        """Patch `obj.name = value`, remembering the exact previous value (or its absence)."""
        label = label or f"{getattr(obj, '__name__', type(obj).__name__)}.{name}"
        self._push(("attr", id(obj), name), _read_slot(obj, name), _attr_writer(obj, name), value, label)

    def set_item(self, mapping: MutableMapping[Any, Any], key: Any, value: Any,
                 label: str) -> None:
        """Set `mapping[key] = value` (a table of the shell's, say), remembering what was there.
        Nests as `set_attr` does; restoring leaves a slot that someone else changed since."""
        def put(old: Any) -> None:
            if old is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = old

        self._push(("item", id(mapping), repr(key)), mapping.get(key, _MISSING), put, value,
                   label, read=lambda: mapping.get(key, _MISSING))

    def set_env(
        self,
        name: str,
        value: str | None,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        """Set (or, with None, unset) an environment variable, remembering the previous value.

        Restoring puts the previous value back only while the variable still holds `value`: a
        value the user (or their code) set in the meantime is theirs, and stays.
        """
        environ = os.environ if environ is None else environ
        writer = _env_writer(environ, name)
        self._push(("env", id(environ), name), environ.get(name, _MISSING), writer,
                   _MISSING if value is None else value, f"${name}",
                   read=lambda: environ.get(name, _MISSING))

    def add_hook(self, register: Callable[[], _Handle], label: str) -> _Handle:
        """`register()` (which registers a hook and returns its removable handle), owned at
        once: a Ctrl-C meanwhile is delivered once the handle is owned."""
        with uninterrupted():
            handle = register()
            self.on_restore(handle.remove, label)
        return handle

    def after_import(self, name: str, then: Callable[[Any], None], label: str) -> None:
        """`then(module)` for module `name`: now if it is imported, else just after it first
        runs (a finder on `sys.meta_path`, owned here: gone once it ran, or on restore). So a
        patch of a module that costs a second to import is made only where it is imported."""
        module = sys.modules.get(name)
        if module is not None:
            then(module)
            return
        finder = AfterImport(name, then, label)
        with uninterrupted():
            sys.meta_path.insert(0, finder)
            self.on_restore(finder.remove, f"{label} (waiting for `import {name}`)")

    def on_restore(self, undo: Callable[[], None], label: str) -> None:
        """Run `undo()` when this owner is restored (after later changes are undone)."""
        with _lock:
            self._undo.append((label, undo))
            _owners[self._id] = self

    # --- giving back ----------------------------------------------------------------------
    def restore(self) -> None:
        """Undo every change in reverse order. Errors are raised after all undos have run."""
        first_error: Exception | None = None
        with uninterrupted():  # a Ctrl-C half-way would leave the rest borrowed for good
            with _lock:
                undo, self._undo = self._undo, []
                _owners.pop(self._id, None)
            for label, fn in reversed(undo):
                try:
                    fn()
                except Exception as e:  # keep undoing the rest; report the first failure
                    if first_error is None:
                        first_error = RuntimeError(
                            f"singlecard_nb: could not restore {label}: {e}")
                        first_error.__cause__ = e
        if first_error is not None:
            raise first_error

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def describe(self) -> list[str]:
        """Labels of the changes currently held, oldest first."""
        return [label for label, _ in self._undo]

    def __enter__(self) -> Borrowed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"<Borrowed {self.name!r}: {len(self._undo)} change(s)>"

    # --- internals ------------------------------------------------------------------------
    def _push(self, key, current_old: Any, put: Callable[[Any], None], value: Any, label: str,
              read: Callable[[], Any] | None = None) -> None:
        with uninterrupted(), _lock:
            change = _Change(key, current_old, value, put, label, read)
            put(value)
            _stacks.setdefault(key, []).append(change)
            self._undo.append((label, lambda: _pop(change)))
            _owners[self._id] = self


def _pop(change: _Change) -> None:
    with _lock:
        stack = _stacks.get(change.key, [])
        if change not in stack:
            return
        position = stack.index(change)
        if position == len(stack) - 1:
            change.give_back()
        else:
            # A later change sits on top of ours: it must now restore what we saved.
            stack[position + 1].old = change.old
        stack.pop(position)
        if not stack:
            del _stacks[change.key]


def wrap_like(original: Callable, replacement: Callable) -> Callable:
    """`replacement` carrying `original`'s name, docstring and `__wrapped__`, for a patch: help(),
    tracebacks and `inspect.signature` of the patched function stay those of torch's."""
    return functools.update_wrapper(replacement, original)


def active_owners() -> list[Borrowed]:
    """Owners that currently hold at least one change, in creation order."""
    with _lock:
        return [owner for _, owner in sorted(_owners.items()) if owner.active]


def restore_all() -> None:
    """Restore every owner, newest first (used when the extension is unloaded)."""
    first_error: Exception | None = None
    for owner in reversed(active_owners()):
        try:
            owner.restore()
        except Exception as e:
            first_error = first_error or e
    if first_error is not None:
        raise first_error
