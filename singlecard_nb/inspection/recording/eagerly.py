"""Compiled code bypasses module hooks: the inspector's own hooks never enter a graph
(`eager`), and compiled modules and `torch.compile` wrappers run eagerly while inspected, under
the inspector's owner (so `stop()` gives the compiled code back)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn

from ...borrow import Borrowed
from ..targets import Target

_TORCH_COMPILE_HOOK_NOTE = r"Using `torch.compile\(module\)` when there are global hooks"


def eager(fn: Callable) -> Callable:
    """`fn`, never traced into a compiled graph (torch.compiler.disable where available)."""
    disable = getattr(torch.compiler, "disable", None)
    return disable(fn) if disable is not None else fn


def _remove_filter(entry: tuple) -> None:
    if entry in warnings.filters:
        warnings.filters.remove(entry)
        getattr(warnings, "_filters_mutated", lambda: None)()  # what filterwarnings calls


def _run_wrapper_eagerly(owner: Borrowed, model: nn.Module, wrapper: nn.Module) -> None:
    owner.set_attr(wrapper, "forward", model.__call__,
                   "torch.compile wrapper runs the original module")
    # torch notes that global hooks also fire for the wrapper; ours ignore it
    warnings.filterwarnings("ignore", message=_TORCH_COMPILE_HOOK_NOTE)
    owner.on_restore(functools.partial(_remove_filter, warnings.filters[0]),
                     "warnings filter for torch.compile's global hook note")


def run_compiled_modules_eagerly(owner: Borrowed, model: nn.Module, wrapper: nn.Module | None,
                                 say: Callable[[str, str], None]) -> None:
    """Compiled code bypasses module hooks: while inspected, compiled modules run eagerly."""
    compiled = []
    for path, m in model.named_modules():
        if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile()
            owner.set_attr(m, "_compiled_call_impl", None, "compiled module runs eagerly")
            compiled.append(repr(path))
    if wrapper is not None:  # torch.compile(module): call the original instead
        _run_wrapper_eagerly(owner, model, wrapper)
        compiled.insert(0, f"the torch.compile wrapper of {type(model).__name__}")
    if compiled:
        listed = ", ".join(compiled[:5]) + (", ..." if len(compiled) > 5 else "")
        say("compiled", f"compiled modules run eagerly while inspected ({listed}), so "
            "that every module inside them is recorded; the values are those of the "
            "eager model. The compiled code comes back when the inspection stops.")


def compiled_later(owner: Borrowed, model: nn.Module, wrapper: nn.Module,
                   inspected: nn.Module | None, targets: dict[int, Target],
                   say: Callable[[str, str], None]) -> bool:
    """`torch.compile(model)` or `module.compile()` (then `wrapper` is the module) while
    `owner` holds an inspector of `inspected`: the wrapper runs the model eagerly, the module
    its eager call, until the owner gives it back. True if the wrapper was taken over."""
    if wrapper is model and id(model) in targets:  # module.compile(): in place
        owner.set_attr(model, "_compiled_call_impl", None, "compiled module runs eagerly")
        say("compiled", f"{type(model).__name__}.compile() while it is inspected: it "
            "runs eagerly while inspected, so that every module inside it is "
            "recorded. The compiled code comes back when the inspection stops.")
        return False
    if model is not inspected:
        return False
    _run_wrapper_eagerly(owner, model, wrapper)
    say("compiled", f"torch.compile({type(model).__name__}) while it is inspected: "
        "the compiled wrapper runs the model eagerly while inspected, so that every "
        "module inside it is recorded; the values are those of the eager model. "
        "The compiled code comes back when the inspection stops.")
    return True
