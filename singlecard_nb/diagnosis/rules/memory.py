"""Out of memory: what the module tried to allocate, what was resident, and the batch that fits.

`torch.OutOfMemoryError` (CUDA's "Tried to allocate 2.00 GiB ... of which 1.20 GiB is free") and
the CPU allocator's "can't allocate memory: you tried to allocate N bytes" are read for their
numbers; what was resident is read from the model (parameters, gradients, optimizer state of
the optimisers that hold its parameters) and, where an inspector with memory=True recorded the
failing step, from its per-module table (`capacity.MEMORY_TABLES`). The micro-batch is sized
from those numbers; `scn.fit` gives the exact figure before running.
"""

from __future__ import annotations

import gc
import re

import torch
from torch import nn

from ...capacity import MEMORY_TABLES, host_card, pinned_card, size_text
from ...job import launched_world_size
from ..failure import Failure

_UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40, "PiB": 2 ** 50}
_SIZE = r"([\d.]+) ?(B|KiB|MiB|GiB|TiB|PiB)"
_CPU = r"can't allocate memory|not enough memory"


def _bytes(pattern: str, message: str) -> int | None:
    match = re.search(pattern, message)
    return int(float(match[1]) * _UNITS[match[2]]) if match else None


def _resident(root: nn.Module, table: dict | None) -> dict[str, int]:
    """Bytes by kind the model held when it failed (activations only from an inspector)."""
    kinds = dict.fromkeys(("parameters", "gradients", "optimizer", "activations"), 0)
    if table:
        for row in table.values():
            for kind in kinds:
                kinds[kind] += row.get(kind, 0)
        return kinds
    params = {id(p): p for p in root.parameters()}
    kinds["parameters"] = sum(t.numel() * t.element_size()
                              for t in (*params.values(), *root.buffers()))
    kinds["gradients"] = sum(p.grad.numel() * p.grad.element_size()
                             for p in params.values() if p.grad is not None)
    # only on failure: the heap walked once. type(), not isinstance(): isinstance asks an
    # object's __class__, which a dead weakref.proxy answers with ReferenceError and some
    # objects answer with a warning
    optimizers = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.optim.Optimizer)]
    for obj in optimizers:
        if any(id(p) in params for group in obj.param_groups for p in group["params"]):
            kinds["optimizer"] += sum(v.numel() * v.element_size()
                                      for state in obj.state.values() for v in state.values()
                                      if isinstance(v, torch.Tensor))
    return kinds


def _batch(f: Failure) -> int | None:
    for _, t in f.root_inputs or f.inputs:
        if isinstance(t, torch.Tensor) and t.dim():
            return int(t.shape[0])
    return None


def _usable(f: Failure, cuda: bool) -> int | None:
    """Bytes a step of this process may use: in use by it plus free (CUDA's message), or the
    pinned card / the host's available memory."""
    message = f.message
    free = _bytes(r"of which " + _SIZE + " is free", message)
    in_use = _bytes(r"this process has " + _SIZE + " memory in use", message)
    if free is not None and in_use is not None:
        return free + in_use
    card = pinned_card() if cuda else host_card()
    return card.free if card is not None else None


def _global_batch(root: nn.Module, batch: int) -> tuple[int, str]:
    if isinstance(root, nn.DataParallel):
        asked = getattr(root, "_singlecard_requested", {}).get("device_ids")
        cards = len(asked) if asked else None
        where = f"the batch DataParallel split over {cards} GPUs" if cards else "DataParallel's batch"
        return batch, where
    world = launched_world_size()
    if world > 1:
        return batch * world, f"{world} ranks × {batch} per rank"
    return batch, "this job's batch"


def _block_of(path: str) -> str:
    """The block a module belongs to: "blocks.3" for "blocks.3.attn.qkv", else "encoder"."""
    parts = path.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1].isdigit() else parts[0]


