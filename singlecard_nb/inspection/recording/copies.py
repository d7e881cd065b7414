"""What a copy of an inspected module carries: nothing of ours.

`torch.save(model)`, `pickle` and `copy.deepcopy` read a module's state through its
`__getstate__`. While a module holds hooks or attributes of ours, its owner sets an instance
attribute `__getstate__` (found before the class's) that hands out the state the module's class
would, less those hooks and attributes; the owner takes it away with the hooks (`give_back`). So a saved
checkpoint holds no bound method of an inspector (which cannot be pickled: `word_language_model`
died at its first checkpoint) and a loaded or deep-copied model carries no hook of ours.

One exception, for deep copies only: inspect_all's mark (`deep_copies_keep=True`), by which a
deep copy of a model (an EMA) shows as a copy, is kept in a deep copy; a pickle (also the
copy's) never has it.
And the owner may be told each time a module's state is read (`on_copied`), and give the copy
attributes of its own (a pickle gets them, a deep copy gets None): inspect_all remembers the
checkpoints of the models it found and marks their pickles, to know them when loaded back.
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch import nn

from ...borrow import uninterrupted

_ATTRIBUTE = "__getstate__"


class _KeptInDeepCopies(OrderedDict):
    """A hook table in a module's state: pickled without `transient` entries, deep-copied
    with them (and the copy pickled without them again)."""

    def __init__(self, items: Any = (), transient: frozenset = frozenset()):
        super().__init__(items)
        self.transient = transient

    def __reduce__(self):
        return OrderedDict, ([(k, v) for k, v in self.items() if k not in self.transient],)

    def __deepcopy__(self, memo: dict) -> _KeptInDeepCopies:
        # the copy keeps the entries, and leaves the same ones out of its own pickles (an EMA
        # copy saved with torch.save would otherwise pickle our hook, and fail)
        result = _KeptInDeepCopies(transient=self.transient)
        memo[id(self)] = result
        for key, value in self.items():
            result[copy.deepcopy(key, memo)] = copy.deepcopy(value, memo)
        return result


class _OnlyInPickles(OrderedDict):
    """An attribute's value given to a copy: pickled as a plain OrderedDict (which
    `torch.load(weights_only=True)` reads too), deep-copied as None."""

    def __reduce__(self):
        return OrderedDict, (list(self.items()),)

    def __deepcopy__(self, memo: dict) -> None:
        return None


class _StateWithoutOurs:
    """A module's `__getstate__` while it holds hooks or attributes of one owner."""

    def __init__(self, module: nn.Module, previous: Any,
                 on_copied: Callable[[nn.Module], dict | None] | None = None):
        self._module = weakref.ref(module)
        self._on_copied = on_copied
        self._previous = previous  # another owner's, or None: the class's
        self.hook_ids: set[int] = set()  # left out of every copy
        self.copied_ids: set[int] = set()  # kept in deep copies only
        self.names: set[str] = set()  # instance attributes of ours
        self.given_back = False  # its owner is done: it only hands on `previous`

    def __call__(self) -> Any:
        module = self._module()
        previous = self._previous
        state = previous() if previous is not None else type(module).__getstate__(module)
        if not isinstance(state, dict) or self.given_back:
            return state
        added: dict = {}
        if self._on_copied is not None:
            try:
                added = self._on_copied(module) or {}
            except Exception:  # the owner's bookkeeping never fails the user's save
                pass
        dropped, copied = self.hook_ids, self.copied_ids
        result = {name: _OnlyInPickles(value) for name, value in added.items()}
        for key, value in state.items():
            if key == _ATTRIBUTE or key in self.names or key in added:
                continue
            if (isinstance(value, dict) and key.startswith("_") and "hooks" in key
                    and not (dropped.isdisjoint(value) and copied.isdisjoint(value))):
                transient = copied.intersection(value)
                if isinstance(value, _KeptInDeepCopies):
                    transient |= value.transient
                items = [(k, v) for k, v in value.items() if k not in dropped]
                value = (_KeptInDeepCopies(items, frozenset(transient)) if transient
                         else OrderedDict(items))
            result[key] = value
        return result

    def give_back(self) -> None:
        """Off the module, the one below it put back (or none: the class's again); under
        another owner's, it stays to hand on, and that owner skips it when it gives back."""
        self.given_back = True
        module = self._module()
        if module is None or module.__dict__.get(_ATTRIBUTE) is not self:
            return
        previous = self._previous
        while isinstance(previous, _StateWithoutOurs) and previous.given_back:
            previous = previous._previous
        if previous is None:
            del module.__dict__[_ATTRIBUTE]
        else:
            module.__dict__[_ATTRIBUTE] = previous


class Uncopied:
    """The hooks and attributes one owner puts on modules, left out of their copies; the
    modules are held weakly (an inspect_all that lives long keeps no model alive).
    `give_back()` (run by the owner, on restore) takes every `__getstate__` off again.
    `on_copied(module)` runs each time one of them is pickled or deep-copied; the {name: dict}
    it returns become attributes of a pickle's copy (None in a deep copy)."""

    def __init__(self, on_copied: Callable[[nn.Module], dict | None] | None = None) -> None:
        self._states: dict[int, _StateWithoutOurs] = {}
        self._on_copied = on_copied

    def hook(self, module: nn.Module, handle: Any, *, deep_copies_keep: bool = False) -> None:
        """Leave the hook of `handle` (a RemovableHandle on `module`) out of copies."""
        state = self._state(module)
        (state.copied_ids if deep_copies_keep else state.hook_ids).add(handle.id)

    def attribute(self, module: nn.Module, name: str) -> None:
        """Leave the instance attribute `name` (a patch of ours) out of copies."""
        self._state(module).names.add(name)

    def give_back(self) -> None:
        states, self._states = self._states, {}
        for state in states.values():
            state.give_back()

    def _state(self, module: nn.Module) -> _StateWithoutOurs:
        state = self._states.get(id(module))
        if state is None or state._module() is not module:
            state = _StateWithoutOurs(module, module.__dict__.get(_ATTRIBUTE), self._on_copied)
            with uninterrupted():
                module.__dict__[_ATTRIBUTE] = state  # found before the class's
                self._states[id(module)] = state
        return state
