"""Rules on a loss's input and target: class indices, their dtype, shape and range; binary targets.

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import torch
from torch import nn

from ...dtypes import dtype_name
from ..failure import Failure, ints, search, shape_text

_CLASS_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
_BINARY_LOSSES = (nn.BCELoss, nn.BCEWithLogitsLoss)


def _loss_tensors(f: Failure) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return f.tensor(0, "input"), f.tensor(1, "target")


def class_target_dtype(f: Failure) -> str | None:
    match = search(r"expected target dtype to be Long or Byte, but got (\w+)|expected scalar "
                   r"type Long but found (\w+)", f)
    x, y = _loss_tensors(f)
    if not match or not isinstance(f.module, _CLASS_LOSSES) or x is None or y is None:
        return None
    return (f"{f.label} wants class indices as an int64 target, one per row of its input "
            f"{shape_text(x.shape)}; the target is {dtype_name(y.dtype)} {shape_text(y.shape)}: use "
            "target.long()")


def class_target_shape(f: Failure) -> str | None:
    x, y = _loss_tensors(f)
    if not isinstance(f.module, _CLASS_LOSSES) or x is None or y is None:
        return None
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    if search(r"0D or 1D target tensor expected, multi-target not supported", f):
        text = (f"{f.label} wants one class index per row, a target of shape ({x.shape[0]},) for "
                f"its input {shape_text(x.shape)}; the target is {shape_text(y.shape)}")
        if y.dim() == 2 and y.shape[1] == 1:
            return text + ": use target.squeeze(1)"
        if tuple(y.shape) == tuple(x.shape):
            return text + ": it looks one-hot, use target.argmax(1)"
        return text
    if search(r"Expected floating point type for target with class probabilities", f):
        return (f"{f.label} reads a target shaped like its input {shape_text(x.shape)} as class "
                f"probabilities, which must be floating point; the target is {dtype_name(y.dtype)}: if it "
                "is one-hot, pass class indices with target.argmax(1) (or target.float() for "
                "probabilities)")
    match = search(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)", f)
    if match:
        text = (f"{f.label} got {match[1]} rows of scores (input {shape_text(x.shape)}) but "
                f"{match[2]} targets (target {shape_text(y.shape)})")
        if y.dim() > 1 and y.numel() == int(match[1]):
            return text + ": flatten the target too, target.reshape(-1)"
        rows, targets = int(match[1]), int(match[2])
        if rows > targets and rows % targets == 0:
            text += _folded_batch(f, rows // targets, x)
        return text
    match = search(r"Expected target size \[([\d, ]+)\], got \[([\d, ]+)\]", f)
    if match:
        text = (f"{f.label} reads its input {shape_text(x.shape)} as (batch, classes={classes}, "
                f"...), so it expects a target {shape_text(ints(match[1]))}; the target is "
                f"{shape_text(y.shape)}")
        if tuple(y.shape) == tuple(x.shape[:-1]):
            last = x.shape[-1]
            text += (f": for (batch, sequence, classes) scores put the classes in dimension 1 "
                     f"with input.transpose(1, 2), or flatten both: input.reshape(-1, {last}), "
                     "target.reshape(-1)")
        return text
    match = search(r"Target (-?\d+) is out of bounds", f)
    if match:
        value = int(match[1])
        if value < 0:
            return (f"{f.label} got the negative class index {value} in its target: only "
                    f"ignore_index={getattr(f.module, 'ignore_index', -100)} is skipped; replace "
                    "other negative labels")
        return (f"{f.label} got scores for {classes} classes (indices 0..{classes - 1}); the "
                f"target holds {value} (targets range {int(y.min())}..{int(y.max())}): the "
                "labels may be 1-based, or the output layer has too few classes")
    return None


def class_target_out_of_bounds(f: Failure) -> str | None:
    """The same error from a functional loss inside a model's forward (no loss module)."""
    match = search(r"Target (-?\d+) is out of bounds", f)
    if not match or isinstance(f.module, _CLASS_LOSSES):
        return None
    return (f"A loss in the forward of {f.label}, {f.code()}, got the class index {match[1]} in "
            "its target, outside the classes of its scores: check the labels against the "
            "number of outputs (num_labels)")


def binary_target(f: Failure) -> str | None:
    x, y = _loss_tensors(f)
    if not isinstance(f.module, _BINARY_LOSSES) or x is None or y is None:
        return None
    if search(r"(?:Using a target size|Target size) \(torch\.Size", f):
        text = (f"{f.label} needs a target shaped like its input {shape_text(x.shape)}; the "
                f"target is {shape_text(y.shape)}")
        if tuple(x.shape) == (*y.shape, 1):
            return text + ": use input.squeeze(-1) (or target.unsqueeze(-1))"
        if tuple(y.shape) == (*x.shape, 1):
            return text + ": use target.squeeze(-1)"
        return text
    if search(r"can't be cast to the desired output type|Found dtype \w+ but expected \w+", f):
        if not y.is_floating_point():
            return (f"{f.label} needs a floating-point target (0. and 1.); the target is "
                    f"{dtype_name(y.dtype)}: use target.float()")
        return (f"{f.label} needs the target in its input's dtype {dtype_name(x.dtype)}; the target is "
                f"{dtype_name(y.dtype)}: use target.to(input.dtype)")
    match = search(r"all elements of (input|target) should be between 0 and 1", f)
    if match:
        t = x if match[1] == "input" else y
        low, high = float(t.min()), float(t.max())
        if match[1] == "input":
            return (f"{f.label} expects probabilities in [0, 1]; its input ranges from {low:.3g} "
                    f"to {high:.3g}: these look like logits, use BCEWithLogitsLoss (or apply "
                    "torch.sigmoid first)")
        return (f"{f.label} expects targets in [0, 1]; the target ranges from {low:.3g} to "
                f"{high:.3g}")
    return None


_BATCH_AS_MINUS_ONE = r"\.(?:view|reshape)\(\s*-1\s*,|reshape\([^,]+,\s*[(\[]\s*-1\s*,"


def _folded_batch(f: Failure, factor: int, x: torch.Tensor) -> str:
    """What to say when the scores have `factor` rows per target: a `view(-1, N)` (or reshape)
    that folded each sample's features into the batch."""
    rows = int(x.shape[0])
    text = (f": {rows} is {factor} × {rows // factor}, as when a reshape with -1 in the batch "
            "position folds each sample's features into the batch")
    lines = f.forward_lines(_BATCH_AS_MINUS_ONE)
    if lines:
        text += f"; `{lines[0][1]}` in the forward of {lines[0][0]} does that"
    return (text + "; keep the batch dimension with x.view(x.size(0), -1) (or "
            "x.flatten(1)) and size the Linear after it for the features of one sample")
