"""Owners for borrowed global state: monkey-patches, environment variables, hooks, callbacks.

Every change singlecard_nb makes to torch, IPython or the process environment goes through a
`Borrowed` owner, which knows how to undo it. Owners are registered globally so that
`%unload_ext singlecard_nb` (`restore_all`) can give everything back, and `%singlecard status`
can say what is active. Patches nest: when two owners patch the same attribute and the lower one
is restored first, the upper one is rewired to restore the original, not the lower one's value.
An environment variable changed by someone else after we set it is theirs: restoring keeps it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

_Handle = TypeVar("_Handle")

_MISSING = object()  # sentinel: the attribute or variable did not exist before the change

_lock = threading.RLock()
# (kind, id(target), name) -> stack of live _Change entries on that slot, lowest first
_stacks: dict[tuple[str, int, str], list[_Change]] = {}
# Owners holding at least one change, strongly referenced so nothing borrowed is ever orphaned.
_owners: dict[int, Borrowed] = {}
_next_owner_id = 0


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then delivered as it would have been.

    A change and its owner's note of it are one step: a KeyboardInterrupt landing between a
    hook's registration and the owner taking its handle would leave the hook in torch's table
    for good. Python delivers SIGINT to the main thread only, so elsewhere (and inside another
    such block, and where no Python handler is installed) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or getattr(previous, "_holds_ctrl_c", False):
        yield
        return
    caught: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        caught.append((signum, frame))

    hold._holds_ctrl_c = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(*caught[0])  # Python's own handler: raises KeyboardInterrupt here
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


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

    def add_handle(self, handle: Any, label: str) -> Any:
        """Own a removable handle (anything with `.remove()`); returns it. Prefer `add_hook`:
        a Ctrl-C between making the handle and this call cannot be held back."""
        with uninterrupted():
            self.on_restore(handle.remove, label)
        return handle

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
        finder = _AfterImport(name, then, label)
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


class Listeners:
    """One borrowed patch or hook shared by many listeners, who come and go as a tuple.

    The patch is made by `install(owner)` when the first listener arrives. Listeners are kept
    in a tuple that is replaced, never changed, so a dispatch loop running in another thread
    (`for fn in self.listeners`) never sees it change. `keep` keeps the patch when the last
    listener leaves (for a table torch iterates while another thread may change it; the owner
    is still given back by `restore_all()` on unload).
    """

    name = "listeners"
    keep = False

    def __init__(self) -> None:
        self.listeners: tuple[Callable, ...] = ()
        self._owner: Borrowed | None = None
        self._lock = threading.Lock()

    def install(self, owner: Borrowed) -> None:
        raise NotImplementedError

    def add(self, listener: Callable) -> None:
        with uninterrupted(), self._lock:
            self._install_once()
            self.listeners = (*self.listeners, listener)

    def _install_once(self) -> None:
        """The patch made under a new owner if none holds it (the caller holds the lock)."""
        if self._owner is None or not self._owner.active:
            owner = Borrowed(self.name)
            try:
                self.install(owner)
            except BaseException:  # half made: given back, also on Ctrl-C
                owner.restore()
                raise
            self._owner = owner

    def discard(self, listener: Callable) -> None:
        with self._lock:
            self.listeners = tuple(fn for fn in self.listeners if fn is not listener)
            if not self.listeners and not self.keep and self._owner is not None:
                owner, self._owner = self._owner, None
                owner.restore()


class _AfterImport:
    """A `sys.meta_path` finder that lets the others find module `name` and runs `then` on
    the module once its code has run; it takes itself off the path the first time."""

    def __init__(self, name: str, then: Callable[[Any], None], label: str):
        self.name, self.then, self.label = name, then, label

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self.then, self.label)
        return spec


class _ThenLoader:
    """The real loader, and `then(module)` after it ran the module; the module keeps the real
    loader as its `__loader__`."""

    def __init__(self, loader: Any, then: Callable[[Any], None], label: str):
        self._loader, self._then, self._label = loader, then, label

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as e:  # the user's import goes on; what we could not do is said
            warnings.warn(f"singlecard_nb: {self._label} could not be made when "
                          f"{module.__name__} was imported: {type(e).__name__}: {e}",
                          RuntimeWarning, stacklevel=2)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


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