def _blocks(table: dict | None, fixed: int, room: int, tried: int) -> str | None:
    """"checkpoint the N biggest blocks (...)" when the inspector's table says which."""
    if not table:
        return None
    sizes: dict[str, int] = {}
    for path, row in table.items():
        if path:
            block = _block_of(path)
            sizes[block] = sizes.get(block, 0) + row.get("activations", 0)
    ranked = sorted(sizes.items(), key=lambda item: -item[1])
    activations = sum(row.get("activations", 0) for row in table.values())
    for n in range(1, min(len(ranked), 64) + 1):
        chosen = ranked[:n]
        if fixed + activations + tried - sum(s for _, s in chosen) + chosen[0][1] <= room:
            names = ", ".join(p for p, _ in chosen[:5]) + (", ..." if n > 5 else "")
            return f"checkpoint the {n} biggest block{'s' * (n > 1)} ({names})"
    return None


def out_of_memory(f: Failure) -> str | None:
    cuda = isinstance(f.exception, torch.OutOfMemoryError)
    if not cuda and not (isinstance(f.exception, RuntimeError) and re.search(_CPU, f.message)):
        return None
    tried = (_bytes(r"Tried to allocate " + _SIZE, f.message) if cuda else
             (int(m[1]) if (m := re.search(r"allocate (\d+) bytes", f.message)) else None))
    root = f.root if isinstance(f.root, nn.Module) else f.module
    model = root.module if isinstance(root, nn.DataParallel) else root
    table = MEMORY_TABLES.of(model) or MEMORY_TABLES.of(root)
    kinds = _resident(model, table)
    what = f"{size_text(tried)}" if tried is not None else "more memory"
    parts = ", ".join(f"{k} {size_text(v)}" for k, v in kinds.items() if v)
    biggest = ""
    if table:
        top = [item for item in sorted(table.items(), key=lambda item: -sum(
            v for k, v in item[1].items() if k != "type")) if any(
            v for k, v in item[1].items() if k != "type")][:3]
        biggest = "; biggest: " + ", ".join(
            f"{p or '(model)'} {size_text(sum(v for k, v in r.items() if k != 'type'))}"
            for p, r in top)
    text = (f"{f.label} ran out of {'GPU' if cuda else 'host'} memory trying to allocate {what}; "
            f"the model held {parts or 'nothing known'}{biggest}")
    if not table:
        text += " (activations not known: inspect with memory=True to see them by module)"
    batch, usable = _batch(f), _usable(f, cuda)
    if batch is None or usable is None:
        return text + ". Run scn.fit(model, batch, optimizer=opt) to see what fits"
    fixed = kinds["parameters"] + kinds["gradients"] + kinds["optimizer"]
    # what the step needed is at least what it held plus what it asked for; activations scale
    # with the batch, so the micro-batch is at most this share of it
    allocated = _bytes(r"allocated memory " + _SIZE + " is allocated by PyTorch", f.message)
    held = max(kinds["activations"], (allocated or 0) - fixed)  # CUDA says what it held
    needed_activations = held + (tried or 0)
    room = usable - fixed
    global_batch, job = _global_batch(f.wrapper or root, batch)
    if room <= 0:
        return text + (f". Parameters, gradients and optimizer state alone ({size_text(fixed)}) "
                       f"fill the {size_text(usable)} this process can use: no batch fits; "
                       "use bf16 weights, a smaller optimizer state (SGD, 8-bit Adam) or a "
                       "bigger card")
    micro = max(min(int(batch * room / max(needed_activations, 1)), batch - 1), 1)
    while global_batch % micro:
        micro -= 1
    hint = (f". A batch of {batch} does not fit in the {size_text(usable)} this process can use: "
            f"a micro-batch of at most {micro} (sized from what ran before the failure; the rest "
            f"of the step needs more) with {global_batch // micro} gradient-accumulation steps "
            f"keeps the global batch of {global_batch} ({job})")
    blocks = _blocks(table, fixed, usable, tried or 0)
    if blocks:
        hint += f"; or {blocks}"
    return text + hint + "; scn.fit(model, batch, optimizer=opt) predicts the peak exactly"
