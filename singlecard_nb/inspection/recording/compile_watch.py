"""`torch.compile(model)` of a model that is inspected, or looked for, tells whoever listens.

nanoGPT's order, `model = torch.compile(model)` after the model exists (and after `inspect()`),
hands the code a wrapper the inspector never saw: its compiled code bypasses module hooks and
nothing is recorded. While anyone listens (an active inspector, `inspect_all`), `torch.compile`
and `nn.Module.compile` are wrapped: each listener is told (module, wrapper) — the wrapper is the
module itself for `module.compile()` — and makes it run eagerly under its own owner (so
`stop()` gives the compiled code back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...borrow import Borrowed, Listeners, wrap_like

Listener = Callable[[nn.Module, nn.Module], None]


class _CompileListeners(Listeners):
    """The one patch of `torch.compile`, held while at least one listener is registered."""

    name = "inspect: torch.compile of inspected models"

    def install(self, owner: Borrowed) -> None:
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

    def listening(self) -> bool:
        return bool(self.listeners)

    def _tell(self, args: tuple, kwargs: dict, result: Any) -> None:
        model = args[0] if args else kwargs.get("model")
        if isinstance(model, nn.Module) and isinstance(result, nn.Module):
            for listener in self.listeners:  # a tuple: replaced, never changed, while we loop
                listener(model, result)


compile_listeners = _CompileListeners()
