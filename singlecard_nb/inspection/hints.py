"""One plain sentence on why a module's forward failed, from the error, the module and its inputs.

Each rule reads a `Failure` (the exception, the module, the arguments it was called with, the
failing line of code) and returns a sentence or None; the first sentence wins. Rules read torch's
own messages and check them against the facts (shapes, dtypes, devices, the module's settings),
so a hint says what was expected, what came instead, and what to do. A rule that breaks is
warned about once and skipped: a hint is never worth hiding the explanation.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.instancenorm import _InstanceNorm


@dataclasses.dataclass
class Failure:
    """What a rule may look at. Alive only while the hint is made: it holds the live tensors."""

    exception: BaseException
    module: nn.Module
    path: str
    label: str  # "Linear 'head.fc'"
    args: tuple
    kwargs: dict
    inputs: list[tuple[str, Any]]  # (index, tensor or numpy array), flattened
    source: str | None = None  # the deepest line of user code, e.g. "y = x.view(B, T, C)"
    location: str | None = None  # "model.py:42 in forward"
    registered: bool = True  # False: held in a plain list/dict, not a submodule of its caller
    non_finite: Any = None  # the NonFiniteError, when the trap raised it
    traced: bool = False  # torch.compile was tracing: nothing ran, no inputs on the stack

    @property
    def message(self) -> str:
        return str(self.exception)

    def arg(self, position: int, name: str) -> Any:
        """The argument at `position`, or passed as `name=`."""
        return self.args[position] if len(self.args) > position else self.kwargs.get(name)

    def tensor(self, position: int = 0, name: str = "input") -> torch.Tensor | None:
        value = self.arg(position, name)
        return value if isinstance(value, torch.Tensor) else None

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(i, t) for i, t in self.inputs if isinstance(t, torch.Tensor)]

    def own_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Its own parameters and buffers (a container with none: those of its submodules)."""
        own = [*self.module.named_parameters(recurse=False),
               *self.module.named_buffers(recurse=False)]
        return own or [*self.module.named_parameters(), *self.module.named_buffers()]

    def code(self) -> str:
        """The failing line, quoted, for sentences that point at it."""
        if self.source and self.location:
            return f"`{self.source}` ({self.location})"
        return f"`{self.source}`" if self.source else "a line"


Rule = Callable[[Failure], "str | None"]
_RULES: list[Rule] = []
_warned: set[str] = set()


def _rule(fn: Rule) -> Rule:
    _RULES.append(fn)
    return fn


def diagnose(failure: Failure) -> str | None:
    """The first rule's sentence, or None when no rule fits."""
    for rule in _RULES:
        try:
            text = rule(failure)
        except Exception as e:  # a broken rule costs its hint, never the explanation
            if rule.__name__ not in _warned:
                _warned.add(rule.__name__)
                warnings.warn(f"singlecard_nb.explain: the hint rule {rule.__name__} failed "
                              f"({type(e).__name__}: {e}); explanations are shown without it.",
                              stacklevel=2)
            continue
        if text:
            return text
    return None


# --- formatting ----------------------------------------------------------------------------


def shape_text(shape: Any) -> str:
    if shape is None:
        return "(shape unknown)"
    return str(tuple(int(s) for s in shape))


def _ints(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"-?\d+", text)]


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _search(pattern: str, failure: Failure) -> re.Match | None:
    return re.search(pattern, failure.message)


def counts(nan: int, inf: int) -> str:
    parts = [f"{nan} NaN"] * bool(nan) + [f"{inf} Inf"] * bool(inf)
    return " and ".join(parts) or "NaN/Inf"


def _finite_absmax(t: torch.Tensor) -> float:
    values = t.detach()
    values = values[torch.isfinite(values)]
    return float(values.abs().max()) if values.numel() else float("nan")


def _non_finite_count(t: torch.Tensor) -> str | None:
    if not t.is_floating_point() or t.numel() == 0:
        return None
    nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return counts(nan, inf) if nan or inf else None


_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}
_CHANNELS_FIRST = {1: "x.transpose(1, 2)", 2: "x.permute(0, 3, 1, 2)", 3: "x.permute(0, 4, 1, 2, 3)"}


