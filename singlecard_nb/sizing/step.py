"""A training step run without real memory: `FakeStep` measures steady-state steps on the fakes
(fakes.py) under the ledger of their storages (storages.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._pytree import tree_leaves

from .fakes import attribute_tensors, fake_copy, quiet_fake_kernels, without_global_hooks
from .storages import Ledger, classify, module_stack


def reads_values(error: BaseException) -> bool:
    """Whether a fake step failed because code read tensor values (.item(), nonzero, masks)."""
    return isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))


class FakeStep:
    """Fakes of a model and its optimizer, and steady-state training steps measured on them.

    The optimizer's first step (which creates its state) runs once, unmeasured, before the
    first step measured, as in training from the second step on.
    """

    def __init__(self, model: nn.Module, optimizer: Any,
                 loss_fn: Callable[[Any], torch.Tensor]):
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.model, self.optimizer = fake_copy(model, optimizer, self.mode)
        self.loss_fn = loss_fn
        self.owners: dict[int, str] = {}  # a shared parameter is its first module's
        for path, m in self.model.named_modules():
            for p in m.parameters(recurse=False):
                self.owners.setdefault(id(p), path)
        self._warm = self.optimizer is not None and not self.optimizer.state
        self.failed_in: str | None = None  # the module the last failed step's error left
        self.failed_inputs: list[tuple] = []

    def measure(self, batch: Callable[[], Any], autocast: torch.dtype | None = None
                ) -> tuple[Ledger, dict[str, int], dict]:
        """One step on `batch()`: the ledger, and the kinds (bytes) live at the peak, summed
        and by module."""
        ledger = Ledger()
        for p in self.model.parameters():
            p.grad = None  # a step that failed half-way leaves none behind
        with quiet_fake_kernels(), without_global_hooks(), self.mode, ledger, \
                module_stack(self.model, ledger):
            for path, m in self.model.named_modules():
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False),
                          *attribute_tensors(m, recurse=False)):
                    ledger.track(t, "parameters", path)
            if self.optimizer is not None:
                for p, state in self.optimizer.state.items():
                    for v in state.values():
                        ledger.track(v, "optimizer", self.owners.get(id(p), ""))
            try:
                if self._warm:
                    _one_step(self.model, self.optimizer, batch, self.loss_fn, ledger, autocast)
                    self._warm = False
                ledger.start_measuring()
                _one_step(self.model, self.optimizer, batch, self.loss_fn, ledger, autocast)
            finally:
                self.failed_in, self.failed_inputs = ledger.failed_in, ledger.failed_inputs
            by_kind, by_module = classify(ledger, self.model, self.optimizer, self.owners)
        return ledger, by_kind, by_module


def _one_step(model, optimizer, batch, loss_fn, ledger: Ledger, autocast) -> None:
    ledger.phase = "input"
    args, kwargs = batch()
    for t in tree_leaves((args, kwargs)):
        ledger.track(t)
    ledger.phase = "forward"
    device = next((t.device.type for t in tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor)), "cpu")
    context = (torch.autocast(device, dtype=autocast) if autocast is not None
               else contextlib.nullcontext())
    with context:
        output = model(*args, **kwargs)
        ledger.phase = "loss"
        loss = loss_fn(output)
    ledger.phase = "backward"
    loss.backward()
    del output, loss, args, kwargs
    ledger.grad_tokens = {}  # before zero_grad lets them go
    for path, m in model.named_modules():
        for p in m.parameters(recurse=False):
            if p.grad is not None:
                ledger.grad_tokens.setdefault(ledger.token_of(p.grad), path)
    if optimizer is not None:
        ledger.phase = "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


