"""What a step records beside its rows, for the ranking to diagnose: per-channel statistics of
the model's inputs, the optimiser's param groups, and each optimiser step's update Δw.

Channel statistics are reduced on the device and cross to the host with the step (`flush`),
on every 16th step (recorder.DESCRIBED_EVERY: they describe the data, not the step);
param groups are host values read from the optimiser; Δw is the parameter after the step less
a copy taken just before it (only within `SNAPSHOT_BYTES`: memory stays bounded).
"""

from __future__ import annotations

import ctypes
import math
import sys
import weakref
from typing import Any

import torch

from ..kernel import contiguous_in_place

MIN_SAMPLES = 16  # values per channel for its statistics to mean something
MAX_CHANNELS = 4096  # wider inputs (a sequence's embedding dimension) are not split
SNAPSHOT_BYTES = 256 << 20  # parameters copied before an optimiser step, per step, at most
_FLOAT32, _PARAMETER = torch.float32, torch.nn.Parameter


def channel_stats(t: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """(mean, std, absmax), each [C], per channel of an image batch (N×C×H×W, dim 1) or per
    feature of a table (N×F), on the tensor's device; None for other shapes."""
    if not t.is_floating_point() or t.dim() not in (2, 4) or t.shape[0] == 0:
        return None
    channels = t.shape[1]
    if not 2 <= channels <= MAX_CHANNELS or t.numel() < MIN_SAMPLES * channels:
        return None  # a handful of samples per channel: their spread says nothing yet
    # Of a detached tensor: no graph, so no no_grad block (a Ctrl-C landing in no_grad's
    # __exit__ would leave grad mode off in the user's thread)
    # reduced in place over the other dims: no transposed copy (a third of the time of an
    # image batch's); the inf-norm is the largest |x|, exactly as abs().amax() (NaN stays NaN);
    # the three columns stay apart (a stack was a fifth of the time of a small batch's)
    x = t.detach()
    if x.dtype is not torch.float32:  # float() of float32 is the tensor itself, one op later
        x = x.float()
    dims = 0 if x.dim() == 2 else (0, 2, 3)
    std, mean = torch.std_mean(x, dim=dims, correction=0)
    return mean, std, torch.linalg.vector_norm(x, math.inf, dims)


def channels_to_host(pending: dict[str, tuple[Any, tuple[torch.Tensor, ...]]]
                     ) -> dict[str, dict]:
    """index -> {"shape", "values": ((mean, std, absmax), ...)}: named, for the record."""
    out = {}
    for index, (shape, columns) in pending.items():
        mean, std, absmax = columns
        if mean.is_cpu:  # each column read where it lies: no stack, no copy
            rows = zip(mean.tolist(), std.tolist(), absmax.tolist())
        else:  # one transfer for the three
            rows = map(tuple, torch.stack(columns, dim=1).cpu().tolist())
        # tuples, not lists: the garbage collector stops tracking a tuple of floats, while
        # every list a step keeps would stay tracked and make its full collections come sooner
        out[index] = {"shape": shape, "values": tuple(rows)}
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.device.type != "cpu":  # reading a GPU lr would sync
            return None
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class ParamTargets:
    """The inspected parameters, each with (target, name, module), all held weakly: a module
    swapped out of the model goes when the script drops it, and a parameter made later that
    got a freed one's id() is not taken for it."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}

    def add(self, param: torch.Tensor, target: Any, name: str, module: Any) -> None:
        self._by_id.setdefault(id(param), (weakref.ref(param), target, name, weakref.ref(module)))

    def get(self, param: Any) -> tuple | None:
        """(target, name, module) of `param` itself, or None."""
        found = self.entry(param)
        module = None if found is None else found[3]()
        return None if module is None else (found[1], found[2], module)

    def entry(self, param: Any) -> tuple | None:
        """(param, target, name, module), param and module as weak references, of `param`
        itself while its module lives, or None: the tuple kept here, made once."""
        found = self._by_id.get(id(param))
        if found is None or found[0]() is not param or found[3]() is None:
            return None
        return found

    def __contains__(self, param: Any) -> bool:
        return self.get(param) is not None


def param_groups(optimizer: Any, param_targets: ParamTargets, scaled: bool = False,
                 carried: set[int] = frozenset()) -> list[dict]:
    """The groups of `optimizer` that hold this model's parameters, by name: {"optimizer",
    "group", "lr", "weight_decay", "params": ("head.weight", ...), "frozen": those of them
    with requires_grad False, "eval": how many belong to a module in eval mode, "scaled":
    the step ran inside GradScaler.step, "carried": how many hold last step's gradient, not
    zeroed (`carried`: their ids)}. Host attributes only: nothing is read off a device.
    Tuples, not lists: a step keeps them, and the garbage collector stops tracking tuples of
    strings (every kept list would bring its full collections sooner, see channels_to_host)."""
    groups = []
    get = param_targets.get
    for i, group in enumerate(optimizer.param_groups):
        names, frozen, in_eval, kept = [], [], 0, 0
        for p in group["params"]:
            found = get(p)
            if found is not None:
                target, name, module = found
                names.append(f"{target.path}.{name}" if target.path else name)
                if not p.requires_grad:
                    frozen.append(names[-1])
                in_eval += not module.training
                kept += id(p) in carried
        if names:
            groups.append({"optimizer": type(optimizer).__name__, "group": i,
                           "lr": _number(group.get("lr")),
                           "weight_decay": _number(group.get("weight_decay", 0.0)),
                           "params": tuple(names), "frozen": tuple(frozen), "eval": in_eval,
                           "scaled": scaled, "carried": kept})
    return groups


def under_grad_scaler() -> bool:
    """Whether the optimiser step running now was called by a GradScaler's `step` (a few
    frames up): what the ranking may then say of scaled gradients."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "step" and code.co_filename.endswith("grad_scaler.py"):
            return True
        frame = frame.f_back
    return False


