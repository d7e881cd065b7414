"""`insp.memory()`: what each module holds, biggest first, with totals against the pinned card.

Parameters (and buffers), gradients and optimizer state are read when asked, from the model and
the optimisers; activations saved for backward and outputs come from the last recorded step
(`memory.py`). Each storage is counted once: a shared parameter for the first module that has
it; an output that a later module saves for backward is an activation, not an output too.
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...capacity import MEMORY_TABLES, Card, host_card, pinned_card, size_text
from ...theme import NO_MATH_CLASSES, no_math
from ..targets import target_of
from .ledger import MemoryLedger, storage_of

KINDS = ("parameters", "gradients", "optimizer", "activations", "outputs")
_SHOWN = 30  # rows the table renders (the frame has them all)


def _owners(model: nn.Module, targets: dict) -> list[tuple[str, str, nn.Module]]:
    """(owner path, type, module) for every module: an uninspected one counts for the nearest
    inspected ancestor."""
    owner_of: dict[str, str] = {}
    found = []
    for path, module in model.named_modules():
        target = target_of(targets, module)
        parent = owner_of.get(path.rpartition(".")[0], "") if path else ""
        owner_of[path] = target.path if target is not None else parent
        found.append((owner_of[path], type(module).__name__, module))
    return found


def _nbytes(t: Any, seen: set[int]) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    found = storage_of(t)
    if found is None:
        return t.numel() * t.element_size()
    key, nbytes, _ = found
    if key in seen:
        return 0
    seen.add(key)
    return nbytes


def module_bytes(model: nn.Module | None, targets: dict, step: dict[str, tuple[int, int]],
                 optimizers: list) -> dict[str, dict[str, int]]:
    """path -> {kind: bytes} (KINDS), with "type" -> the module's class name."""
    table: dict[str, dict[str, Any]] = {}
    if model is None:
        return table
    states = [opt.state for opt in optimizers]
    seen: set[int] = set()
    types = {target.path: target.type_name for target in targets.values()}
    for owner, type_name, module in _owners(model, targets):
        row = table.setdefault(owner, {"type": types.get(owner, type_name),
                                       **dict.fromkeys(KINDS, 0)})
        for p in module.parameters(recurse=False):
            row["parameters"] += _nbytes(p, seen)
            row["gradients"] += _nbytes(p.grad, seen)
            for state in states:
                for value in state.get(p, {}).values():
                    row["optimizer"] += _nbytes(value, seen)
        for b in module.buffers(recurse=False):
            row["parameters"] += _nbytes(b, seen)
    for path, (saved, outputs) in step.items():
        row = table.setdefault(path, {"type": types.get(path, "?"), **dict.fromkeys(KINDS, 0)})
        row["activations"] += saved
        row["outputs"] += outputs
    return table


