"""Rules on the inputs of torch's layers: Linear, convolutions, normalisation, embeddings.

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.instancenorm import _InstanceNorm

from ...dtypes import dtype_name
from ..failure import Failure, ints, moved_dimension, search, shape_text
from ..traceback_calls import module_label

_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}
_CHANNELS_FIRST = {1: "x.transpose(1, 2)", 2: "x.permute(0, 3, 1, 2)", 3: "x.permute(0, 4, 1, 2, 3)"}


def linear_features(f: Failure) -> str | None:
    match = (search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", f)
             # the same product under torch.compile's tracing (fake tensors, meta kernels); a
             # size is symbolic ("s33") once dynamo has seen the code with other batch sizes
             or search(r"a and b must have same reduction dim, but got \[(\w+), (\w+)\] X "
                       r"\[(\w+), (\w+)\]", f))
    if not match:
        return None
    expected = getattr(f.module, "in_features", None)
    x = f.tensor(0, "input")
    if isinstance(expected, int) and x is None and f.traced and match[3] == str(expected):
        return (f"{f.label} expects the last dimension of its input to be {expected} "
                f"(in_features); it got {match[2]}")
    if not isinstance(expected, int) or x is None or x.dim() == 0:
        return (f"A matrix product in the forward of {f.label}, {f.code()}, multiplies "
                f"({match[1]}x{match[2]}) by ({match[3]}x{match[4]}): the inner sizes "
                f"{match[2]} and {match[3]} must be equal")
    text = (f"{f.label} expects the last dimension of its input to be {expected} (in_features); "
            f"it got {x.shape[-1]}")
    unbatched = _unbatched_sample(f, x, expected)
    if unbatched:
        return text + unbatched
    moved = moved_dimension(tuple(x.shape), expected, -1)
    if moved is not None:
        text += (f": dimension {moved} of the input {shape_text(x.shape)} is {expected}, so the "
                 "features may be in the wrong dimension")
    return text


def _unbatched_sample(f: Failure, x: torch.Tensor, expected: int) -> str | None:
    """One sample given without its batch dimension: a convolution read it as unbatched, and a
    flatten(1) then spread its channels over the batch (x holds exactly in_features values)."""
    outer = f.outermost()
    if outer is None or x.dim() != 2 or x.shape[0] == 1 or x.numel() != expected:
        return None
    path, model, args, kwargs = outer
    given = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
    convs = [m for m in model.modules() if isinstance(m, _ConvNd)]
    if given is None or not convs or given.dim() != len(convs[0].kernel_size) + 1:
        return None
    name = module_label(type(model).__name__, path)
    return (f", but its input {shape_text(x.shape)} holds exactly {expected} values, one sample's: "
            f"{name} was called with {shape_text(given.shape)}, one sample without its batch "
            f"dimension, which {type(convs[0]).__name__} reads as unbatched, so the flatten before "
            f"{f.label} spread its {x.shape[0]} channels over the batch; add the batch "
            "dimension: x.unsqueeze(0) (or x[None])")


def conv_channels(f: Failure) -> str | None:
    match = search(r"expected input\[[\d, ]+\] to have (\d+) channels, but got (\d+) channels", f)
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


def conv_dimensions(f: Failure) -> str | None:
    match = search(r"Expected (\d)D \(unbatched\) or (\d)D \(batched\) input to conv", f)
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


def input_too_small(f: Failure) -> str | None:
    if not search(r"Output size is too small|Kernel size can't be greater than actual input size", f):
        return None
    x = f.tensor(0, "input")
    kernel = getattr(f.module, "kernel_size", None)
    shape = shape_text(x.shape) if x is not None else "input"
    return (f"{f.label} got an input {shape} spatially smaller than its kernel_size={kernel} "
            "(after padding): the layers before it shrank it too far; use larger inputs, fewer "
            "pooling or stride-2 layers, or padding")

_NORM_LAYOUT = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}


def batch_norm_channels(f: Failure) -> str | None:
    match = search(r"running_mean should contain (\d+) elements not (\d+)", f)
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


def norm_dimensions(f: Failure) -> str | None:
    match = search(r"expected (\d)D(?: or (\d)D)? input \(got (\d)D input\)", f)
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


def batch_of_one(f: Failure) -> str | None:
    if not search(r"Expected more than 1 value per channel when training", f):
        return None
    x = f.tensor(0, "input")
    shape = shape_text(x.shape) if x is not None else "a batch of 1"
    return (f"{f.label} is in training mode, where it needs more than one value per channel to "
            f"compute batch statistics; it got {shape}: use a batch of 2 or more, or call "
            "model.eval() to run a single sample")


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


def layer_norm(f: Failure) -> str | None:
    match = search(r"Given normalized_shape=\[([\d, ]*)\], expected input with shape "
                   r"\[\*, [\d, ]*\], but got input of size\s*\[([\d, ]*)\]", f)
    if not match:
        return None
    normalized, shape = ints(match[1]), ints(match[2])
    tail = shape[-len(normalized):] if normalized else []
    return (f"{f.label} normalizes over the last {len(normalized)} dimension(s) {normalized} "
            f"(normalized_shape); the input {shape_text(shape)} ends in {tail}")


def embedding_dtype(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if (not isinstance(f.module, nn.Embedding) or x is None
            or not search(r"'indices' to have one of the following scalar types", f)):
        return None
    dim = f.module.embedding_dim
    if x.is_floating_point() and x.dim() and x.shape[-1] == dim:
        return (f"{f.label} looks up integer ids; it got {dtype_name(x.dtype)} {shape_text(x.shape)}, "
                f"whose last dimension is already embedding_dim={dim}: these look like "
                "embeddings, pass them on without the lookup (Hugging Face models take "
                "inputs_embeds=)")
    return (f"{f.label} looks up integer ids (int64 or int32); it got {dtype_name(x.dtype)} "
            f"{shape_text(x.shape)}: convert them with x.long()")


def embedding_range(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if (not isinstance(f.module, nn.Embedding) or x is None or x.numel() == 0
            or not search(r"index out of range", f)):
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
