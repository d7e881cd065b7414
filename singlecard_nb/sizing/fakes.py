"""The model and its optimizer copied as fake tensors, and the fake step kept from the user's
hooks (and from torch's logging of each failing fake kernel) while it runs.

`FakeTensorMode` copies have shapes, dtypes and devices, no data. The user's own hooks never run
on the fakes: the copy keeps only torch's own (weight_norm's pre-hook computes the weight), and
hooks registered for every module (an inspector's, a user's `register_module_forward_hook`) are
out of torch's tables while a step runs, back in `finally`. Tensors a module keeps as plain
attributes (`self.mask = torch.ones(...)`, not a buffer) are faked with the parameters, and
counted with them: no byte of them is copied.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.modules import module as _module_globals
from torch.utils._pytree import tree_leaves

from ..borrow import HookEntries


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
    fake step runs; back, each where it was, in `finally`."""
    tables = [getattr(_module_globals, name, None) for name in _GLOBAL_HOOKS]
    with HookEntries.taken_from([t for t in tables if t], keep=_torchs).taken_out():
        yield


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


