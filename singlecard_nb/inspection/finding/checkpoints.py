"""A model loaded back from a checkpoint saved while it was inspected.

`torch.save(model)` then `model = torch.load(path)` makes a new model object holding the saved
weights: pytorch/examples' word_language_model tests its best checkpoint so, after training. To
inspect_all it is a new model unless it is recognised, and only the unpickle itself tells: when
a found model is pickled (or deep-copied), its state gets one attribute of ours, `MARK`, a plain
string (this run's token and the model's name, so `weights_only` loads read it too), and only a
model carrying it, that is one made by an unpickle or a copy of such a state, is a checkpoint. A
model built by its constructor never is, whatever its values (a seeded sweep builds the same
values again). Among several checkpoints of one model, a fingerprint taken at each save (class,
parameter names, shapes, dtypes and three values of each parameter) tells which was loaded.

Cost: one read of a few values per parameter (one host transfer per device) at each save of a
found model, and at the first call of a model loaded back from one of several saves.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Any, NamedTuple

import torch
from torch import nn

from ... import borrow

# The latest checkpoints remembered (a training loop saves its best model again and again; the
# one loaded back is nearly always among the last ones)
KEPT = 8
# The attribute a pickled found model's state carries (a loaded model gets it as the unpickle
# restores its __dict__); taken off again when the model is found
MARK = "_singlecard_nb_checkpoint_of"


class Saved(NamedTuple):
    fingerprint: tuple | None
    name: str  # the model's name in inspectors()
    inspector: Any  # the Inspector that recorded it
    step: int  # its step when saved
    mark: str  # what its pickle carries


class Checkpoints:
    """The found models' latest checkpoints, bounded (`KEPT`)."""

    def __init__(self) -> None:
        self._saved: deque[Saved] = deque(maxlen=KEPT)
        self._run = secrets.token_hex(8)  # a checkpoint of another run or process never matches

    def saved(self, model: nn.Module, name: str, inspector: Any, step: int) -> str:
        """Remember a save of `model`; returns the mark its pickled state is to carry."""
        mark = f"{self._run} {name}"
        self._saved.append(Saved(fingerprint(model), name, inspector, step, mark))
        return mark

    def origin(self, mark: str | None, model: nn.Module) -> Saved | None:
        """The checkpoint `model`, unpickled with `mark` (see `taken_mark`), was loaded from:
        of that model's saves, the latest whose fingerprint matches, else its latest save."""
        saves = [s for s in self._saved if s.mark == mark] if mark is not None else []
        if len(saves) > 1:
            found = fingerprint(model)
            same = [s for s in saves if found is not None and s.fingerprint == found]
            saves = same or saves
        return saves[-1] if saves else None

    def clear(self) -> None:
        self._saved.clear()
        self._run = secrets.token_hex(8)


def marked(mark: str) -> dict:
    """The attributes a found model's pickle carries (copies.py gives them to a pickle only:
    a deep copy, an EMA, gets None)."""
    return {MARK: {"of": mark}}


def taken_mark(model: nn.Module) -> str | None:
    """The mark `model` came with from an unpickle (None: it was built by its constructor,
    or deep-copied from a live model), taken off it: the model is as its class makes it."""
    value = model.__dict__.pop(MARK, None)
    return value.get("of") if isinstance(value, dict) else None


def fingerprint(model: nn.Module) -> tuple | None:
    """(class, ((name, shape, dtype), ...), values): None when a parameter cannot be read as a
    plain tensor (a DTensor shard, a meta tensor), as nothing then tells two models apart."""
    try:
        layout, picks = [], {}
        with borrow.uninterrupted(), torch.no_grad():  # Ctrl-C: grad mode stays the user's
            for name, param in model.named_parameters():
                tensor = param.detach()
                if type(tensor) is not torch.Tensor or tensor.is_meta:
                    return None
                layout.append((name, tuple(tensor.shape), str(tensor.dtype)))
                if tensor.numel():
                    shape = tensor.shape
                    corners = {tuple(0 for _ in shape), tuple(s // 2 for s in shape),
                               tuple(s - 1 for s in shape)}
                    picks.setdefault(tensor.device, []).extend(
                        tensor[index].float() for index in sorted(corners))
            values = tuple(value for device in sorted(picks, key=str)
                           for value in torch.stack(picks[device]).tolist())
        return type(model).__qualname__, tuple(layout), values
    except Exception:  # a fingerprint is a convenience: never an error in the user's save
        return None
