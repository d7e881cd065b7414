"""Rules on what the tensors are: NaN/Inf the trap found, the device they are on, their type.

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...dtype_limits import EXPLODED, LARGEST_HALF
from ...dtypes import dtype_name
from ..failure import Failure, counts, search


def _finite_absmax(t: torch.Tensor) -> float:
    values = t.detach()
    values = values[torch.isfinite(values)]
    return float(values.abs().max()) if values.numel() else float("nan")


def _non_finite_count(t: torch.Tensor) -> str | None:
    if not t.is_floating_point() or t.numel() == 0:
        return None
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return counts(nan, inf) if nan or inf else None


def non_finite(f: Failure) -> str | None:
    err = f.non_finite
    if err is None:
        return None
    what = f"{err.io}{err.index}"
    for index, t in f.tensors():
        count = _non_finite_count(t)
        if count:
            return (f"{f.label} received {count} in its input {index}: the NaN/Inf was made before "
                    "this module, by the code that computed that input (the forward that calls "
                    "it, or the data)")
    for name, t in f.own_tensors():
        count = _non_finite_count(t)
        if count:
            cause = getattr(err, "cause", None)
            return (f"{f.label} has {count} in its own {name}, so its {what} does too: the "
                    "parameters were corrupted before this step (a NaN/Inf gradient, a learning "
                    "rate too high, or a bad checkpoint)" + (f"; {cause}" if cause else ""))
    floats = [t for _, t in f.tensors() if t.is_floating_point()]
    absmax = max((_finite_absmax(t) for t in floats), default=float("nan"))
    size = f" (absmax {absmax:.3g})" if math.isfinite(absmax) else ""
    half = getattr(err, "dtype", None)
    if half not in LARGEST_HALF:
        half = next((dtype_name(t.dtype) for t in floats if dtype_name(t.dtype) in LARGEST_HALF), None)
    if err.inf and half is not None:
        return (f"{half} overflow: {f.label} computes in {half}, whose largest value is "
                f"{LARGEST_HALF[half]}: its finite inputs{size} overflowed to "
                f"{counts(err.nan, err.inf)} in its {what}; compute this layer in float32 (under "
                "autocast: outside it, or with a GradScaler only for the backward), or scale its "
                "inputs down")
    if floats and math.isfinite(absmax) and \
            absmax >= EXPLODED.get(dtype_name(floats[0].dtype), math.inf):
        return (f"{f.label} received finite inputs of absmax {absmax:.3g}, beyond what its "
                f"products can hold in {dtype_name(floats[0].dtype)} (largest "
                f"{torch.finfo(floats[0].dtype).max:.3g}), and turned them into "
                f"{counts(err.nan, err.inf)} in its {what}: the values had already exploded "
                "before this module; find where they began to grow (the inspector's findings "
                "lead with it; params=True shows weights that grew)")
    return (f"{f.label} turned finite inputs{size} and finite parameters into "
            f"{counts(err.nan, err.inf)} in its {what}: an operation in its forward produced "
            "them (log or sqrt of a negative number or zero, a division by zero, exp overflow)")


def device_side_assert(f: Failure) -> str | None:
    if "device-side assert" not in f.message:
        return None
    if isinstance(f.module, nn.Embedding):
        start = (f"On the GPU an index outside 0..{f.module.num_embeddings - 1} in {f.label} "
                 "shows up as this device-side assert: check the ids against num_embeddings")
    else:
        start = (f"CUDA reports a device-side assert asynchronously, so the failing kernel may "
                 f"have run before {f.label} (an index outside an Embedding, a class index ≥ "
                 "the number of classes in a loss): rerun with CUDA_LAUNCH_BLOCKING=1 or on the CPU "
                 "to find it")
    return start + "; the CUDA context is unusable now, so restart the kernel"

_DEVICE_MESSAGE = (r"same device|is not on the expected device|at the same device|"
                   r"weight type \(torch\.cuda|Input type \(torch\.cuda|device type")


def device_mismatch(f: Failure) -> str | None:
    if not search(_DEVICE_MESSAGE, f):
        return None
    param_devices = sorted({str(t.device) for _, t in f.own_tensors()})
    inputs = [(i, str(t.device)) for i, t in f.tensors()]
    if len(param_devices) == 1:
        device = param_devices[0]
        stray = [(i, d) for i, d in inputs if d != device]
        if stray:
            index, other = stray[0]
            if device == "meta":
                return (f"{f.label} has its parameters on the meta device (shapes without data): "
                        "the model was built on 'meta' or loaded lazily and never materialised; "
                        "use model.to_empty(device=...) and then load its weights")
            if not f.registered:
                name = f.path.rpartition(".")[2]
                return (f"{f.label} has its parameters on {device} while its input {index} is on "
                        f"{other}: '{name}' is a plain attribute, list or dict of its caller, not "
                        "a registered submodule, so model.to(...) did not move it (and optimizers "
                        "do not see it); hold it in nn.ModuleList or nn.ModuleDict")
            return (f"{f.label} has its parameters on {device}; its input {index} is on {other}: "
                    f"move the input with .to('{device}') (or the model to {other})")
    if len(param_devices) > 1:
        return f"{f.label} has its own parameters on several devices ({', '.join(param_devices)})"
    if len({d for _, d in inputs}) > 1:
        listed = ", ".join(f"{i} on {d}" for i, d in inputs)
        return f"{f.label} got inputs on different devices ({listed}): move them to one"
    if inputs:
        return (f"{f.label} has its inputs and parameters all on {inputs[0][1]}, so a tensor made "
                f"inside its forward is elsewhere: {f.code()} mixes devices; create tensors with "
                "device=x.device (torch.zeros, torch.arange, torch.tensor default to the CPU)")
    return None


def not_a_tensor(f: Failure) -> str | None:
    match = search(r"must be Tensor, not ([\w.]+)", f)
    if not match:
        return None
    kind = match[1]
    fix = ("convert with torch.from_numpy(a) (and .float(): numpy floats are float64)"
           if "numpy" in kind else "convert with torch.as_tensor(...)")
    return f"{f.label} was given a {kind} where it needs a torch.Tensor: {fix}"

_DTYPE_MESSAGE = r"dtype|scalar type|Input type|type \("


def dtype_mismatch(f: Failure) -> str | None:
    if not search(_DTYPE_MESSAGE, f):
        return None
    params = [t for _, t in f.own_tensors() if t.is_floating_point()]
    inputs = f.tensors()
    if params:
        expected = params[0].dtype
        stray = [(i, t) for i, t in inputs if t.dtype != expected]
        if stray:
            index, t = stray[0]
            if not f.registered:
                return _unregistered_dtype(f, params[0].dtype, index, t.dtype)
            if t.dtype == torch.float64:
                fix = "numpy arrays are float64 by default: use x.float() (torch.from_numpy(a).float())"
            elif t.dtype in (torch.float16, torch.bfloat16):
                fix = (f"convert one side (x.float(), or model.to({expected})) or run both under "
                       "torch.autocast")
            elif not t.is_floating_point():
                fix = "integer data: convert it with x.float()"
            else:
                fix = f"convert it with x.to({expected})"
            return (f"{f.label} has {dtype_name(params[0].dtype)} parameters; its input {index} is "
                    f"{dtype_name(t.dtype)}: {fix}")
    floats = sorted({dtype_name(t.dtype) for _, t in inputs if t.is_floating_point()})
    if len(floats) > 1:
        return f"{f.label} got inputs of different dtypes ({', '.join(floats)}): convert them to one"
    return None


_CONVERSIONS = {torch.float64: ".double()", torch.float16: ".half()",
                torch.bfloat16: ".to(torch.bfloat16)", torch.float32: ".float()"}


def _unregistered_dtype(f: Failure, own: torch.dtype, index: str, given: torch.dtype) -> str:
    """A layer a plain list or dict holds: model.double() (.half(), .to(dtype)) never saw it."""
    name = f.path.rpartition(".")[2]
    holder, _, key = name.partition("[")
    kind = "dict" if key[:1] in "'\"" and key else "list"
    parent = type(f.callers[-2][1]).__name__ if len(f.callers) > 1 else "its caller"
    conversion = _CONVERSIONS.get(given, f".to({given})")
    return (f"{f.label} has {dtype_name(own)} parameters; its input {index} is "
            f"{dtype_name(given)}: '{holder}' is a plain Python {kind} of {parent}, not a "
            f"registered submodule, so model{conversion} converted the rest of the model but not "
            f"{name} (nor does .to() move it, or the optimizer see it); hold the layers in "
            "nn.ModuleList (or nn.ModuleDict)")
