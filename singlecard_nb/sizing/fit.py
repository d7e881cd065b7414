"""`scn.fit(model, batch, optimizer=opt)`: the peak of one training step, before running it.

The step runs on fake tensors (`step.py`) for the batch given and for twice its size; the two
peaks fix a line (fixed bytes + bytes per sample) that predicts other batch sizes. A third run
under bf16 autocast says what mixed precision would save. The card is handed in by `session`.
"""

from __future__ import annotations

import inspect as pyinspect
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from ..capacity import Card
from ..job import launched_world_size
from .plan import Plan, Run
from .step import FakeStep, reads_values

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def _as_call(batch: Any) -> tuple[tuple, dict]:
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def check_inputs(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """A TypeError naming what `model.forward` needs that the batch does not give."""
    try:
        signature = pyinspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        missing = [name for name, p in signature.parameters.items()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                          p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and name not in kwargs][len(args):]
        what = (f"needs {', '.join(repr(m) for m in missing)}, which the batch does not give"
                if missing else f"cannot be called with this batch ({e})")
        raise TypeError(
            f"scn.fit: {type(model).__name__}.forward{signature} {what}. The batch is what the "
            "model is called with: a tensor, a tuple of positional inputs, or a dict of keyword "
            "inputs, e.g. batch=(x, mask) or batch={'x': x, 'mask': mask}. Nothing was run."
        ) from None


def batch_size(args: tuple, kwargs: dict) -> int:
    """The batch size: the most common first dimension of the batch's tensors."""
    sizes = Counter(t.shape[0] for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor) and t.dim() > 0)
    if not sizes:
        raise ValueError("scn.fit: the batch holds no tensor with a batch dimension; pass what "
                         "the model is called with (a tensor, a tuple or a dict of tensors).")
    return sizes.most_common(1)[0][0]


def _scaled(args: tuple, kwargs: dict, size: int, new: int) -> Callable[[], tuple]:
    """A maker of fake inputs shaped like the batch with `new` samples (made under the fake
    mode, at each call: every step gets its own)."""

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = (new, *t.shape[1:]) if t.dim() and t.shape[0] == size else tuple(t.shape)
        return torch.empty(shape, dtype=t.dtype, device=t.device).requires_grad_(t.requires_grad)

    return lambda: tree_map(one, (args, kwargs))


