"""One handle for entries of torch's hook tables that we put in and take out ourselves (by key,
not through torch's own handle), modelled on `torch.utils.hooks.RemovableHandle`: it holds
each table by a weak reference, its `remove()` and `put()` may be called any number of times,
and it is a context manager.

Three places do this: the inspector's global forward hook (entered flag first, so another
thread never finds it half-registered), the finder of `inspect_all` (out of torch's table while
a known model runs), and `scn.fit`'s fake step (every hook but torch's own out while it runs).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def _reference(table: dict) -> Callable[[], dict | None]:
    """A weak reference to `table` (torch's tables are OrderedDicts); a plain dict, which takes
    none, is held as it is."""
    try:
        return weakref.ref(table)
    except TypeError:
        return lambda: table


class HookEntries:
    """Entries `(table, key, hook)` of torch's hook tables, put in in their order and taken out
    in the reverse one, so a reader of the tables never sees the later entries without the
    earlier ones (a hook without its with_kwargs flag).

    Made before any entry is in a table, it is ours before a Ctrl-C can fall between two
    entries: `remove()` then takes out whatever went in.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[tuple[dict, Any, Any]]):
        self._entries = [(_reference(table), key, hook) for table, key, hook in entries]

    @classmethod
    def taken_from(cls, tables: Iterable[dict], keep: Callable[[Any], bool]) -> HookEntries:
        """The entries of `tables` whose hook `keep` does not keep, as they are now (still in
        their tables: take them out with `remove()` or `taken_out()`)."""
        return cls((table, key, hook) for table in tables
                   for key, hook in list(table.items()) if not keep(hook))

    def put(self) -> None:
        """Each entry into its table (one already there is left where it is)."""
        for reference, key, hook in self._entries:
            table = reference()
            if table is not None and key not in table:
                table[key] = hook

    def remove(self) -> None:
        """Each entry out of its table, last first; what is already out, or a table gone, is
        passed over."""
        for reference, key, _ in reversed(self._entries):
            table = reference()
            if table is not None:
                table.pop(key, None)

    @contextlib.contextmanager
    def taken_out(self) -> Iterator[HookEntries]:
        """The entries out of their tables while the block runs; back in `finally`, each where
        it was among the entries still there (also on an exception or Ctrl-C)."""
        orders: dict[int, tuple[Callable[[], dict | None], list]] = {}
        for reference, _, _ in self._entries:  # each table's order, once per table
            table = reference()
            if table is not None and id(table) not in orders:
                orders[id(table)] = (reference, list(table))
        self.remove()
        try:
            yield self
        finally:
            self.put()
            for reference, order in orders.values():
                _reorder(reference(), order)

    def __len__(self) -> int:
        return len(self._entries)

    def __enter__(self) -> HookEntries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _reorder(table: dict | None, order: list) -> None:
    """`table`'s keys in `order` again (keys not in `order`, added meanwhile, after them),
    moving entries without ever taking one out (a reader in another thread sees every hook)."""
    if table is None:
        return
    before = set(order)
    wanted = [key for key in order if key in table] + [key for key in table if key not in before]
    if list(table) == wanted:
        return
    move = getattr(table, "move_to_end", None)
    for key in wanted:
        if move is not None:
            move(key)
        else:  # a plain dict: out and in again
            table[key] = table.pop(key)