def _moved_dimension(shape: tuple, size: int, skip: int) -> int | None:
    """A dimension other than `skip` (counted from the end: -1 = last) that has `size`."""
    for d, s in enumerate(shape):
        if s == size and d != len(shape) + skip:
            return d
    return None


# --- the trap, devices, types --------------------------------------------------------------


@_rule
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
            return (f"{f.label} has {count} in its own {name}, so its {what} does too: the "
                    "parameters were corrupted before this step (a NaN/Inf gradient, a learning "
                    "rate too high, or a bad checkpoint)")
    floats = [t for _, t in f.tensors() if t.is_floating_point()]
    absmax = max((_finite_absmax(t) for t in floats), default=float("nan"))
    size = f" (absmax {absmax:.3g})" if math.isfinite(absmax) else ""
    if err.inf and any(t.dtype == torch.float16 for t in floats):
        return (f"{f.label} computes in float16, whose largest value is 65504: its finite "
                f"inputs{size} overflowed to {counts(err.nan, err.inf)} in its {what}; compute "
                "this layer in float32 or bfloat16, or scale its inputs down")
    return (f"{f.label} turned finite inputs{size} and finite parameters into "
            f"{counts(err.nan, err.inf)} in its {what}: an operation in its forward produced "
            "them (log or sqrt of a negative number or zero, a division by zero, exp overflow)")


@_rule
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


@_rule
def device_mismatch(f: Failure) -> str | None:
    if not _search(_DEVICE_MESSAGE, f):
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


@_rule
def not_a_tensor(f: Failure) -> str | None:
    match = _search(r"must be Tensor, not ([\w.]+)", f)
    if not match:
        return None
    kind = match[1]
    fix = ("convert with torch.from_numpy(a) (and .float(): numpy floats are float64)"
           if "numpy" in kind else "convert with torch.as_tensor(...)")
    return f"{f.label} was given a {kind} where it needs a torch.Tensor: {fix}"


# --- layers: Linear, convolutions, normalisation, embeddings -------------------------------


@_rule
def linear_features(f: Failure) -> str | None:
    match = (_search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", f)
             # the same product under torch.compile's tracing (fake tensors, meta kernels)
             or _search(r"a and b must have same reduction dim, but got \[(\d+), (\d+)\] X "
                        r"\[(\d+), (\d+)\]", f))
    if not match:
        return None
    expected = getattr(f.module, "in_features", None)
    x = f.tensor(0, "input")
    if isinstance(expected, int) and x is None and f.traced and int(match[3]) == expected:
        return (f"{f.label} expects the last dimension of its input to be {expected} "
                f"(in_features); it got {match[2]}")
    if not isinstance(expected, int) or x is None or x.dim() == 0:
        return (f"A matrix product in the forward of {f.label}, {f.code()}, multiplies "
                f"({match[1]}x{match[2]}) by ({match[3]}x{match[4]}): the inner sizes "
                f"{match[2]} and {match[3]} must be equal")
    text = (f"{f.label} expects the last dimension of its input to be {expected} (in_features); "
            f"it got {x.shape[-1]}")
    moved = _moved_dimension(tuple(x.shape), expected, -1)
    if moved is not None:
        text += (f": dimension {moved} of the input {shape_text(x.shape)} is {expected}, so the "
                 "features may be in the wrong dimension")
    return text


