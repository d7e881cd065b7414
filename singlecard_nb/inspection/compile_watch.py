"""`torch.compile(model)` of a model that is inspected, or looked for, tells whoever listens.

nanoGPT's order, `model = torch.compile(model)` after the model exists (and after `inspect()`),
hands the code a wrapper the inspector never saw: its compiled code bypasses module hooks and
nothing is recorded. While anyone listens (an active inspector, `inspect_all`), `torch.compile`
and `nn.Module.compile` are wrapped: each listener is told (module, wrapper) — the wrapper is the
module itself for `module.compile()` — and makes it run eagerly under its own owner (so
`stop()` gives the compiled code back).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..borrow import Borrowed, wrap_like

Listener = Callable[[nn.Module, nn.Module], None]


class _CompileListeners:
    """The one patch of `torch.compile`, held while at least one listener is registered."""

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._owner: Borrowed | None = None
        self._lock = threading.Lock()

    def add(self, listener: Listener) -> None:
        with self._lock:
            if self._owner is None or not self._owner.active:
                owner = Borrowed("inspect: torch.compile of inspected models")
                original = torch.compile

                def compile(*args: Any, **kwargs: Any) -> Any:
                    result = original(*args, **kwargs)
                    self._tell(args, kwargs, result)
                    return result

                owner.set_attr(torch, "compile", wrap_like(original, compile),
                               "torch.compile tells inspection of the wrappers it makes")
                in_place = nn.Module.compile

                def compile_module(module: nn.Module, *args: Any, **kwargs: Any) -> None:
                    in_place(module, *args, **kwargs)
                    self._tell((module,), {}, module)

                owner.set_attr(nn.Module, "compile", wrap_like(in_place, compile_module),
                               "module.compile() tells inspection of the module it compiles")
                self._owner = owner
            self._listeners = (*self._listeners, listener)

    def discard(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = tuple(fn for fn in self._listeners if fn is not listener)
            if not self._listeners and self._owner is not None:
                owner, self._owner = self._owner, None
                owner.restore()

    def listening(self) -> bool:
        return bool(self._listeners)

    def _tell(self, args: tuple, kwargs: dict, result: Any) -> None:
        model = args[0] if args else kwargs.get("model")
        if isinstance(model, nn.Module) and isinstance(result, nn.Module):
            for listener in self._listeners:  # a tuple: replaced, never changed, while we loop
                listener(model, result)


compile_listeners = _CompileListeners()
