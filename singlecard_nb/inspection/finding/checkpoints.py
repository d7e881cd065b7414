"""A model loaded back from a checkpoint saved while it was inspected.

`torch.save(model)` then `model = torch.load(path)` makes a new model object holding the saved
weights: pytorch/examples' word_language_model tests its best checkpoint so, after training. To
inspect_all it is a new model unless it is recognised: when a found model was pickled, its
fingerprint is kept (class, parameter names, shapes, dtypes and three values of each parameter:
exact, so a freshly initialised model of the same class never matches), and a model found later
with the same fingerprint is that model loaded back.

Cost: one read of a few values per parameter (one host transfer per device) at each save of a
found model, and at the first call of a new model of a class saved before; nothing per step.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import torch
from torch import nn

from ... import borrow

# The latest checkpoints remembered (a training loop saves its best model again and again; the
# one loaded back is nearly always among the last ones)
KEPT = 8


class Saved(NamedTuple):
    fingerprint: tuple
    name: str  # the model's name in inspectors()
    inspector: Any  # the Inspector that recorded it
    step: int  # its step when saved


class Checkpoints:
    """The fingerprints of the found models' latest checkpoints, bounded (`KEPT`)."""

    def __init__(self) -> None:
        self._saved: deque[Saved] = deque(maxlen=KEPT)

    def saved(self, model: nn.Module, name: str, inspector: Any, step: int) -> None:
        found = fingerprint(model)
        if found is not None:
            self._saved.append(Saved(found, name, inspector, step))

    def origin(self, model: nn.Module) -> Saved | None:
        """The checkpoint `model` was loaded from, the latest that matches; None if none."""
        if not any(s.fingerprint[0] == type(model).__qualname__ for s in self._saved):
            return None  # no model of its class was saved: nothing to read
        found = fingerprint(model)
        if found is None:
            return None
        return next((s for s in reversed(self._saved) if s.fingerprint == found), None)

    def clear(self) -> None:
        self._saved.clear()


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