@_rule
def conv_channels(f: Failure) -> str | None:
    match = _search(r"expected input\[[\d, ]+\] to have (\d+) channels, but got (\d+) channels", f)
    x = f.tensor(0, "input")
    if not match or not isinstance(f.module, _ConvNd) or x is None:
        return None
    want, got = int(match[1]), int(match[2])
    dims = len(f.module.kernel_size)
    shape = tuple(x.shape)
    if x.dim() == dims + 1:  # read as one unbatched sample
        text = (f"{f.label} got a {x.dim()}-D input {shape_text(shape)}, which it reads as one "
                f"unbatched sample with {shape[0]} channels; it expects {want} "
                f"channel{'s' * (want != 1)} (in_channels)")
        if want == 1:
            text += (": for a batch of single-channel inputs add the channel dimension, "
                     "x.unsqueeze(1)")
        elif shape[-1] == want:
            order = ", ".join(str(d) for d in (dims, *range(dims)))
            text += f": it looks channels-last, use x.permute({order})"
        return text
    text = f"{f.label} expects {want} input channels (in_channels); it got {got} (input {shape_text(shape)})"
    if x.dim() == dims + 2 and shape[-1] == want and shape[1] != want:
        layout = "(batch, length, channels)" if dims == 1 else "channels-last"
        text += f": the input looks {layout}, move the channels to dimension 1 with {_CHANNELS_FIRST[dims]}"
    return text


@_rule
def conv_dimensions(f: Failure) -> str | None:
    match = _search(r"Expected (\d)D \(unbatched\) or (\d)D \(batched\) input to conv", f)
    x = f.tensor(0, "input")
    if not match or x is None:
        return None
    unbatched, batched = int(match[1]), int(match[2])
    spatial = _SPATIAL.get(batched - 2, "...")
    text = (f"{f.label} expects a {batched}-D batch (N, C, {spatial}) or one {unbatched}-D sample "
            f"(C, {spatial}); it got a {x.dim()}-D input {shape_text(x.shape)}")
    if x.dim() < unbatched:
        text += ": add the missing channel (and batch) dimensions, e.g. x[None, None] for one single-channel input"
    elif x.dim() > batched:
        text += f": it has {x.dim() - batched} dimension(s) too many"
    return text


@_rule
def input_too_small(f: Failure) -> str | None:
    if not _search(r"Output size is too small|Kernel size can't be greater than actual input size", f):
        return None
    x = f.tensor(0, "input")
    kernel = getattr(f.module, "kernel_size", None)
    shape = shape_text(x.shape) if x is not None else "input"
    return (f"{f.label} got an input {shape} spatially smaller than its kernel_size={kernel} "
            "(after padding): the layers before it shrank it too far; use larger inputs, fewer "
            "pooling or stride-2 layers, or padding")


_NORM_LAYOUT = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}


@_rule
def batch_norm_channels(f: Failure) -> str | None:
    match = _search(r"running_mean should contain (\d+) elements not (\d+)", f)
    x = f.tensor(0, "input")
    if not match or x is None:
        return None
    got, want = int(match[1]), int(match[2])
    shape = tuple(x.shape)
    text = (f"{f.label} expects {want} channels (num_features) in dimension 1 of its input; "
            f"it got {got} (input {shape_text(shape)})")
    if x.dim() >= 3 and shape[-1] == want:
        fix = "x.transpose(1, 2)" if x.dim() == 3 else _CHANNELS_FIRST.get(x.dim() - 2, "x.movedim(-1, 1)")
        text += f": the channels look last, move them to dimension 1 with {fix}"
    return text


@_rule
def norm_dimensions(f: Failure) -> str | None:
    match = _search(r"expected (\d)D(?: or (\d)D)? input \(got (\d)D input\)", f)
    x = f.tensor(0, "input")
    if not match or x is None or not isinstance(f.module, (_BatchNorm, _InstanceNorm)):
        return None
    wanted = [int(w) for w in (match[1], match[2]) if w]
    got = int(match[3])
    layouts = " or ".join(f"{w}-D {_NORM_LAYOUT.get(w, '')}".strip() for w in wanted)
    text = f"{f.label} expects a {layouts} input; it got {got}-D {shape_text(x.shape)}"
    if got == min(wanted) - 1:
        text += ": the batch dimension is probably missing (x.unsqueeze(0))"
    return text


@_rule
def batch_of_one(f: Failure) -> str | None:
    if not _search(r"Expected more than 1 value per channel when training", f):
        return None
    x = f.tensor(0, "input")
    shape = shape_text(x.shape) if x is not None else "a batch of 1"
    return (f"{f.label} is in training mode, where it needs more than one value per channel to "
            f"compute batch statistics; it got {shape}: use a batch of 2 or more, or call "
            "model.eval() to run a single sample")


