"""A training step run without real memory, and the storages it would have held.

The model, its optimizer and the batch are copied as fake tensors (`FakeTensorMode`: shapes,
dtypes and devices, no data), the way torch's MemTracker measures a step. A dispatch mode under
the copy sees every operation's outputs; each output storage is counted from the operation that
made it until the weak-reference finalizer of its storage says it is gone. The peak is the
highest sum of live storages, and what was live then is kept by kind and by module.

The user's own hooks never run on the fakes: the copy keeps only torch's own (weight_norm's
pre-hook computes the weight), and hooks registered for every module (an inspector's, a
user's `register_module_forward_hook`) are out of torch's tables while a step runs, back in
`finally`. Tensors a module keeps as plain attributes (`self.mask = torch.ones(...)`, not a
buffer) are faked with the parameters, and counted with them: no byte of them is copied.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.nn.modules import module as _module_globals
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


def fake_copy(model: nn.Module, optimizer: Any, mode: FakeTensorMode):
    """(model copy, optimizer copy or None, fake parameter -> module path): the copy's tensors
    are fake, so no byte of the real model is copied and nothing of it changes."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = mode.from_tensor(b)
    for t in attribute_tensors(model):
        if id(t) not in memo:
            memo[id(t)] = mode.from_tensor(t)
    try:
        fake_model = copy.deepcopy(model, memo)
    except Exception as e:
        raise RuntimeError(f"scn.fit could not copy {type(model).__name__} without its memory "
                           f"(copy.deepcopy with fake tensors raised {type(e).__name__}: {e})"
                           ) from e
    for module in fake_model.modules():
        _keep_torchs_hooks(module)
    fake_optimizer = None
    if optimizer is not None:
        groups = [{**{k: v for k, v in group.items() if k != "params"},
                   "params": [memo[id(p)] for p in group["params"] if id(p) in memo]}
                  for group in optimizer.param_groups]
        try:
            with mode:
                fake_optimizer = type(optimizer)(groups, **_constructor_defaults(optimizer))
        except Exception as e:
            raise RuntimeError(f"scn.fit could not rebuild {type(optimizer).__name__} on the "
                               f"copy ({type(e).__name__}: {e}); pass optimizer=None to plan "
                               "forward and backward only") from e
        for real, state in optimizer.state.items():
            fake = memo.get(id(real))
            if fake is not None:
                fake_optimizer.state[fake] = {k: _fake_state(v, mode) for k, v in state.items()}
    return fake_model, fake_optimizer


def attribute_tensors(module: nn.Module, recurse: bool = True) -> list[torch.Tensor]:
    """Tensors modules hold as plain attributes (also in lists, tuples and dicts), neither
    parameters nor buffers."""
    found = []
    for m in module.modules() if recurse else (module,):
        for name, value in vars(m).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                found += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)
                          and not isinstance(t, nn.Parameter)]
    return found


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                 "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")


def _torchs(hook: Any) -> bool:
    """A hook torch registered itself (weight_norm, spectral_norm, parametrizations)."""
    owner = getattr(hook, "__module__", None) or type(hook).__module__
    return isinstance(owner, str) and owner.startswith("torch.")


def _keep_torchs_hooks(module: nn.Module) -> None:
    """The copy's hook tables without the user's hooks (and inspectors'): only torch's own."""
    for name in _MODULE_HOOKS:
        table = getattr(module, name, None)
        if table:
            for key in [k for k, hook in table.items() if not _torchs(hook)]:
                del table[key]


@contextlib.contextmanager
def quiet_fake_kernels() -> Iterator[None]:
    """FakeTensorMode logs each failing kernel's whole traceback at ERROR before raising; the
    error itself is what fit reports, in one line."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def without_global_hooks() -> Iterator[None]:
    """The hooks registered for every module, but torch's own, out of torch's tables while a
    fake step runs; back, exactly as they were, in `finally`."""
    saved = []
    for name in _GLOBAL_HOOKS:
        table = getattr(_module_globals, name, None)
        if table:
            saved.append((table, dict(table)))
            for key in [k for k, hook in table.items() if not _torchs(hook)]:
                del table[key]
    try:
        yield
    finally:
        for table, entries in saved:
            table.clear()
            table.update(entries)


def reads_values(error: BaseException) -> bool:
    """Whether a fake step failed because code read tensor values (.item(), nonzero, masks)."""
    return isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))


def _fake_state(value: Any, mode: FakeTensorMode) -> Any:
    """A fake of one optimizer state entry. 0-dim counters (Adam's `step`) are read with
    .item(): they become constants of the fake mode, which it can read."""
    if not isinstance(value, torch.Tensor):
        return copy.copy(value)
    if value.dim() == 0:
        number = value.item()
        with mode:
            return torch.tensor(number, dtype=value.dtype, device=value.device)
    return mode.from_tensor(value)


def _constructor_defaults(optimizer: Any) -> dict:
    """The optimizer's defaults its constructor takes (each group carries its own settings;
    some defaults, like AdamW's decoupled_weight_decay, are no constructor argument)."""
    try:
        accepted = inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):
        return dict(optimizer.defaults)
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}


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
            by_kind, by_module = _classify(ledger, self.model, self.optimizer, self.owners)
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


def _classify(ledger: Ledger, model: nn.Module, optimizer: Any, owners: dict):
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