class MemoryTable:
    """Per-module bytes of one inspector's model; renders as a table, `.frame()` a DataFrame."""

    def __init__(self, rows: dict[str, dict[str, Any]], step: int, card: Card | None,
                 device: str):
        self.step, self.card, self.device = step, card, device
        self.rows = sorted(((path, row) for path, row in rows.items()
                            if sum(row[k] for k in KINDS)),
                           key=lambda item: -sum(item[1][k] for k in KINDS))
        self.totals = {k: sum(row[k] for _, row in self.rows) for k in KINDS}
        self.total = sum(self.totals.values())

    def frame(self):
        import pandas as pd

        records = [{"module": path, "type": row["type"], **{k: row[k] for k in KINDS},
                    "total": sum(row[k] for k in KINDS)} for path, row in self.rows]
        return pd.DataFrame(records, columns=["module", "type", *KINDS, "total"])

    def headline(self) -> str:
        kinds = ", ".join(f"{k} {size_text(v)}" for k, v in self.totals.items() if v)
        line = (f"singlecard_nb memory (step {self.step}, {self.device}): "
                f"{size_text(self.total)} ({kinds or 'nothing recorded yet'})")
        card = self.card
        if card is None:
            return line + "; nothing pinned, so no card to compare with (scn.pin(...))"
        if card.total:
            line += (f"; {card.label}: {size_text(card.total)}, {100 * self.total / card.total:.0f}%"
                     f" of it")
        if card.free is not None:
            line += f", {size_text(card.free)} free"
        return line

    def _cells(self, path: str, row: dict) -> list[str]:
        return [path or "(model)", row["type"],
                *(size_text(row[k]) if row[k] else "" for k in KINDS),
                size_text(sum(row[k] for k in KINDS))]

    def __repr__(self) -> str:
        head = ["module", "type", *KINDS, "total"]
        cells = [self._cells(p, r) for p, r in self.rows[:_SHOWN]]
        widths = [max(len(c) for c in column) for column in zip(head, *cells)]
        lines = [self.headline(), "  ".join(h.ljust(w) for h, w in zip(head, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
        if len(self.rows) > _SHOWN:
            lines.append(f"... {len(self.rows) - _SHOWN} more modules (.frame() has them all)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ["module", "type", *KINDS, "total"])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in
                                         self._cells(p, r)) + "</tr>"
                       for p, r in self.rows[:_SHOWN])
        more = (f"<p>... {len(self.rows) - _SHOWN} more modules (.frame() has them all)</p>"
                if len(self.rows) > _SHOWN else "")
        return no_math(f"<div class='{NO_MATH_CLASSES}'><p><b>{html.escape(self.headline())}</b>"
                       f"</p><table class='singlecard-nb'><thead><tr>{head}</tr></thead>"
                       f"<tbody>{body}</tbody></table>{more}</div>")


def memory_table(model: nn.Module | None, targets: dict, ledger: MemoryLedger,
                 optimizers: list, card: Card | None) -> MemoryTable:
    """The table of `insp.memory()`; `card` None and a model on the CPU: the host's memory."""
    step, saved = ledger.table()
    device = "?"
    if model is not None:
        first = next(model.parameters(), None)
        device = str(first.device) if first is not None else "cpu"
    if card is None and device == "cpu":
        card = host_card()
    return MemoryTable(module_bytes(model, targets, saved, optimizers), step, card, device)


class MemoryWatch:
    """memory=True's part of an Inspector and the owner of its ledger (which the recorder and
    the call tracker are handed, and feed), the optimisers seen stepping the model, and the
    table published for the OOM rule.

    targets: the inspected modules now (id(module) -> Target), asked each time.
    """

    def __init__(self, model: nn.Module, targets: Callable[[], dict], diagnostics: Any):
        self._targets = targets
        self.ledger = MemoryLedger(model, targets, diagnostics)
        self._optimizers: weakref.WeakSet = weakref.WeakSet()
        self._model = weakref.ref(model)
        self._published = self.now  # one bound object: withdrawing compares it by identity

    def started(self, model: nn.Module, listen: Callable[[Callable], None]) -> None:
        listen(self._saw_optimizer)
        MEMORY_TABLES.publish(model, self._published)

    def stopped(self, model: nn.Module | None) -> None:
        MEMORY_TABLES.withdraw(model, self._published)

    def table(self, model: nn.Module | None, optimizer: Any = None) -> MemoryTable:
        optimizers = [optimizer] if optimizer is not None else list(self._optimizers)
        return memory_table(model, self._targets(), self.ledger, optimizers, pinned_card())

    def now(self) -> dict:
        """What the out-of-memory rule reads: path -> {kind: bytes}, this step so far."""
        return module_bytes(self._model(), self._targets(), self.ledger.current(),
                            list(self._optimizers))

    def _saw_optimizer(self, optimizer: Any) -> None:
        if optimizer not in self._optimizers:
            model = self._model()
            mine = {id(p) for p in model.parameters()} if model is not None else set()
            if any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
                self._optimizers.add(optimizer)
