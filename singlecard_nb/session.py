"""The one place that ties the wings: a pin, the single-card mode that follows it, and status.

`singlecard_nb.pin()`, `%singlecard` and the device picker all pin through here, so pinning and
single-card mode always agree. The pin wing (`pinning/`) knows nothing of single-card mode, and
single-card mode (`parallel/`) is told its device rather than asking the pin; status hands the
report renderer what single-card mode says (remapped devices, open gloo listeners). Single-card
mode is imported only when first needed: `%load_ext` and `status()` stay free of torch.distributed.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any

from . import borrow, capacity
from .pinning import pinning, report
from .pinning.devices import Machine
from .pinning.pinning import PinState, TargetError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["pin", "release", "current", "device", "status", "single_card", "unwrap",
           "TargetError", "gpus", "card", "fit"]

_SINGLE_CARD = f"{__package__}.parallel.single_card"
_NATIVE = f"{__package__}.inspection.kernel.native"  # inspection's one-read statistics kernel

current = pinning.current
device = pinning.device

# The pin that asked for single-card mode (`pin(single_card=True)`), for status to say so; a pin
# is a new object each time, so a later pin (or none) is never mistaken for it.
_single_card_pin: PinState | None = None


def gpus() -> Machine:
    """The GPUs as this kernel sees them (`singlecard_nb.gpus()`): a table that marks the ones
    outside its allocation (the CUDA_VISIBLE_DEVICES it had before any pin)."""
    return pinning.machine_view()


def _parallel() -> Any:
    from .parallel import single_card as parallel

    return parallel


def pin(target: str | int, *, single_card: bool = True, world: int = 1,
        **options: Any) -> PinState:
    # pinning.pin(target, **options), then single-card mode on the pinned device; the help and
    # signature are pinning.pin's (set below)
    global _single_card_pin
    state = pinning.pin(target, **options)
    _single_card_pin = state if single_card else None
    committed = False
    try:
        if single_card:
            _parallel().enable(state.torch_device, world=world)  # switches device if it was on already
        elif _SINGLE_CARD in sys.modules:
            _parallel().disable()
        committed = True
    finally:
        if not committed:  # half a pin is worse than none
            release()
    return state


def _signature_with_single_card(signature: inspect.Signature) -> inspect.Signature:
    parameters = list(signature.parameters.values())
    single = inspect.Parameter("single_card", inspect.Parameter.KEYWORD_ONLY, default=True,
                               annotation="bool")
    world = inspect.Parameter("world", inspect.Parameter.KEYWORD_ONLY, default=1,
                              annotation="int")
    return signature.replace(parameters=[*parameters[:2], single, *parameters[2:], world])


# `scn.pin?` shows pinning.pin's parameters and help, with single_card among them: the options
# are said once, in pinning.pin, and reach it through **options.
pin.__signature__ = _signature_with_single_card(inspect.signature(pinning.pin))
pin.__doc__ = ((pinning.pin.__doc__ or "").rstrip() + "\n    single_card: run DataParallel/DDP code "
               "single-card on this device (default True).\n    world: N when this process is one "
               "of N ranks that share the device (a rank of `%singlecard cpu --ranks N`):\n"
               "        process groups are then the real world of N.\n")


def release() -> None:
    """Undo the pin: single-card mode off, torch defaults and environment variables restored."""
    global _single_card_pin
    _single_card_pin = None
    try:
        if _SINGLE_CARD in sys.modules:
            _parallel().disable()  # idempotent: also ends a `single-card on` without a pin
    finally:
        pinning.release()


def single_card(on: bool | None = None) -> bool:
    """Turn single-card mode on or off without unpinning; with no argument, just report it.

    on: True needs a pinned device (`%singlecard 1`, `singlecard_nb.pin(...)`); None only asks.
    Returns whether single-card mode is on.
    """
    if on is None:
        return _SINGLE_CARD in sys.modules and _parallel().enabled()
    if not on:
        if _SINGLE_CARD in sys.modules:
            _parallel().disable()
        return False
    parallel = _parallel()
    if not parallel.enabled():
        state = pinning.current()
        if state is None:
            raise ValueError(
                "single_card(True) needs a pinned device, and nothing is pinned. Pin first with "
                "`%singlecard 1` (a GPU index), `%singlecard auto` or `%singlecard cpu` "
                "(in code: `singlecard_nb.pin('cpu')`); pinning turns single-card mode on."
            )
        parallel.enable(state.torch_device)
    return True


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DDP / DeepSpeed engine wrappers (nested too), moved to
    the pinned device.

    Works for wrappers built before pinning; with nothing pinned the module stays where it is.
    """
    state = pinning.current()
    target: torch.device | None = None if state is None else state.torch_device
    return _parallel().unwrap(model, target)


