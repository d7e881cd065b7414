"""Per-module tensor shapes and statistics on forward and backward passes.

    with singlecard_nb.inspect(model) as insp:
        loss = model(x).sum(); loss.backward()
    insp.frame()      # one row per (step, module call, tensor)

How it stays cheap: module outputs are caught by one *global* forward hook, installed only for
the steps that are recorded (`every=N` leaves plain module calls on the other steps); a dict maps
each inspected module to its path. Statistics are taken on the tensor's device (see `stats.py`),
and reach the host once per step. No activation is referenced after its hook returns.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import html
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from ..borrow import Borrowed
from .stats import VALUES, StepStats, reducible

COLUMNS = (
    "step", "module", "type", "call", "io", "index", "shape", "dtype", "device",
    "mean", "std", "min", "max", "absmax", "nan", "inf", "zeros", "rank",
)
DEFAULT_MAX_ROWS = 100_000
MAX_DEPTH = 8  # nesting depth walked inside one output structure
MAX_TENSORS_PER_OUTPUT = 256  # a list of thousands of tensors is summarised by its first ones
# A container's output is the same tensor as a child's, seen a few hooks earlier: remembering
# only the last few keeps dedupe's weak references from piling up for the garbage collector.
_SEEN_WINDOW = 64

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class NonFiniteError(RuntimeError):
    """The first module output or gradient with NaN or Inf, raised by `inspect(..., trap=True)`.

    Attributes: module (path), module_type, io, index, step, call, nan, inf, and inputs_finite
    (True when the module's tensor inputs were all finite: this module produced the NaN/Inf).
    """

    def __init__(self, module: str, module_type: str, io: str, index: str, step: int,
                 call: int, nan: int, inf: int, inputs_finite: bool | None):
        self.module, self.module_type, self.io, self.index = module, module_type, io, index
        self.step, self.call, self.nan, self.inf = step, call, nan, inf
        self.inputs_finite = inputs_finite
        where = repr(module) if module else "the model itself ('')"
        what = f"{io}{index}" if index else io
        origin = {True: " Its inputs were finite, so this module produced them.",
                  False: " Its inputs already held NaN/Inf.", None: ""}[inputs_finite]
        super().__init__(
            f"{nan} NaN and {inf} Inf in {what} of {where} ({module_type}) at step {step}, "
            f"call {call}.{origin} Rows recorded so far are in insp.frame()."
        )


@dataclasses.dataclass
class _Target:
    path: str
    type_name: str
    hist: bool


class _Pending:
    """Rows of the current step whose statistics may still be on the device."""

    def __init__(self, exact_std: bool):
        self.rows: list[tuple] = []  # (step, path, type, call, io, index, shape, dtype, device)
        self.slots: list[int | None] = []  # each row's statistics slot (None: not reducible)
        self.stats = StepStats(exact_std)
        self.hists: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


@dataclasses.dataclass
class _StepRecord:
    """One step's rows on the host: metadata tuples and a [rows, 8] array of VALUES."""

    meta: list[tuple]
    values: np.ndarray
    rank: int
    _first_rows: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def first_rows(self, io: str) -> dict[str, int]:
        """Module path -> row of its first `io` tensor in its first call (cached)."""
        first = self._first_rows.get(io)
        if first is None:
            first = self._first_rows[io] = {}
            for i, (_, path, _, call, row_io, *_) in enumerate(self.meta):
                if row_io == io and call == 0 and path not in first:
                    first[path] = i
        return first


def _globs(patterns: str | Sequence[str] | None) -> list[str] | None:
    """Patterns as a list; items may be comma-separated ("0,2", ["0,2"], ["0", "2"]).

    A list item "" stays: it is the root module's path.
    """
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [part.strip() for part in patterns.split(",") if part.strip()]
    return [part.strip() for item in patterns
            for part in (item.split(",") if "," in item else [item])
            if part.strip() or "," not in item]


def _matches(path: str, type_name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(type_name, p) for p in patterns)


def _walk(obj: Any, index: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (index, tensor) for every tensor inside a structure; everything else is skipped."""
    if isinstance(obj, torch.Tensor):
        yield index, obj
    elif depth >= MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Hugging Face ModelOutput is a dataclass too: fields read as `.last_hidden_state`.
        for field in dataclasses.fields(obj):
            yield from _walk(getattr(obj, field.name, None), f"{index}.{field.name}", depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple, PackedSequence
        for name, item in zip(obj._fields, obj):
            yield from _walk(item, f"{index}.{name}", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj[:MAX_TENSORS_PER_OUTPUT]):
            yield from _walk(item, f"{index}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        for i, (key, item) in enumerate(obj.items()):
            if i >= MAX_TENSORS_PER_OUTPUT:
                break
            yield from _walk(item, f"{index}[{key!r}]", depth + 1)


_DTYPE_NAMES = {dtype: str(dtype).replace("torch.", "") for dtype in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
_DEVICE_NAMES: dict[torch.device, str] = {}


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def _rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


class Inspector:
    """Records shapes and statistics of module tensors; see `inspect()` for the options."""

    def __init__(self, model: nn.Module, include=None, exclude=None, every: int = 1,
                 grads: bool = False, trap: bool = False, max_rows: int | None = None,
                 inputs: bool | str = "root", hist=None, hist_bins: int = 64,
                 exact_std: bool = False, steps: str = "forward", params: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"inspect() needs an nn.Module, got {type(model).__name__}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        if steps not in ("forward", "manual"):
            raise ValueError(f"steps must be 'forward' or 'manual', got {steps!r}")
        if inputs not in (True, False, "root"):
            raise ValueError(f"inputs must be True, False or 'root', got {inputs!r}")
        original = getattr(model, "_orig_mod", None)
        if isinstance(original, nn.Module):  # a torch.compile(...) wrapper
            warnings.warn(
                "singlecard_nb: inspecting the original module inside this torch.compile wrapper; "
                "compiled regions may bypass forward hooks, so some modules can have no rows.",
                stacklevel=3,
            )
            model = original
        self.model = model
        self.include, self.exclude = _globs(include), _globs(exclude)
        self.every, self.grads, self.trap = every, grads, trap
        self.max_rows = max_rows or DEFAULT_MAX_ROWS
        self.inputs = inputs
        self.hist_patterns, self.hist_bins = _globs(hist), hist_bins
        self.exact_std = exact_std
        self.errors: list[str] = []  # failures inside the inspector, never raised to the user
        self.steps_recorded = 0
        self._records: deque[_StepRecord] = deque()
        self._row_count = 0
        self._dropped = 0
        self._histograms: dict[str, tuple[Any, Any]] = {}
        self._listeners: list[Callable[[Inspector], None]] = []
        self._owner: Borrowed | None = None
        self._global_handle = None
        self._targets: dict[int, _Target] = {}
        self._step = -1
        self._recording = False
        self._manual_steps = steps == "manual"
        self.params = params
        self._optimizer_steps = 0  # optimiser steps that updated this model's parameters
        self._root_depth = 0
        self._calls: dict[int, int] = {}
        self._seen: dict[int, tuple] = {}  # id(tensor) -> (weakref, _version, slot): dedupe
        self._pending = _Pending(exact_std)
        self._lock = threading.Lock()
        self._warned = False
        self._last_flushed_step = -1

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._owner is not None

    def start(self) -> Inspector:
        """Attach hooks (one owner removes them all); idempotent."""
        if self._owner is not None:
            return self
        if self._manual_steps and self._step < 0:
            self._step = 0  # manual steps: step 0 starts now
            self._recording = True
        owner = Borrowed(f"inspect({type(self.model).__name__})")
        try:
            self._targets = self._select_targets()
            compiled = any(getattr(m, "_compiled_call_impl", None) is not None
                           for m in self.model.modules())
            wrap = torch.compiler.disable if compiled else (lambda f: f)
            # statistics code must run eagerly, never become part of a compiled graph
            self._forward_hook = wrap(self._on_forward)
            owner.add_handle(self.model.register_forward_pre_hook(
                wrap(self._on_root_pre), with_kwargs=True), "root pre-hook")
            owner.add_handle(self.model.register_forward_hook(
                wrap(self._on_root_post), always_call=True), "root hook")
            owner.on_restore(self._remove_global_hook, "module forward hooks")
            if self.grads:
                self._attach_param_hooks(owner, wrap)
            if self.params:
                self._attach_optimizer_hook(owner, wrap)
        except BaseException:
            owner.restore()
            raise
        self._owner = owner
        return self

    def stop(self) -> Inspector:
        """Remove every hook and move the last step's statistics to the host."""
        owner, self._owner = self._owner, None
        try:
            if owner is not None:
                owner.restore()
        finally:
            self._flush()
        return self

    def __enter__(self) -> Inspector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        """End the current step now. From the first call on, only `step()` advances steps;
        with gradient accumulation (several forwards per optimiser step) pass
        `steps="manual"` so that the first step is counted the same way."""
        self._manual_steps = True
        self._begin_step()

    def flush(self) -> None:
        """Move the statistics recorded so far in this step to the host now."""
        self._flush()

    # --- results ----------------------------------------------------------------------------
    def frame(self, ranks: str | None = None):
        """All recorded rows as a pandas DataFrame (columns: `COLUMNS`).

        ranks: None for this process's rows; "all" for every rank's rows of a torch.distributed
            job, gathered on its process group (a collective: call it on every rank). Outside a
            multi-process job both give this process's rows.
        """
        from .records import gather

        self._flush()
        return gather(_to_frame(self._records), ranks)

    def save(self, path: str | os.PathLike):
        """Write this process's records to an SQLite file; returns the path written.

        In a job of several processes each rank writes its own file: `run.db` becomes
        `run.rank<N>.db` (or put `{rank}` in the path, or give a directory). Read them back,
        all ranks merged, with `singlecard_nb.load(path)`.
        """
        from .records import save

        return save(self.frame(), path, meta={
            "model": type(self.model).__name__, "every": self.every, "grads": self.grads,
            "params": self.params, "include": self.include, "exclude": self.exclude,
            "steps_recorded": self.steps_recorded, "rows_dropped": self._dropped})

    def last_step(self):
        """Rows of the latest recorded step whose statistics reached the host."""
        if not self._records:
            return _to_frame([])
        step = self._records[-1].meta[0][0]
        return _to_frame([r for r in self._records if r.meta[0][0] == step])

    def history(self, stat: str = "absmax", io: str = "output"):
        """A module x step table of one statistic (each module's first call, first tensor)."""
        import pandas as pd

        if stat not in VALUES:
            raise ValueError(f"stat must be one of {', '.join(VALUES)}; got {stat!r}")
        self._flush()
        column = VALUES.index(stat)
        series: dict[int, dict[str, float]] = {}
        for record in self._records:
            step = series.setdefault(record.meta[0][0], {})
            for path, row in record.first_rows(io).items():
                step.setdefault(path, record.values[row, column])
        return pd.DataFrame(series)

    def histograms(self) -> dict[str, tuple[Any, Any]]:
        """Latest histograms (counts, edges as numpy arrays) of modules selected by `hist`."""
        self._flush()
        return dict(self._histograms)

    def summary(self) -> Summary:
        """Per-module aggregate over steps; renders as a table in notebooks."""
        return Summary(self)

    def add_listener(self, fn: Callable[[Inspector], None]) -> None:
        """Call `fn(insp)` each time a recorded step's statistics reach the host."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Inspector], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def live(self):
        """Display a view of the latest step that updates in place while training runs."""
        from .live import live_view

        return live_view(self)

    def plot(self, stat: str = "absmax"):
        """A module x step heatmap of `stat` (matplotlib Figure)."""
        from .plots import heatmap

        return heatmap(self, stat)

    def hist(self, modules=None, bins: int | None = None):
        """Histograms of activation values of `modules` (globs), computed on the device.

        Histograms are taken for the modules given as `hist=` and, from the next recorded step
        on, for any `modules` asked for here; no activation is kept for them. On a GPU each
        histogram reads its range back once (torch.histc), so ask only for the modules you need.
        """
        from .plots import histograms

        added = self._track_histograms(_globs(modules) or [])
        try:
            return histograms(self, modules, bins or self.hist_bins)
        except ValueError:
            if not added:
                raise
            raise ValueError(
                f"no histogram recorded yet for {', '.join(added)}: they are taken from the next "
                "recorded step on. Run a step, then call insp.hist() again.") from None

    def _track_histograms(self, patterns: list[str]) -> list[str]:
        """Also take histograms for modules matching `patterns`; returns the newly tracked paths."""
        added = []
        for target in self._targets.values():
            if not target.hist and _matches(target.path, target.type_name, patterns):
                target.hist = True
                added.append(target.path or "''")
        self.hist_patterns = (self.hist_patterns or []) + patterns
        return added

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()

    def __repr__(self) -> str:
        state = "active" if self.active else "stopped"
        return (f"<Inspector {type(self.model).__name__}: {state}, {len(self._targets)} modules, "
                f"{self.steps_recorded} steps recorded, {self._row_count} rows>")

    # --- hooks ------------------------------------------------------------------------------
    def _select_targets(self) -> dict[int, _Target]:
        targets = {}
        for path, module in self.model.named_modules(remove_duplicate=True):
            type_name = type(module).__name__
            if self.include is not None and not _matches(path, type_name, self.include):
                continue
            if self.exclude is not None and _matches(path, type_name, self.exclude):
                continue
            hist = self.hist_patterns is not None and _matches(path, type_name, self.hist_patterns)
            targets[id(module)] = _Target(path, type_name, hist)
        return targets

    def _attach_param_hooks(self, owner: Borrowed, wrap) -> None:
        seen: set[int] = set()
        for module in self.model.modules():
            target = self._targets.get(id(module))
            if target is None:
                continue
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen or not param.requires_grad:
                    continue
                seen.add(id(param))
                hook = wrap(self._param_grad_hook(target, name))
                owner.add_handle(param.register_post_accumulate_grad_hook(hook),
                                 f"grad hook {target.path}.{name}")

    def _attach_optimizer_hook(self, owner: Borrowed, wrap) -> None:
        """params=True: after each optimiser step, record the parameters it updated and the
        gradients it used (under DDP: after their all-reduce, so equal on every rank)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._param_targets: dict[int, tuple[_Target, str]] = {}
        for module in self.model.modules():
            target = self._targets.get(id(module))
            if target is not None:
                for name, param in module.named_parameters(recurse=False):
                    self._param_targets.setdefault(id(param), (target, name))
        handle = register_optimizer_step_post_hook(wrap(self._on_optimizer_step))

        def remove() -> None:
            handle.remove()
            self._warn_if_no_optimizer_step()  # when inspection ends: say if nothing was seen

        owner.on_restore(remove, "optimizer step hook")

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._owner is None or not self._recording:
            return
        mine = [(p, *self._param_targets[id(p)]) for group in optimizer.param_groups
                for p in group["params"] if id(p) in self._param_targets]
        if mine:
            self._optimizer_steps += 1
        for param, target, name in mine:
            key = ("param", id(param))  # an optimiser stepping twice in one step: call 0, 1
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
            self._guarded(self._record_tensor, target, call, "param", name, param.detach())
            if param.grad is not None:
                self._guarded(self._record_tensor, target, call, "step_grad", name, param.grad)

    def _warn_if_no_optimizer_step(self) -> None:
        if self._optimizer_steps == 0 and self._step >= 0:
            warnings.warn(
                "singlecard_nb: params=True, but no torch.optim optimiser stepped this model's "
                "parameters on a recorded step, so there are no 'param' / 'step_grad' rows "
                "(parameters updated by hand are not seen).", RuntimeWarning, stacklevel=4)

    def _install_global_hook(self) -> None:
        if self._global_handle is None:
            self._global_handle = register_module_forward_hook(self._forward_hook, with_kwargs=True)

    def _remove_global_hook(self) -> None:
        handle, self._global_handle = self._global_handle, None
        if handle is not None:
            handle.remove()

    def _begin_step(self) -> None:
        self._flush()
        self._step += 1
        self._recording = self._step % self.every == 0
        self._calls.clear()

    def _on_root_pre(self, module, args, kwargs) -> None:
        if _is_compiling():
            return
        self._root_depth += 1
        if self._root_depth > 1:
            return  # a recursive call of the root is part of the same step
        if not self._manual_steps or self._step < 0:
            self._begin_step()
        if not self._recording:
            return
        # The global hook exists only while the inspected model runs: other models, and steps
        # that are not recorded, keep torch's fast path.
        self._install_global_hook()
        if self.inputs == "root":
            target = self._targets.get(id(module))
            if target is not None:
                call = self._calls.get(id(module), 0)  # the forward hook counts this call
                self._guarded(self._record_structure, target, call, "input", (args, kwargs))

    def _on_root_post(self, module, args, output) -> None:
        self._root_depth = max(self._root_depth - 1, 0)
        if self._root_depth == 0:
            self._remove_global_hook()

    def _on_forward(self, module, args, kwargs, output) -> None:
        target = self._targets.get(id(module))
        if target is None or not self._recording or _is_compiling():
            return
        key = id(module)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        try:
            if self.inputs is True:
                self._record_structure(target, call, "input", (args, kwargs))
            inputs = (args, kwargs) if self.trap else None
            if type(output) is torch.Tensor:  # the common case, without walking a structure
                self._record_tensor(target, call, "output", "", output, inputs)
            else:
                self._record_structure(target, call, "output", output, inputs)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, target.path)

    def _record_structure(self, target: _Target, call: int, io: str, obj: Any,
                          inputs: Any = None) -> None:
        if io == "input":
            args, kwargs = obj
            items = list(_walk(args))
            items += [(f"[{k!r}]", t) for k, v in kwargs.items() for _, t in _walk(v)]
        else:
            items = _walk(obj)
        for index, tensor in items:
            self._record_tensor(target, call, io, index, tensor, inputs)

    def _record_tensor(self, target: _Target, call: int, io: str, index: str,
                       t: torch.Tensor, inputs: Any = None) -> None:
        pending = self._pending
        shape = tuple(t.shape)
        dtype = t.dtype
        slot = None
        if reducible(t):
            cached = self._seen.get(id(t))
            if cached is not None and cached[0]() is t and cached[1] == t._version:
                slot = cached[2]  # a container's output seen again: reuse its statistics
            else:
                slot = pending.stats.add(t, shape, immediate=self.trap)
                if len(self._seen) >= _SEEN_WINDOW:
                    self._seen.clear()
                self._seen[id(t)] = (weakref.ref(t), t._version, slot)
                if target.hist and io == "output":
                    self._take_histogram(target.path, t)
        pending.rows.append((self._step, target.path, target.type_name, call, io, index, shape,
                             _DTYPE_NAMES.get(dtype) or str(dtype)[6:], _device_name(t.device)))
        pending.slots.append(slot)
        if self.trap and slot is not None:
            self._check_finite(target, call, io, index, slot, inputs)
        if self.grads and io == "output" and t.requires_grad:
            t.register_hook(self._grad_hook(target, call, index))

    def _check_finite(self, target, call, io, index, slot, inputs) -> None:
        values = self._pending.stats.value(slot)
        nan, inf = int(values[5] or 0), int(values[6] or 0)
        if nan or inf:
            inputs_finite = None
            if inputs is not None:
                inputs_finite = all(
                    bool(torch.isfinite(t).all()) for _, t in _walk(inputs)
                    if reducible(t) and (t.is_floating_point() or t.is_complex()))
            self._flush()
            raise NonFiniteError(target.path, target.type_name, io, index, self._step, call,
                                 nan, inf, inputs_finite)

    def _grad_hook(self, target: _Target, call: int, index: str):
        step = self._step

        def on_grad(grad: torch.Tensor) -> None:
            if self._owner is not None and grad is not None:
                self._guarded(self._record_grad, target, call, "grad", index, grad, step)

        return on_grad

    def _param_grad_hook(self, target: _Target, name: str):
        def on_param_grad(param: torch.Tensor) -> None:
            if self._owner is not None and self._recording and param.grad is not None:
                self._guarded(self._record_grad, target, 0, "param_grad", name, param.grad,
                              self._step)

        return on_param_grad

    def _record_grad(self, target, call, io, index, grad, step) -> None:
        if step != self._step:
            return  # a backward through a graph of an older step: not this step's gradient
        self._record_tensor(target, call, io, index, grad)

    def _take_histogram(self, path: str, t: torch.Tensor) -> None:
        values = torch.nan_to_num(t.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
        lo_hi = torch.stack(torch.aminmax(values))
        self._pending.hists[path] = (torch.histc(values, bins=self.hist_bins), lo_hi)

    def _guarded(self, fn, *args) -> None:
        """Run a recording step; a failure is recorded and warned about once, never raised."""
        try:
            fn(*args)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, args[0].path if args and isinstance(args[0], _Target) else "?")

    def _failed(self, error: Exception, path: str) -> None:
        self.errors.append(f"{type(error).__name__} while inspecting {path!r}: {error}")
        del self.errors[:-100]
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"singlecard_nb: {type(error).__name__} while inspecting {path!r}: {error}. The "
                "forward pass goes on unchanged; that tensor is not recorded. Further failures "
                "are only listed in insp.errors.", RuntimeWarning, stacklevel=3)

    # --- moving results to the host ---------------------------------------------------------
    def _flush(self) -> None:
        """Move the pending step's statistics to the host (one transfer per device)."""
        with self._lock:
            pending, self._pending = self._pending, _Pending(self.exact_std)
            self._seen.clear()
        if not pending.rows:
            return
        record = _StepRecord(pending.rows, pending.stats.table(pending.slots), _rank())
        for path, (counts, lo_hi) in pending.hists.items():
            lo, hi = lo_hi.tolist()
            self._histograms[path] = (counts.cpu().numpy(), np.linspace(lo, hi, len(counts) + 1))
        if record.meta[0][0] != self._last_flushed_step:  # a step can reach the host in parts
            self.steps_recorded += 1
        self._last_flushed_step = record.meta[-1][0]
        self._keep(record)
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception as e:
                self.errors.append(f"listener {listener!r} failed: {e!r}")

    def _keep(self, record: _StepRecord) -> None:
        """Append a record, dropping the oldest rows beyond max_rows (a ring buffer)."""
        self._records.append(record)
        self._row_count += len(record.meta)
        excess = self._row_count - self.max_rows
        if excess <= 0:
            return
        if self._dropped == 0:
            warnings.warn(
                f"singlecard_nb: max_rows={self.max_rows} reached; the oldest rows are now "
                "dropped (ring buffer). Pass inspect(..., max_rows=N) or every=N to keep more "
                "steps.", RuntimeWarning, stacklevel=4)
        self._dropped += excess
        self._row_count -= excess
        while excess > 0:
            oldest = self._records[0]
            if len(oldest.meta) <= excess:
                self._records.popleft()
                excess -= len(oldest.meta)
            else:
                self._records[0] = _StepRecord(oldest.meta[excess:], oldest.values[excess:],
                                               oldest.rank)
                excess = 0


