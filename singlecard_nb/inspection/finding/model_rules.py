"""Which module a call is, by inspect_all's rules of what a model is (pure functions of a
module and the stack: `discovery.py` applies them). See README "What is a model"."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..recording import STEP_METHODS

_CALL_IMPL = nn.Module._call_impl.__code__
# Averaging helpers whose `module` is a copy of the model (torch's swa_utils, timm, ema-pytorch)
COPY_CLASSES = frozenset({"AveragedModel", "ModelEma", "ModelEmaV2", "ModelEmaV3", "EMA"})
# by class name, so that no library is imported to ask: DeepSpeed's engine (deepspeed.initialize)
# holds the model as `.module`, as DDP does
_DATA_PARALLEL = frozenset({"DataParallel", "DistributedDataParallel",
                            "FullyShardedDataParallel", "DeepSpeedEngine"})


def unwrapped(module: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The model inside DataParallel / DDP / FSDP / DeepSpeed engine wrappers, as a torch.compile wrapper of it (if
    the innermost wrapper is one: `inspect()` takes it and runs it eagerly), and the wrappers
    on the way."""
    chain = []
    while True:
        inner = getattr(module, "module", None)
        if type(module).__name__ in _DATA_PARALLEL and isinstance(inner, nn.Module):
            chain.append(module)
            module = inner
            continue
        return module, chain


def has_parameters(module: nn.Module) -> bool:
    """Whether `module` has parameters of real tensors: a copy made of fake tensors
    (`scn.fit`'s: shapes without memory, each with its `fake_mode`) is no model."""
    first = next(module.parameters(), None)
    return first is not None and getattr(first, "fake_mode", None) is None


def other_call_below(frame: Any, module: nn.Module) -> bool:
    """Whether a call of some other module is running below this call of `module`."""
    while frame is not None and not (frame.f_code is _CALL_IMPL
                                     and frame.f_locals.get("self") is module):
        frame = frame.f_back
    frame = frame.f_back if frame is not None else None
    while frame is not None:
        if frame.f_code is _CALL_IMPL:
            return True
        frame = frame.f_back
    return False


def method_owner(frame: Any, module: nn.Module) -> tuple[nn.Module | None, Any]:
    """The outermost module whose method is running below and which holds `module` (a
    LightningModule's training_step calling its encoder), and the frame of the step method
    (training_step, ...) of it that runs, if one does; (None, None) if no such module."""
    methods = []  # (module, frame), innermost first
    while frame is not None:
        self = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(self, nn.Module) and self is not module:
            methods.append((self, frame))
        frame = frame.f_back
    owner = next((m for m, _ in reversed(methods) if any(s is module for s in m.modules())),
                 None)
    step = next((f for m, f in methods if m is owner and f.f_code.co_name in STEP_METHODS),
                None)
    return owner, step


def call_kwargs(frame: Any) -> dict:
    """The keyword arguments of the module call whose pre-hooks run (torch's `inner`), or {}."""
    while frame is not None and frame.f_code is not _CALL_IMPL:
        if frame.f_code.co_name == "inner":
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        frame = frame.f_back
    return {}