def status() -> report.Status:
    """What is pinned, how, and what else singlecard_nb has active. Never starts CUDA."""
    # Single-card mode is only asked if loaded: importing it just to say "off" is waste.
    parallel = _parallel().report() if _SINGLE_CARD in sys.modules else None
    active = [(owner.name, list(dict.fromkeys(owner.describe())))  # a label once, however many
              for owner in borrow.active_owners()]
    # The same for inspection: its kernel is reported once inspection has met a CPU tensor.
    native = sys.modules.get(_NATIVE)
    statistics = native.status() if native is not None and native.started() else None
    state = pinning.current()
    return report.build_status(state, pinning.pinned_environ(), active=active,
                               parallel=parallel, statistics=statistics,
                               single_card=state is not None and state is _single_card_pin)


def card() -> capacity.Card | None:
    """The pinned card's memory, read now (NVML, or the described machine); the host's under a
    `cpu` pin; None when nothing is pinned."""
    state = pinning.current()
    if state is None:
        return None
    if state.gpu is None:
        return capacity.host_card()
    info, source = state.mig or state.gpu, "pin"
    try:  # free memory changes: read the machine again (cheap, and never starts CUDA)
        machine = pinning.machine_view()
        source = machine.source
        for gpu in machine.gpus:
            for found in (gpu, *gpu.mig):
                if found.uuid == info.uuid:
                    info = found
    except Exception:  # a machine file broken since the pin: what the pin read stands
        pass
    label = f"GPU {state.gpu.index} ({info.name})" if state.mig is None else (
        f"GPU {state.gpu.index} MIG {info.name}")
    return capacity.Card(label, str(state.torch_device), info.memory_total, info.memory_free,
                         source)


capacity.provide(card)  # inspection and diagnosis ask the ground floor, never this module


def fit(model: nn.Module, batch: Any, optimizer: Any = None, loss_fn: Any = None,
        device: Any = None) -> Any:
    """Plan one training step of `model` on `batch` without running it for real: the predicted
    peak by kind and by module, the largest batch that fits the pinned card's free memory, and
    what to change (`sizing/fit.py`). Nothing of the real model or optimizer changes.

    batch: what the model is called with: a tensor, a tuple (positional) or a dict (keywords).
    loss_fn: output -> loss (default: a scalar output, `.loss`, or the sum of the outputs).
    device: whose memory to fit in (default: the pinned card; else the model's device).
    """
    from .sizing.fit import check
    from .sizing.fit import fit as plan_fit

    check(model, optimizer)  # before the card is read from the model
    return plan_fit(model, batch, optimizer=optimizer, loss_fn=loss_fn,
                    card=_card_for(model, device))


def _card_for(model: nn.Module, device: Any) -> capacity.Card | None:
    import torch

    pinned = card()
    if device is None:
        if pinned is not None:
            return pinned
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cpu":
        return capacity.host_card()
    if pinned is not None and pinned.device.split(":")[0] == device.type:
        return pinned
    if device.type == "cuda" and torch.cuda.is_initialized():  # asked for it: CUDA runs already
        free, total = torch.cuda.mem_get_info(device)
        return capacity.Card(str(device), str(device), total, free, "torch")
    return None