def default_loss(output: Any) -> torch.Tensor:
    """A scalar output; else its `.loss` / ["loss"]; else the sum of its floating tensors."""
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, Mapping):  # a ModelOutput or dict: its values
        output = list(output.values())
    parts = [t.float().sum() for t in tree_leaves(output)
             if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
    if not parts:
        raise ValueError("scn.fit: the model's output holds no floating tensor that needs a "
                         "gradient, so there is no backward to plan; pass loss_fn=output->loss.")
    return torch.stack(parts).sum()


def _measure(step: FakeStep, model, args, kwargs, size, new, autocast=None) -> Run:
    try:
        ledger, by_kind, by_module = step.measure(_scaled(args, kwargs, size, new), autocast)
    except RuntimeError as e:
        if str(e).startswith("scn.fit"):
            raise
        said = f"{type(e).__name__}: {str(e).splitlines()[0].rstrip('.') if str(e) else ''}"
        if reads_values(e):
            raise RuntimeError(
                f"scn.fit could not run {type(model).__name__}'s step on fake tensors at batch "
                f"size {new} ({said}). Code that reads values (.item(), nonzero, boolean masks) "
                "cannot run without data.") from e
        raise RuntimeError(_failed(model, step.failed_in, step.failed_inputs, new, said)) from e
    return Run(new, ledger.peak, by_kind, by_module)


def _failed(model: nn.Module, path: str | None, inputs: list[tuple], size: int,
            said: str) -> str:
    """fit's one line for a step that fails on its own: the module, its inputs' shapes, and
    torch's words."""
    where = ""
    if path is not None:
        shapes = ", ".join("(" + ", ".join(map(str, s)) + ")" for s in inputs)
        where = (f" in {path or '(the model itself)'!r} "
                 f"({_one_line(model.get_submodule(path)) if path else type(model).__name__})"
                 + (f" called with {shapes}" if shapes else ""))
    return (f"scn.fit: {type(model).__name__}'s step fails{where} at batch size {size}: {said}. "
            "The real step fails the same way: fix the shapes, then plan again (run it once and "
            "`scn.explain()` names the call and its inputs).")


def _one_line(module: nn.Module) -> str:
    text = repr(module).splitlines()
    return text[0] if len(text) == 1 else f"{type(module).__name__}(...)"


def check(model: Any, optimizer: Any) -> None:
    """What fit can plan: a module, and an optimizer whose step runs once per step."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"scn.fit needs an nn.Module, got {type(model).__name__}: pass the "
                        "model whose training step to plan")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"scn.fit: optimizer must be a torch.optim.Optimizer or None, got "
                        f"{type(optimizer).__name__}")
    if optimizer is not None and _needs_closure(optimizer):
        raise ValueError(
            f"scn.fit: {type(optimizer).__name__}.step(closure) runs the model again inside the "
            "step, which fit does not plan; pass optimizer=None to plan forward and backward "
            "(the optimizer's state comes on top).")


def _needs_closure(optimizer: Any) -> bool:
    try:
        closure = pyinspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is closure.empty


def fit(model: nn.Module, batch: Any, *, optimizer: Any = None, loss_fn: Any = None,
        card: Card | None = None) -> Plan:
    """The Plan of one training step of `model` on `batch` (see `session.fit`)."""
    check(model, optimizer)
    world, inner = launched_world_size(), model
    if isinstance(model, _WRAPPERS):  # the step runs the module inside; the batch stays global
        inner = model.module
        if isinstance(model, nn.DataParallel):
            world = 1
    args, kwargs = _as_call(batch)
    check_inputs(inner, args, kwargs)
    size = batch_size(args, kwargs)
    if size == 0:
        raise ValueError("scn.fit: the batch holds 0 samples (its first dimension is 0); pass "
                         "one batch of the size you train with, e.g. next(iter(loader)).")
    loss_fn = loss_fn or default_loss
    step = FakeStep(inner, optimizer, loss_fn)

    runs = [_measure(step, inner, args, kwargs, size, size)]
    notes = []
    try:
        runs.append(_measure(step, inner, args, kwargs, size, 2 * size))
    except RuntimeError as e:
        notes.append(f"at batch size {2 * size} the step did not run ({e}); other sizes are "
                     "scaled from the activations of this one")
    bf16 = None
    if next(inner.parameters(), torch.empty(0)).is_floating_point():
        try:
            bf16 = _measure(step, inner, args, kwargs, size, size, torch.bfloat16)
        except RuntimeError:
            notes.append("the step did not run under bf16 autocast on fake tensors; its saving "
                         "is estimated (activations halved)")
    resident = _resident(model, optimizer, card)
    return Plan(type(model).__name__, runs, bf16, card, resident, size * world, world, notes,
                _blocks(inner))


def _resident(model: nn.Module, optimizer: Any, card: Card | None) -> int:
    """Bytes of the real model and optimizer already on the card's device: the real step
    reuses them, and the card's free memory no longer counts them."""
    if card is None:
        return 0
    kind = card.device.split(":")[0]
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values()
                    if isinstance(v, torch.Tensor)]
    seen, total = set(), 0
    for t in tensors:
        if t.device.type == kind and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _blocks(model: nn.Module) -> list[str]:
    """Module paths worth checkpointing: the items of the longest ModuleList / Sequential (a
    model's repeated blocks), else the model's children."""
    best: list[str] = []
    for path, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > len(best):
            best = [f"{path}.{name}" if path else name for name, _ in module.named_children()]
    return best or [name for name, _ in model.named_children()]
