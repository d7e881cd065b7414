"""The models inspect_all found, and their inspectors: named by class (`GPT`, then `GPT#2`),
in the order found; those the user started (`inspect(model)`) listed but never stopped here;
and a model loaded back from its checkpoint continuing the inspector it was saved from
(checkpoints.py). What is a model, and when one is found, is discovery.py's."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch import nn

from ..engine import Inspector, recording_inspector
from .checkpoints import Checkpoints, Saved, marked, taken_mark


class FoundModels:
    """{name: Inspector} of the models found. `say(kind, message)` tells the user, once."""

    def __init__(self, options: dict, say: Callable[[str, str], None]):
        self._options = options
        self._say = say
        self.by_name: dict[str, Inspector] = {}
        self._names: Counter[str] = Counter()
        self._theirs: set[int] = set()  # ids of inspectors the user started
        self._checkpoints = Checkpoints()  # the found models' latest saves

    def __len__(self) -> int:
        return len(self.by_name)

    def follow_replacements(self) -> None:
        """A model's inspector replaced by one the user started on it later (`inspect(model)`
        after its first call stops ours): that one is listed, as when the user's came first."""
        for name, insp in list(self.by_name.items()):
            latest, seen = insp, {id(insp)}
            # a rank's records read back (`Recorded`) are never replaced
            while (after := getattr(latest, "replaced_by", None)) is not None \
                    and id(after) not in seen:
                latest = after
                seen.add(id(latest))
            if latest is not insp:
                self.by_name[name] = latest
                self._theirs.add(id(latest))

    def clear(self) -> None:
        """A new run: stop ours and forget them all; names start again."""
        self.stop()
        self.by_name, self._names = {}, Counter()
        self._checkpoints.clear()

    def stop(self) -> None:
        """Stop the inspectors we started; their records stay."""
        self.follow_replacements()
        for insp in list(self.by_name.values()):
            if id(insp) not in self._theirs:
                insp.stop()

    def stop_gone(self) -> None:
        """Stop the inspectors of models the code has dropped (ours hold them weakly): their
        records stay, what they borrowed besides the models' own hooks goes back."""
        for insp in list(self.by_name.values()):
            if insp.active and insp.model is None and id(insp) not in self._theirs:
                insp.stop()

    def inspector(self, model: nn.Module, inner: nn.Module) -> tuple[str, Inspector, bool]:
        """(name, inspector, whether it is new) for a model just found: a model the user
        inspects already (`inspect(model)`) keeps its inspector; a model loaded back from a
        checkpoint (an unpickle, never a model its constructor built) continues the inspector
        of the model it was saved from, once that is gone."""
        self.stop_gone()  # a sweep's earlier models, dropped since
        self.follow_replacements()
        mark = taken_mark(inner)
        theirs = recording_inspector(inner)
        origin = self._checkpoints.origin(mark, inner) if theirs is None else None
        if origin is not None and self._continues(origin, model):
            return origin.name, origin.inspector, True
        name = type(inner).__name__
        self._names[name] += 1
        if self._names[name] > 1:
            name = f"{name}#{self._names[name]}"
        if theirs is None:
            insp = Inspector(model, **self._options).start(hold_model=False)
        else:
            insp = theirs
            self._theirs.add(id(insp))
        if origin is not None:
            why = ("memory=True measures the model it was made for"
                   if self._options.get("memory") else f"{origin.name} still lives")
            self._say(f"loaded {name}", f"{name} is {origin.name}'s checkpoint of step "
                      f"{origin.step} loaded back: a second model with records of its own "
                      f"({why}).")
        self.by_name[name] = insp
        return name, insp, theirs is None

    def saved(self, insp: Inspector | None) -> dict | None:
        """A found model (or its wrapper) was pickled (`torch.save`, or a deep copy): the
        attributes its pickle is to carry, by which its unpickle is known."""
        self.follow_replacements()
        model = insp.model if insp is not None else None
        if model is None or id(insp) in self._theirs:
            return None  # the user's own inspect(model) is never continued by us
        name = next((n for n, i in self.by_name.items() if i is insp), None)
        if name is None:
            return None
        return marked(self._checkpoints.saved(model, name, insp, insp.current_step))

    def _continues(self, origin: Saved, model: nn.Module) -> bool:
        """`model` was loaded from `origin`'s checkpoint: once the original is dropped (a
        `gc.collect()` first, for one held only by a reference cycle), it continues its
        records under its name. False while the original lives: a second model."""
        insp = origin.inspector
        if id(insp) in self._theirs or self.by_name.get(origin.name) is not insp:
            return False
        if insp.model is not None:
            gc.collect()
            self.stop_gone()
        try:
            insp.continue_on(model)
        except RuntimeError:  # the original lives (or is still recorded), or memory=True
            return False
        self._say(f"loaded {origin.name}", f"{origin.name}'s checkpoint of step {origin.step}, "
                  f"loaded back, continues {origin.name}'s records from step "
                  f"{insp.current_step + 1} (torch.load made a new model; the one saved is "
                  "gone).")
        return True

    def adopt(self, found: dict[str, Any]) -> None:
        """Models recorded in other processes join by name (each rank's, under --ranks)."""
        self.by_name.update(found)