@_rule
def group_norm(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if not isinstance(f.module, nn.GroupNorm) or x is None or x.dim() < 2:
        return None
    channels, groups = f.module.num_channels, f.module.num_groups
    if x.shape[1] != channels:
        return (f"{f.label} expects {channels} channels (num_channels) in dimension 1 of its "
                f"input; it got {x.shape[1]} (input {shape_text(x.shape)})")
    if x.shape[1] % groups:
        return (f"{f.label} splits {channels} channels into {groups} groups (num_groups), which "
                "does not divide them")
    return None


@_rule
def layer_norm(f: Failure) -> str | None:
    match = _search(r"Given normalized_shape=\[([\d, ]*)\], expected input with shape "
                    r"\[\*, [\d, ]*\], but got input of size\s*\[([\d, ]*)\]", f)
    if not match:
        return None
    normalized, shape = _ints(match[1]), _ints(match[2])
    tail = shape[-len(normalized):] if normalized else []
    return (f"{f.label} normalizes over the last {len(normalized)} dimension(s) {normalized} "
            f"(normalized_shape); the input {shape_text(shape)} ends in {tail}")


@_rule
def embedding_dtype(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if (not isinstance(f.module, nn.Embedding) or x is None
            or not _search(r"'indices' to have one of the following scalar types", f)):
        return None
    dim = f.module.embedding_dim
    if x.is_floating_point() and x.dim() and x.shape[-1] == dim:
        return (f"{f.label} looks up integer ids; it got {_dtype(x)} {shape_text(x.shape)}, "
                f"whose last dimension is already embedding_dim={dim}: these look like "
                "embeddings, pass them on without the lookup (Hugging Face models take "
                "inputs_embeds=)")
    return (f"{f.label} looks up integer ids (int64 or int32); it got {_dtype(x)} "
            f"{shape_text(x.shape)}: convert them with x.long()")


@_rule
def embedding_range(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if (not isinstance(f.module, nn.Embedding) or x is None or x.numel() == 0
            or not _search(r"index out of range", f)):
        return None
    rows = f.module.num_embeddings
    low, high = int(x.min()), int(x.max())
    text = f"{f.label} has {rows} rows (num_embeddings: ids 0..{rows - 1}); its input holds ids "
    length = x.shape[-1] if x.dim() else 0
    if high >= rows and high == length - 1 and torch.equal(
            x.reshape(-1, length)[0].cpu(), torch.arange(length)):
        return (text + f"0..{high}, positions: the sequence ({length}) is longer than the {rows} "
                f"positions it holds; crop the inputs to {rows} tokens (or build the model with "
                "more positions: max_position_embeddings, n_positions, block_size)")
    if high >= rows:
        text += f"up to {high}: is the tokenizer's or data's vocabulary larger than the model's?"
        return text
    return text + (f"down to {low}: negative ids (padding or ignore labels such as -100) must be "
                   "replaced before the lookup")


# --- losses --------------------------------------------------------------------------------

_CLASS_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss)
_BINARY_LOSSES = (nn.BCELoss, nn.BCEWithLogitsLoss)


def _loss_tensors(f: Failure) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return f.tensor(0, "input"), f.tensor(1, "target")


@_rule
def class_target_dtype(f: Failure) -> str | None:
    match = _search(r"expected target dtype to be Long or Byte, but got (\w+)|expected scalar "
                    r"type Long but found (\w+)", f)
    x, y = _loss_tensors(f)
    if not match or not isinstance(f.module, _CLASS_LOSSES) or x is None or y is None:
        return None
    return (f"{f.label} wants class indices as an int64 target, one per row of its input "
            f"{shape_text(x.shape)}; the target is {_dtype(y)} {shape_text(y.shape)}: use "
            "target.long()")


@_rule
def class_target_shape(f: Failure) -> str | None:
    x, y = _loss_tensors(f)
    if not isinstance(f.module, _CLASS_LOSSES) or x is None or y is None:
        return None
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    if _search(r"0D or 1D target tensor expected, multi-target not supported", f):
        text = (f"{f.label} wants one class index per row, a target of shape ({x.shape[0]},) for "
                f"its input {shape_text(x.shape)}; the target is {shape_text(y.shape)}")
        if y.dim() == 2 and y.shape[1] == 1:
            return text + ": use target.squeeze(1)"
        if tuple(y.shape) == tuple(x.shape):
            return text + ": it looks one-hot, use target.argmax(1)"
        return text
    if _search(r"Expected floating point type for target with class probabilities", f):
        return (f"{f.label} reads a target shaped like its input {shape_text(x.shape)} as class "
                f"probabilities, which must be floating point; the target is {_dtype(y)}: if it "
                "is one-hot, pass class indices with target.argmax(1) (or target.float() for "
                "probabilities)")
    match = _search(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)", f)
    if match:
        text = (f"{f.label} got {match[1]} rows of scores (input {shape_text(x.shape)}) but "
                f"{match[2]} targets (target {shape_text(y.shape)})")
        if y.dim() > 1 and y.numel() == int(match[1]):
            text += ": flatten the target too, target.reshape(-1)"
        return text
    match = _search(r"Expected target size \[([\d, ]+)\], got \[([\d, ]+)\]", f)
    if match:
        text = (f"{f.label} reads its input {shape_text(x.shape)} as (batch, classes={classes}, "
                f"...), so it expects a target {shape_text(_ints(match[1]))}; the target is "
                f"{shape_text(y.shape)}")
        if tuple(y.shape) == tuple(x.shape[:-1]):
            last = x.shape[-1]
            text += (f": for (batch, sequence, classes) scores put the classes in dimension 1 "
                     f"with input.transpose(1, 2), or flatten both: input.reshape(-1, {last}), "
                     "target.reshape(-1)")
        return text
    match = _search(r"Target (-?\d+) is out of bounds", f)
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


@_rule
def class_target_out_of_bounds(f: Failure) -> str | None:
    """The same error from a functional loss inside a model's forward (no loss module)."""
    match = _search(r"Target (-?\d+) is out of bounds", f)
    if not match or isinstance(f.module, _CLASS_LOSSES):
        return None
    return (f"A loss in the forward of {f.label}, {f.code()}, got the class index {match[1]} in "
            "its target, outside the classes of its scores: check the labels against the "
            "number of outputs (num_labels)")


@_rule
def binary_target(f: Failure) -> str | None:
    x, y = _loss_tensors(f)
    if not isinstance(f.module, _BINARY_LOSSES) or x is None or y is None:
        return None
    if _search(r"(?:Using a target size|Target size) \(torch\.Size", f):
        text = (f"{f.label} needs a target shaped like its input {shape_text(x.shape)}; the "
                f"target is {shape_text(y.shape)}")
        if tuple(x.shape) == (*y.shape, 1):
            return text + ": use input.squeeze(-1) (or target.unsqueeze(-1))"
        if tuple(y.shape) == (*x.shape, 1):
            return text + ": use target.squeeze(-1)"
        return text
    if _search(r"can't be cast to the desired output type|Found dtype \w+ but expected \w+", f):
        if not y.is_floating_point():
            return (f"{f.label} needs a floating-point target (0. and 1.); the target is "
                    f"{_dtype(y)}: use target.float()")
        return (f"{f.label} needs the target in its input's dtype {_dtype(x)}; the target is "
                f"{_dtype(y)}: use target.to(input.dtype)")
    match = _search(r"all elements of (input|target) should be between 0 and 1", f)
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


# --- sequences: RNN / LSTM / GRU, MultiheadAttention --------------------------------------


def _batch_first_sentence(f: Failure, batch_first: bool, shape: tuple, what: str, clue: str) -> str:
    """`clue`: what shows the other reading, e.g. ", but the hidden state has batch 8"."""
    if batch_first:
        read = f"(batch={shape[0]}, sequence={shape[1]}, ...)"
        fix = ("the data look sequence-first, so pass x.transpose(0, 1) (or build it with "
               "batch_first=False)")
    else:
        read = f"(sequence={shape[0]}, batch={shape[1]}, ...)"
        fix = (f"the data look batch-first, so build the {type(f.module).__name__} with "
               "batch_first=True (or pass x.transpose(0, 1))")
    return (f"{f.label} has batch_first={batch_first}, so it reads {what} {shape_text(shape)} as "
            f"{read}{clue}: {fix}")


@_rule
def rnn_input(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if not isinstance(f.module, nn.RNNBase) or x is None:
        return None
    batch_first = f.module.batch_first
    match = _search(r"input\.size\(-1\) must be equal to input_size\. Expected (\d+), got (\d+)", f)
    if match:
        want = int(match[1])
        text = (f"{f.label} expects {want} features in the last dimension of its input "
                f"(input_size); it got {match[2]} (input {shape_text(x.shape)})")
        moved = _moved_dimension(tuple(x.shape), want, -1)
        if moved is not None:
            text += f": dimension {moved} is {want}, so the features may be in the wrong dimension"
        return text
    match = _search(r"Expected hidden(?:\[\d\])? size \(([\d, ]+)\), got \[([\d, ]+)\]", f)
    if match:
        want, got = _ints(match[1]), _ints(match[2])
        if x.dim() == 3 and want[1] != got[1] and want[0] == got[0]:
            if got[1] == (x.shape[1] if batch_first else x.shape[0]):
                return _batch_first_sentence(f, batch_first, tuple(x.shape), "its input",
                                             f", but the hidden state it was given has batch {got[1]}")
        if sorted(want) == sorted(got):
            return (f"{f.label} expects a hidden state of shape {shape_text(want)}: (num_layers × "
                    "directions, batch, hidden_size), even with batch_first=True; it got "
                    f"{shape_text(got)}")
        return f"{f.label} expects a hidden state of shape {shape_text(want)}; it got {shape_text(got)}"
    match = _search(r"Expected input to be 2D or 3D, got (\d)D", f)
    if match:
        layout = "(batch, sequence, features)" if batch_first else "(sequence, batch, features)"
        return (f"{f.label} expects a 3-D input {layout}, or 2-D for one unbatched sequence; it "
                f"got {match[1]}-D {shape_text(x.shape)}")
    return None


@_rule
def attention_inputs(f: Failure) -> str | None:
    if not isinstance(f.module, nn.MultiheadAttention):
        return None
    query = f.tensor(0, "query")
    if query is None:
        return None
    batch_first = f.module.batch_first
    match = _search(r"was expecting embedding dimension of (\d+), but got (\d+)", f)
    if match:
        return (f"{f.label} expects query vectors of size {match[1]} (embed_dim) in the last "
                f"dimension; it got {match[2]} (query {shape_text(query.shape)})")
    match = _search(r"Expected key_padded_mask\.shape\[0\] to be (\d+), but got (\d+)", f)
    mask = f.tensor(3, "key_padding_mask")
    if match and mask is not None:
        got = int(match[2])
        if query.dim() == 3 and got == (query.shape[1] if batch_first else query.shape[0]):
            return _batch_first_sentence(
                f, batch_first, tuple(query.shape), "the query",
                f", but key_padding_mask {shape_text(mask.shape)} has batch {got}")
        return (f"{f.label} expects key_padding_mask of shape (batch={match[1]}, source length); "
                f"it is {shape_text(mask.shape)}")
    match = _search(r"The shape of the 2D attn_mask is torch\.Size\(\[([\d, ]+)\]\), but should "
                    r"be \(([\d, ]+)\)", f)
    if match:
        given = _ints(match[1])
        length = query.shape[0] if batch_first else query.shape[1]  # the other reading's length
        if query.dim() == 3 and given[0] == length and given[0] != _ints(match[2])[0]:
            return _batch_first_sentence(
                f, batch_first, tuple(query.shape), "the query",
                f", but attn_mask {shape_text(given)} is sized for sequences of {length}")
        return (f"{f.label} expects a 2-D attn_mask of shape {shape_text(_ints(match[2]))} "
                f"(target length, source length); it is {shape_text(given)}")
    return None


# --- code inside a custom forward: view, reshape, broadcasting, dtypes ----------------------

_SIZE_NAMES = re.compile(r"head|embed|embd|d_model|hidden|dim|size")
_LENGTH_NAMES = ("max_len", "max_length", "max_seq_len", "max_position_embeddings", "n_positions",
                 "block_size", "context_length", "seq_len", "n_ctx")


def _size_attributes(module: nn.Module) -> str:
    found = [f"{name}={value}" for name, value in vars(module).items()
             if type(value) is int and not name.startswith("_") and _SIZE_NAMES.search(name)]
    return f" (the module's {', '.join(found[:6])})" if found else ""


@_rule
def view_non_contiguous(f: Failure) -> str | None:
    if not _search(r"view size is not compatible with input tensor's size and stride", f):
        return None
    return (f"In the forward of {f.label}, {f.code()} calls .view on a non-contiguous tensor "
            "(one made by transpose, permute or slicing): use .reshape(...) or "
            ".contiguous().view(...)")


@_rule
def view_invalid_shape(f: Failure) -> str | None:
    match = _search(r"shape '\[([-\d, ]+)\]' is invalid for input of size (\d+)", f)
    if not match:
        return None
    shape, size = _ints(match[1]), int(match[2])
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        text = (f"In the forward of {f.label}, {f.code()} reshapes a tensor of {size} elements "
                f"to {shape}, but {size} is not a multiple of {known}")
    else:
        text = (f"In the forward of {f.label}, {f.code()} asks for shape {shape} ({known} "
                f"elements) from a tensor of {size} elements")
    return text + _size_attributes(f.module)


@_rule
def broadcast_sizes(f: Failure) -> str | None:
    match = _search(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                    r"at non-singleton dimension (\d+)", f)
    if not match:
        return None
    a, b = int(match[1]), int(match[2])
    text = (f"In the forward of {f.label}, {f.code()} combines tensors whose dimension "
            f"{match[3]} differ ({a} vs {b})")
    config = getattr(f.module, "config", None)
    for source in (f.module, config):
        for name in _LENGTH_NAMES:
            limit = getattr(source, name, None)
            if type(limit) is int and limit in (a, b) and max(a, b) > limit:
                return text + f": the sequence ({max(a, b)}) is longer than {name}={limit}"
    return text


_DTYPE_MESSAGE = r"dtype|scalar type|Input type|type \("


@_rule
def dtype_mismatch(f: Failure) -> str | None:
    if not _search(_DTYPE_MESSAGE, f):
        return None
    params = [t for _, t in f.own_tensors() if t.is_floating_point()]
    inputs = f.tensors()
    if params:
        expected = params[0].dtype
        stray = [(i, t) for i, t in inputs if t.dtype != expected]
        if stray:
            index, t = stray[0]
            if t.dtype == torch.float64:
                fix = "numpy arrays are float64 by default: use x.float() (torch.from_numpy(a).float())"
            elif t.dtype in (torch.float16, torch.bfloat16):
                fix = (f"convert one side (x.float(), or model.to({expected})) or run both under "
                       "torch.autocast")
            elif not t.is_floating_point():
                fix = "integer data: convert it with x.float()"
            else:
                fix = f"convert it with x.to({expected})"
            return (f"{f.label} has {_dtype(params[0])} parameters; its input {index} is "
                    f"{_dtype(t)}: {fix}")
    floats = sorted({_dtype(t) for _, t in inputs if t.is_floating_point()})
    if len(floats) > 1:
        return f"{f.label} got inputs of different dtypes ({', '.join(floats)}): convert them to one"
    return None


# --- last: what no rule explained, under torch.compile ---------------------------------------


@_rule
def traced_by_compile(f: Failure) -> str | None:
    if not f.traced:
        return None
    return (f"torch.compile was tracing {f.label} when this failed, so nothing had run and its "
            "inputs are not on the stack; the same code fails without torch.compile: run it "
            "under torch.compiler.set_stance(\"force_eager\") (or call the model before "
            "torch.compile) and explain that error for the inputs and a diagnosis")