def _to_frame(records: Sequence[_StepRecord]):
    import pandas as pd

    meta = [row for record in records for row in record.meta]
    frame = pd.DataFrame(meta, columns=list(COLUMNS[:9]))
    if records:
        values = np.concatenate([record.values for record in records])
    else:
        values = np.empty((0, len(VALUES)))
    for i, name in enumerate(VALUES):
        column = values[:, i]
        # counts are integers, missing (<NA>) where no statistics were taken
        frame[name] = pd.array(column, dtype="Int64") if name in ("nan", "inf") else column
    frame["rank"] = np.repeat([r.rank for r in records], [len(r.meta) for r in records])
    return frame


class Summary:
    """Per-module aggregate of an Inspector's rows (output tensors), rendered as a table."""

    def __init__(self, inspector: Inspector):
        frame = inspector.frame()
        self.frame = _aggregate(frame)

    def _repr_html_(self) -> str:
        if self.frame.empty:
            return "<p><b>singlecard_nb</b>: no rows recorded yet.</p>"
        return html_table(self.frame, bad=self.frame["nan"].gt(0) | self.frame["inf"].gt(0))

    def __repr__(self) -> str:
        if self.frame.empty:
            return "singlecard_nb: no rows recorded yet."
        return self.frame.to_string()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"
    return html.escape(str(value))


