"""The storages a fake training step holds, and what they are.

A dispatch mode under the fake copy (fakes.py) sees every operation's outputs; each output
storage is counted from the operation that made it until the weak-reference finalizer of its
storage says it is gone, the way torch's MemTracker measures a step. The peak is the highest sum
of live storages, and what was live then is kept by kind and by module.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

KINDS = ("parameters", "gradients", "optimizer", "activations", "other")


class Ledger(TorchDispatchMode):
    """Live storages of a step: bytes, the op index they lived from/to, the phase and module."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> token
        self.info: dict[int, list] = {}  # token -> [bytes, born, died, phase, module]
        self.counter = itertools.count()
        self.op = 0
        self.now = self.peak = 0
        self.peak_at = -1
        self.phase = "setup"
        self.modules: list[str] = []  # the module stack of the fake model's forward
        self.measuring = False
        self.grad_tokens: dict[int | None, str] = {}  # gradients -> their module
        self.failed_in: str | None = None  # the module a failing step's error came out of
        self.failed_inputs: list[tuple] = []  # the shapes that module was called with

    def track(self, t: Any, phase: str | None = None, module: str | None = None) -> None:
        if not isinstance(t, torch.Tensor):
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if storage in self.tokens:
            return
        token = next(self.counter)
        nbytes = storage.nbytes()
        self.tokens[storage] = token
        where = module if module is not None else (self.modules[-1] if self.modules else "")
        self.info[token] = [nbytes, self.op, None, phase or self.phase, where]
        weakref.finalize(storage, self._freed, token)
        self.now += nbytes
        if self.measuring and self.now > self.peak:
            self.peak, self.peak_at = self.now, self.op

    def _freed(self, token: int) -> None:
        entry = self.info.get(token)
        if entry is not None and entry[2] is None:
            entry[2] = self.op
            self.now -= entry[0]

    def token_of(self, t: torch.Tensor) -> int | None:
        try:
            return self.tokens.get(t.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return None

    def start_measuring(self) -> None:
        self.measuring, self.peak, self.peak_at = True, self.now, self.op

    def live_at_peak(self) -> Iterator[tuple[int, list]]:
        for token, entry in self.info.items():
            if entry[1] <= self.peak_at and (entry[2] is None or entry[2] > self.peak_at):
                yield token, entry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.op += 1
        for t in tree_leaves(out):
            self.track(t)
        return out


@contextlib.contextmanager
def module_stack(model: nn.Module, ledger: Ledger) -> Iterator[None]:
    """Hooks on the fake copy's modules keep `ledger.modules` (the copy is ours alone)."""
    handles = []
    for path, module in model.named_modules():
        def pre(_m, _args, path=path):
            ledger.modules.append(path)

        def post(_m, _args, _out, path=path):
            if ledger.failed_in is None and sys.exc_info()[1] is not None:
                ledger.failed_in = path  # always_call: the innermost call the error left
                ledger.failed_inputs = [tuple(t.shape) for t in tree_leaves(_args)
                                        if isinstance(t, torch.Tensor)]
            if ledger.modules and ledger.modules[-1] == path:
                ledger.modules.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def classify(ledger: Ledger, model: nn.Module, optimizer: Any, owners: dict):
    """Kinds of the storages live at the peak: parameters, gradients (storages that became a
    .grad), optimizer state, activations (made by the forward), other (batch, temporaries)."""
    kind_of: dict[int, tuple[str, str]] = {}
    for path, m in model.named_modules():
        for p in m.parameters(recurse=False):
            if p.grad is not None and (token := ledger.token_of(p.grad)) is not None:
                kind_of.setdefault(token, ("gradients", path))
    if optimizer is not None:
        for p, state in optimizer.state.items():
            for v in state.values():
                if isinstance(v, torch.Tensor) and (token := ledger.token_of(v)) is not None:
                    kind_of[token] = ("optimizer", owners.get(id(p), ""))
    for token, path in ledger.grad_tokens.items():
        kind_of.setdefault(token, ("gradients", path))
    by_kind = dict.fromkeys(KINDS, 0)
    by_module: dict[str, dict[str, int]] = {}
    for token, (nbytes, _born, _died, phase, module) in ledger.live_at_peak():
        kind, where = kind_of.get(token, (None, module))
        if kind is None:
            kind = (phase if phase in ("parameters", "optimizer") else
                    "activations" if phase == "forward" else "other")
            if kind == "other" and phase != "forward":
                where = f"({phase})"
        by_kind[kind] += nbytes
        row = by_module.setdefault(where, dict.fromkeys(KINDS, 0))
        row[kind] += nbytes
    return by_kind, by_module
