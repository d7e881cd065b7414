"""Rules on sequence layers: RNN / LSTM / GRU and MultiheadAttention (batch_first, hidden state,
masks).

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..failure import LENGTH_NAMES, Failure, ints, moved_dimension, search, shape_text
from ..traceback_calls import module_label


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


def rnn_input(f: Failure) -> str | None:
    x = f.tensor(0, "input")
    if not isinstance(f.module, nn.RNNBase) or x is None:
        return None
    batch_first = f.module.batch_first
    match = search(r"input\.size\(-1\) must be equal to input_size\. Expected (\d+), got (\d+)", f)
    if match:
        want = int(match[1])
        text = (f"{f.label} expects {want} features in the last dimension of its input "
                f"(input_size); it got {match[2]} (input {shape_text(x.shape)})")
        moved = moved_dimension(tuple(x.shape), want, -1)
        if moved is not None:
            text += f": dimension {moved} is {want}, so the features may be in the wrong dimension"
        return text
    match = search(r"Expected hidden(?:\[\d\])? size \(([\d, ]+)\), got \[([\d, ]+)\]", f)
    if match:
        want, got = ints(match[1]), ints(match[2])
        if x.dim() == 3 and want[1] != got[1] and want[0] == got[0]:
            if got[1] == (x.shape[1] if batch_first else x.shape[0]):
                return _batch_first_sentence(f, batch_first, tuple(x.shape), "its input",
                                             f", but the hidden state it was given has batch {got[1]}")
        if sorted(want) == sorted(got):
            return (f"{f.label} expects a hidden state of shape {shape_text(want)}: (num_layers × "
                    "directions, batch, hidden_size), even with batch_first=True; it got "
                    f"{shape_text(got)}")
        return f"{f.label} expects a hidden state of shape {shape_text(want)}; it got {shape_text(got)}"
    match = search(r"Expected input to be 2D or 3D, got (\d)D", f)
    if match:
        layout = "(batch, sequence, features)" if batch_first else "(sequence, batch, features)"
        return (f"{f.label} expects a 3-D input {layout}, or 2-D for one unbatched sequence; it "
                f"got {match[1]}-D {shape_text(x.shape)}")
    return None


def attention_inputs(f: Failure) -> str | None:
    if not isinstance(f.module, nn.MultiheadAttention):
        return None
    query = f.tensor(0, "query")
    if query is None:
        return None
    batch_first = f.module.batch_first
    match = search(r"was expecting embedding dimension of (\d+), but got (\d+)", f)
    if match:
        return (f"{f.label} expects query vectors of size {match[1]} (embed_dim) in the last "
                f"dimension; it got {match[2]} (query {shape_text(query.shape)})")
    match = search(r"Expected key_padded_mask\.shape\[0\] to be (\d+), but got (\d+)", f)
    mask = f.tensor(3, "key_padding_mask")
    if match and mask is not None:
        got = int(match[2])
        if query.dim() == 3 and got == (query.shape[1] if batch_first else query.shape[0]):
            return _batch_first_sentence(
                f, batch_first, tuple(query.shape), "the query",
                f", but key_padding_mask {shape_text(mask.shape)} has batch {got}")
        return (f"{f.label} expects key_padding_mask of shape (batch={match[1]}, source length); "
                f"it is {shape_text(mask.shape)}")
    key = f.tensor(1, "key")
    if query.dim() == 3 and key is not None and key.dim() == 3:
        batch, other = (0, 1) if batch_first else (1, 0)
        if query.shape[batch] != key.shape[batch] and query.shape[other] == key.shape[other]:
            # e.g. batch-first (2, 10, E) and (2, 12, E) read sequence-first: batches 10 and 12
            # (torch then fails in a reshape of its own, which names no input)
            return _batch_first_sentence(
                f, batch_first, tuple(query.shape), "the query",
                f" and the key {shape_text(key.shape)} as batch {key.shape[batch]}, but their "
                f"dimension {other} agrees ({query.shape[other]})")
    match = search(r"The shape of the 2D attn_mask is torch\.Size\(\[([\d, ]+)\]\), but should "
                   r"be \(([\d, ]+)\)", f)
    if match:
        given = ints(match[1])
        length = query.shape[0] if batch_first else query.shape[1]  # the other reading's length
        if query.dim() == 3 and given[0] == length and given[0] != ints(match[2])[0]:
            return _batch_first_sentence(
                f, batch_first, tuple(query.shape), "the query",
                f", but attn_mask {shape_text(given)} is sized for sequences of {length}")
        return (f"{f.label} expects a 2-D attn_mask of shape {shape_text(ints(match[2]))} "
                f"(target length, source length); it is {shape_text(given)}")
    return None


def _position_limit(f: Failure) -> tuple[str, int] | None:
    """("max_position_embeddings=512", 512): how many positions the failing module (or the model
    around it) holds, from its settings, its config, or a position table among its children."""
    modules = [module for _, module, _, _ in reversed(f.callers)] or [f.module]
    for module in modules:  # the failing module first, then those around it
        for source in (module, getattr(module, "config", None)):
            for name in LENGTH_NAMES:
                limit = getattr(source, name, None)
                if type(limit) is int and limit > 0:
                    return f"{name}={limit}", limit
    for name, child in modules[0].named_children():
        if isinstance(child, nn.Embedding) and "pos" in name:
            return f"{name} of {child.num_embeddings} rows", child.num_embeddings
    return None


def longer_than_positions(f: Failure) -> str | None:
    """A sequence longer than the model's position table: Hugging Face models fail in a buffer's
    expand or an add, with the two lengths as the only clue."""
    limit = _position_limit(f)
    if limit is None:
        return None
    name, size = limit
    numbers = set(ints(f.message))
    for index, t in f.tensors():
        if t.dim() < 2 or (t.is_floating_point() and t.dim() != 3):
            continue
        length = t.shape[1]
        if length > size and {length, size} <= numbers:
            kind = "token ids" if not t.is_floating_point() else "embeddings"
            return (f"{f.label} holds {size} positions ({name}); its input {index} "
                    f"{shape_text(t.shape)} is {kind} for sequences of {length}: truncate the "
                    f"inputs to {size} tokens (tokenizer(..., truncation=True, max_length={size})) "
                    "or split long texts into windows")
    return None


def attention_mask_length(f: Failure) -> str | None:
    """A 4-D attention mask (batch, heads or 1, query length, key length) made for another
    length than the hidden states it is used with."""
    mask = next((t for i, t in f.tensors() if "mask" in i and t.dim() == 4), None)
    hidden = f.tensor(0, "hidden_states")
    if mask is None or hidden is None or hidden.dim() != 3 or not hidden.is_floating_point():
        return None
    length = hidden.shape[1]
    if mask.shape[-1] == length and mask.shape[-2] in (1, length):
        return None
    if not {length, mask.shape[-1]} & set(ints(f.message)):
        return None
    if any(t.dim() == 3 and t.shape[1] == mask.shape[-1] for _, t in f.tensors()):
        return None  # keys of that length are there: cross-attention, the mask fits them
    given = ""
    outer = f.outermost()
    if outer is not None:
        path, module, _, kwargs = outer
        passed = kwargs.get("attention_mask")
        if isinstance(passed, torch.Tensor):
            given = (f" (the attention_mask given to {module_label(type(module).__name__, path)} "
                     f"is {shape_text(passed.shape)})")
    return (f"{f.label} got hidden states {shape_text(hidden.shape)} for sequences of {length} "
            f"tokens and a 4-D attention mask {shape_text(mask.shape)} for keys of length "
            f"{mask.shape[-1]}{given}: a 4-D mask is (batch, 1 or heads, query length, key "
            f"length) and must be built for the same input_ids; pass the tokenizer's 2-D "
            f"(batch, {length}) attention_mask and let the model expand it, or build the 4-D "
            f"mask for length {length}")