def html_table(frame, bad=None) -> str:
    """A compact HTML table of a DataFrame; rows where `bad` is true are highlighted."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False)):
        style = ' style="background:#fdd"' if bad is not None and bool(bad.iloc[i]) else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>")
    return (f'<table class="singlecard-nb"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _aggregate(frame):
    import pandas as pd

    outputs = frame[frame["io"] == "output"]
    if outputs.empty:
        return pd.DataFrame()
    grouped = outputs.groupby(["module", "type", "index"], sort=False, dropna=False)
    table = grouped.agg(
        steps=("step", "nunique"), calls=("call", "max"), shape=("shape", "last"),
        dtype=("dtype", "last"), mean=("mean", "mean"), std=("std", "mean"),
        min=("min", "min"), max=("max", "max"), absmax=("absmax", "max"),
        nan=("nan", "sum"), inf=("inf", "sum"), zeros=("zeros", "mean"),
    )
    table["calls"] = table["calls"] + 1
    return table.reset_index()


def inspect(model: nn.Module, include=None, exclude=None, every: int = 1, grads: bool = False,
            trap: bool = False, max_rows: int | None = None, *, inputs: bool | str = "root",
            hist=None, hist_bins: int = 64, exact_std: bool = False,
            steps: str = "forward", params: bool = False) -> Inspector:
    """Inspect `model`: use as `with inspect(model) as insp:` or call `.start()` / `.stop()`.

    include, exclude: glob patterns (str, comma-separated str, or list) matched against module
        paths from `named_modules()` (the root is "") and class names.
    every: record steps 0, N, 2N...; a step is one call of `model`'s forward, or what lies
        between two `insp.step()` calls once you call it.
    grads: also record gradients of module outputs ("grad") and parameter gradients
        ("param_grad", index = parameter name).
    trap: raise NonFiniteError at the first module output or gradient containing NaN/Inf. This
        reads each result at once, so on a GPU it synchronises once per module.
    max_rows: bound on rows kept (ring buffer; default 100 000); a warning says when reached.
    inputs: "root" records the model's own inputs (keyword inputs included), True every
        module's inputs, False none.
    hist: globs of modules whose activation histograms are kept (latest step; see `insp.hist`).
    exact_std: two-pass exact std instead of the one-pass sum of squares (slower).
    steps: "forward" (each call of `model` is a step) or "manual" (only `insp.step()`
        advances; for gradient accumulation).
    params: after each optimiser step (torch.optim), record every parameter it updated
        ("param", index = parameter name) and the gradient it used ("step_grad": under DDP
        after the all-reduce). Parameters identical across ranks are what DDP promises;
        `compare_ranks` checks them.
    """
    return Inspector(model, include, exclude, every, grads, trap, max_rows, inputs, hist,
                     hist_bins, exact_std, steps, params).start()