class Snapshots:
    """Copies of parameters taken just before an optimiser step, so that the step's update
    Δw can be recorded after it; at most `budget` bytes per step (said once when reached).

    A plain float32 CPU parameter in one block (what the difference kernel reads,
    `Recorder.record_parameter`) is copied into one buffer for the step, each by a memmove
    (~0.4 us against ~1.5 for torch's `clone`) and known by the address of its copy: no tensor
    per parameter lives through the optimiser's step for the garbage collector to count (see
    recorder._GradHook). Any other is cloned. Either goes when the step's rows are made."""

    def __init__(self, say: Any, budget: int = SNAPSHOT_BYTES):
        self.budget = budget
        self._say = say
        self._before: dict[int, torch.Tensor | int] = {}  # id(param) -> copy, or its address
        self._buffer: torch.Tensor | None = None  # the step's copies by address, as bytes
        self._sizes: dict[int, int] = {}  # id(param) -> bytes of its copy in the buffer

    def take(self, params: list[torch.Tensor]) -> None:
        """Copies of `params` (the model's, of the optimiser about to step), within budget."""
        used, skipped, in_buffer = 0, 0, []
        before, sizes = self._before, self._sizes
        self.clear()
        for p in params:  # detached copies: no no_grad (channel_stats)
            if id(p) in before:
                continue
            size = p.numel() * p.element_size()
            if used + size > self.budget:
                skipped += 1
                continue
            used += size
            if (p.dtype is _FLOAT32 and type(p) is _PARAMETER and p.is_cpu
                    and contiguous_in_place(p)):
                sizes[id(p)] = size
                in_buffer.append(p)
            else:
                before[id(p)] = p.detach().clone()
        if skipped:
            self._say("update-budget", f"the update ratio |Δw|/|w| of {skipped} parameters is "
                      f"not recorded: copying them before each optimiser step would take more "
                      f"than {self.budget >> 20} MiB. The ranking still sees their growth.")
        if in_buffer:  # each copy 64-byte aligned, as an allocation of torch's is
            self._buffer = torch.empty(sum((sizes[id(p)] + 63) & ~63 for p in in_buffer),
                                       dtype=torch.uint8)
            address = self._buffer.data_ptr()
            for p in in_buffer:
                size = sizes[id(p)]
                before[id(p)] = address
                ctypes.memmove(address, p.data_ptr(), size)
                address += (size + 63) & ~63

    def take_back(self, param: torch.Tensor) -> torch.Tensor | int | None:
        """The copy `take` made of `param` (no longer kept here): a tensor, or the address of
        its copy in the step's buffer (`as_tensor` makes it a tensor); None if none was made,
        or if the parameter no longer has the copy's size (its .data replaced during the step:
        the copy is not read beyond its end, and that is said once)."""
        copy = self._before.pop(id(param), None)
        if type(copy) is int and self._sizes.pop(id(param)) != param.numel() * 4:
            self._say("update-resized", "the update Δw of a parameter whose values were "
                      "replaced by a tensor of another size during the optimiser's step is not "
                      "recorded for that step.")
            return None
        return copy

    def as_tensor(self, param: torch.Tensor, copy: torch.Tensor | int) -> torch.Tensor:
        """`take_back`'s copy of `param` as a tensor (a view of the buffer for an address)."""
        if type(copy) is not int:
            return copy
        values = self._buffer.view(torch.float32)
        offset = (copy - values.data_ptr()) // values.element_size()
        return values.as_strided(param.shape, param.stride(), offset)

    def clear(self) -> None:
        self._before.clear()
        self._sizes.clear()
        self._buffer = None
