"""Per-module tensor shapes and statistics on forward and backward passes.

    with singlecard_nb.inspect(model) as insp:
        loss = model(x).sum(); loss.backward()
    insp.frame()      # one row per (step, module call, tensor)

How it stays cheap: module outputs are caught by one *global* forward hook, installed only for
the steps that are recorded (`every=N` leaves plain module calls on the other steps); a dict maps
each inspected module to its path. Statistics are taken on the tensor's device (see `stats.py`),
and reach the host once per step. No activation is referenced after its hook returns.

What a step is: one call of the model (its root pre-hook opens it), one call of a Lightning-style
`training_step` / `validation_step` / ..., or, with `steps="manual"`, what lies between two
`insp.step()` calls. Real training code leaves that simple picture in a few ways, each handled
where it happens: Ctrl-C skips torch's always-called hooks (`_settle_open_call`), gradient
checkpointing re-runs forwards inside backward (`_on_recomputed`), another thread may run the
model or read frames (one lock around the pending step), compiled modules would bypass the hooks
(they run eagerly while inspected).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import sys
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from ..borrow import Borrowed
from ..errors import NonFiniteError
from .stats import VALUES, StepStats, reducible
from .structures import MAX_OBJECTS_PER_OUTPUT, MAX_TENSORS_PER_OUTPUT, odd_shape, walk_tensors
from .summary import Summary

# `training` is the module's .training flag at the call (train vs eval); it comes last so that
# the columns of version 0.1 keep their places.
COLUMNS = (
    "step", "module", "type", "call", "io", "index", "shape", "dtype", "device",
    "mean", "std", "min", "max", "absmax", "nan", "inf", "zeros", "rank", "training",
)
_META = (*COLUMNS[:9], "training")  # the row tuple of one tensor, without statistics and rank
DEFAULT_MAX_ROWS = 100_000
# A container's output is the same tensor as a child's, seen a few hooks earlier: remembering
# only the last few keeps dedupe's weak references from piling up for the garbage collector.
_SEEN_WINDOW = 64
# Methods a LightningModule (or anything shaped like one) is driven through instead of forward.
STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_get_ident = threading.get_ident
_CALL_IMPL = nn.Module._call_impl.__code__
# torch's handle for register_module_forward_hook(..., with_kwargs=True) does not remove the
# with_kwargs entry it made (torch <= 2.13): the engine removes it itself.
_GLOBAL_WITH_KWARGS: dict = getattr(_module_globals, "_global_forward_hooks_with_kwargs", {})
_TORCH_COMPILE_HOOK_NOTE = r"Using `torch.compile\(module\)` when there are global hooks"

# Inspectors recording a model (one per model: a re-run cell replaces the older one), and the
# latest started per model for `inspector(model)`; keys are id(model), checked against .model.
_active: dict[int, Inspector] = {}
_latest: weakref.WeakValueDictionary[int, Inspector] = weakref.WeakValueDictionary()


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
    _first_rows: dict[tuple, dict[str, int]] = dataclasses.field(default_factory=dict)

    def first_rows(self, io: str, training: bool | None = None) -> dict[str, int]:
        """Module path -> row of its first `io` tensor in its earliest call (cached); with
        `training` given, only among rows with that .training flag."""
        key = (io, training)
        first = self._first_rows.get(key)
        if first is None:
            first = self._first_rows[key] = {}
            earliest: dict[str, int] = {}
            for i, (_, path, _, call, row_io, *_rest, flag) in enumerate(self.meta):
                if row_io != io or (training is not None and flag != training):
                    continue
                if path not in first or call < earliest[path]:
                    first[path], earliest[path] = i, call
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


_OWN_FILES = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))


def _user_stacklevel() -> int:
    """The warnings stacklevel of the first caller outside singlecard_nb and torch (a warning
    from a hook then points at the user's line that ran the model)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_FILES):
        frame, level = frame.f_back, level + 1
    return level


def _in_backward() -> bool:
    """True while autograd's engine runs a backward pass (where checkpointing recomputes)."""
    return _graph_task_id() != -1


def _calls_on_stack(frame: Any, module: nn.Module) -> int:
    """How many calls of `module` (its nn.Module._call_impl frames) are running in this stack."""
    count = 0
    while frame is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            count += 1
        frame = frame.f_back
    return count


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


class _StepMethod:
    """A model's training_step (or validation_step...) while inspected: each call is a step.

    Set on the model instance (and removed by the inspector's owner). A copy of the model made
    meanwhile (deepcopy by an EMA or SWA callback, pickling) gets the plain method of the copy.
    """

    def __init__(self, inspector: Inspector, method: Callable):
        self._inspector = inspector
        functools.update_wrapper(self, method)  # __wrapped__: Lightning's is_overridden, inspect

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opened = self._inspector._open_call("method")
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            if opened is not None:
                self._inspector._close_call(opened)

    def __reduce__(self):
        method = self.__wrapped__
        return getattr, (method.__self__, method.__name__)

    def __deepcopy__(self, memo: dict) -> Any:
        method = self.__wrapped__
        copied = memo.get(id(method.__self__), method.__self__)
        return getattr(type(copied), method.__name__).__get__(copied)


class Inspector:
    """Records shapes and statistics of module tensors; see `inspect()` for the options."""

    def __init__(self, model: nn.Module, include=None, exclude=None, every: int = 1,
                 grads: bool = False, trap: bool = False, max_rows: int | None = None,
                 inputs: bool | str = "root", hist=None, hist_bins: int = 64,
                 exact_std: bool = False, steps: str = "forward", params: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"inspect() needs an nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.jit.ScriptModule):
            raise TypeError(
                f"inspect() got a TorchScript module ({type(model).__name__}, from torch.jit."
                "script, trace or load): it runs as TorchScript, not Python, so no hook can see "
                "the modules inside it. inspect the nn.Module before scripting or tracing it "
                "(scn.inspect(model), then torch.jit.trace(model, ...) when you are done).")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if max_rows is not None and (not isinstance(max_rows, int) or max_rows < 1):
            raise ValueError(f"max_rows must be a positive integer or None, got {max_rows!r}")
        if steps not in ("forward", "manual"):
            raise ValueError(f"steps must be 'forward' or 'manual', got {steps!r}")
        if inputs not in (True, False, "root"):
            raise ValueError(f"inputs must be True, False or 'root', got {inputs!r}")
        self._wrapper: nn.Module | None = None
        original = getattr(model, "_orig_mod", None)
        if isinstance(original, nn.Module):  # a torch.compile(...) wrapper: it runs the original
            self._wrapper, model = model, original
        self.model = model
        self.include, self.exclude = _globs(include), _globs(exclude)
        self.every, self.grads, self.trap = every, grads, trap
        self.max_rows = max_rows or DEFAULT_MAX_ROWS
        self.inputs = inputs
        self.hist_patterns, self.hist_bins = _globs(hist), hist_bins
        self.exact_std = exact_std
        self.errors: list[str] = []  # failures inside the inspector, never raised to the user
        self.notes: list[str] = []  # what could not be recorded as asked, said once per kind
        self.steps_recorded = 0
        self._records: deque[_StepRecord] = deque()
        self._row_count = 0
        self._dropped = 0
        self._histograms: dict[str, tuple[Any, Any]] = {}
        self._listeners: list[Callable[[Inspector], None]] = []
        self._owner: Borrowed | None = None
        self._global_handle = None
        self._targets: dict[int, _Target] = {}  # every inspected module
        self._hooked: dict[int, _Target] = {}  # those the global hook records (see _attach_late)
        self._probes: list = []  # handles of the "called some other way" probes
        self._probed: set[int] = set()  # ids of the children the probe watches
        self._tensor_hooks: list = []  # gradient hooks put on this step's tensors
        self._step = -1
        self._recording = False
        self._manual_steps = steps == "manual"
        self.params = params
        self._optimizer_steps = 0  # optimiser steps that updated this model's parameters
        # The open call: how deep calls of the model (and of its step methods) are nested in
        # the thread that runs them, and how many of those are calls of the model itself.
        self._depth = 0
        self._root_depth = 0
        self._thread = 0
        self._calls: dict[Any, int] = {}  # id(module), ("param", id), "buffers" -> count
        self._recomputed_calls: dict[int, int] = {}
        self._recomputed_task = -1
        self._seen: dict[int, tuple] = {}  # id(tensor) -> (weakref, _version, slot): dedupe
        self._pending = _Pending(exact_std)
        # One lock around the pending step: the model may run in one thread (and its backward
        # in autograd's) while another reads frames.
        self._lock = threading.RLock()
        self._warned = False
        self._said: set[str] = set()
        self._last_flushed_step = -1

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._owner is not None

    def start(self) -> Inspector:
        """Attach hooks (one owner removes them all); idempotent.

        Starting an inspector on a model that another active inspector records stops that one
        (a re-run notebook cell would otherwise stack recorders).
        """
        if self._owner is not None:
            return self
        previous = _active.get(id(self.model))
        if previous is not None and previous is not self and previous.model is self.model:
            previous.stop()
            self._say("replaced", "this inspector replaces the inspector already recording "
                      f"this {type(self.model).__name__} (stopped; its rows stay readable). One "
                      "model has one recording inspector: a re-run cell does not stack them.")
        if self._manual_steps and self._step < 0:
            self._step = 0  # manual steps: step 0 starts now
            self._recording = True
        self._depth = self._root_depth = 0
        owner = Borrowed(f"inspect({type(self.model).__name__})")
        try:
            self._targets = self._select_targets()
            self._hooked = dict(self._targets)
            self._forward_hook = self._on_forward
            self._run_compiled_modules_eagerly(owner)
            self._attach_late(owner)  # before the root's hooks: those are not the user's
            # The root hooks always run eagerly, also where torch.compile traces the model from
            # outside (compiled code then bypasses the module hooks: _on_root_post says so).
            owner.add_handle(self.model.register_forward_pre_hook(
                _eager(self._on_root_pre), with_kwargs=True), "root pre-hook")
            owner.add_handle(self.model.register_forward_hook(
                _eager(self._on_root_post), always_call=True), "root hook")
            self._wrap_step_methods(owner)
            owner.on_restore(self._remove_global_hook, "module forward hooks")
            owner.on_restore(self._remove_tensor_hooks, "gradient hooks on this step's tensors")
            if self.grads:
                self._attach_param_hooks(owner)
            if self.params:
                self._attach_optimizer_hook(owner)
            if self._manual_steps and self._recording:
                self._install_global_hook()  # a manual step records every call until step()
            elif self._step < 0:
                self._attach_probes(owner)
        except BaseException:
            owner.restore()
            raise
        self._owner = owner
        _active[id(self.model)] = self
        _latest[id(self.model)] = self
        if self._wrapper is not None:
            _latest[id(self._wrapper)] = self
        return self

    def stop(self) -> Inspector:
        """Remove every hook and move the last step's statistics to the host."""
        owner, self._owner = self._owner, None
        if _active.get(id(self.model)) is self:
            del _active[id(self.model)]
        try:
            if owner is not None:
                owner.restore()
        finally:
            self._depth = self._root_depth = 0
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
        self._remove_probes()
        self._begin_step()

    def flush(self) -> None:
        """Move the statistics recorded so far in this step to the host now (and close a call
        of the model that Ctrl-C interrupted: `%inspect` does this after each cell)."""
        self._flush()
        self._settle_open_call(_get_ident())

    # --- results ----------------------------------------------------------------------------
    def frame(self, ranks: str | None = None):
        """All recorded rows as a pandas DataFrame (columns: `COLUMNS`); safe to call from
        another thread while the model runs (a snapshot of the steps that reached the host).

        ranks: None for this process's rows; "all" for every rank's rows of a torch.distributed
            job, gathered on its process group (a collective: call it on every rank). Outside a
            multi-process job both give this process's rows.
        """
        from .records import gather

        self._flush()
        return gather(_to_frame(self._snapshot()), ranks)

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
        records = self._snapshot()
        if not records:
            return _to_frame([])
        step = records[-1].meta[0][0]
        return _to_frame([r for r in records if r.meta[0][0] == step])

    def history(self, stat: str = "absmax", io: str = "output", training: bool | None = None):
        """A module x step table of one statistic (each module's first call, first tensor).

        training: True keeps rows of modules in train mode, False in eval mode, None both.
        """
        import pandas as pd

        if stat not in VALUES:
            raise ValueError(f"stat must be one of {', '.join(VALUES)}; got {stat!r}")
        self._flush()
        column = VALUES.index(stat)
        series: dict[int, dict[str, float]] = {}
        for record in self._snapshot():
            rows = record.first_rows(io, training)
            if not rows:
                continue
            step = series.setdefault(record.meta[0][0], {})
            for path, row in rows.items():
                step.setdefault(path, record.values[row, column])
        return pd.DataFrame(series)

    def histograms(self) -> dict[str, tuple[Any, Any]]:
        """Latest histograms (counts, edges as numpy arrays) of modules selected by `hist`."""
        self._flush()
        with self._lock:
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

    def plot(self, stat: str = "absmax", training: bool | None = None):
        """A module x step heatmap of `stat` (matplotlib Figure); steps run in eval mode are
        marked. training: True or False keeps only rows in that mode."""
        from .plots import heatmap

        return heatmap(self, stat, training=training)

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

    def __deepcopy__(self, memo: dict) -> Inspector:
        # A deepcopy of the inspected model (EMA, SWA) copies its hooks, and with them bound
        # methods of this inspector: they stay this inspector's, which ignores the copy.
        return self

    def __repr__(self) -> str:
        state = "active" if self.active else "stopped"
        return (f"<Inspector {type(self.model).__name__}: {state}, {len(self._targets)} modules, "
                f"{self.steps_recorded} steps recorded, {self._row_count} rows>")

    # --- attaching --------------------------------------------------------------------------
    def _select_targets(self) -> dict[int, _Target]:
        targets = {}
        scripted: list[str] = []
        for path, module in self.model.named_modules(remove_duplicate=True):
            if any(path.startswith(f"{outer}.") for outer in scripted):
                continue  # inside TorchScript: no Python hook ever runs there
            type_name = type(module).__name__
            if isinstance(module, torch.jit.ScriptModule):
                scripted.append(path)
            if self.include is not None and not _matches(path, type_name, self.include):
                continue
            if self.exclude is not None and _matches(path, type_name, self.exclude):
                continue
            hist = self.hist_patterns is not None and _matches(path, type_name, self.hist_patterns)
            targets[id(module)] = _Target(path, type_name, hist)
        for path in scripted:
            self._say(f"script:{path}", f"{path!r} is a TorchScript module (torch.jit.script or "
                      "trace): its inputs and outputs are recorded, the modules inside it are not "
                      "(TorchScript runs no Python hooks).")
        return targets

    def _run_compiled_modules_eagerly(self, owner: Borrowed) -> None:
        """Compiled code bypasses module hooks: while inspected, compiled modules run eagerly."""
        compiled = []
        for path, m in self.model.named_modules():
            if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile()
                owner.set_attr(m, "_compiled_call_impl", None, "compiled module runs eagerly")
                compiled.append(repr(path))
        if self._wrapper is not None:  # torch.compile(module): call the original instead
            owner.set_attr(self._wrapper, "forward", self.model.__call__,
                           "torch.compile wrapper runs the original module")
            # torch notes that global hooks also fire for the wrapper; ours ignore it
            warnings.filterwarnings("ignore", message=_TORCH_COMPILE_HOOK_NOTE)
            owner.on_restore(functools.partial(_remove_filter, warnings.filters[0]),
                             "warnings filter for torch.compile's global hook note")
            compiled.insert(0, f"the torch.compile wrapper of {type(self.model).__name__}")
        if compiled:
            listed = ", ".join(compiled[:5]) + (", ..." if len(compiled) > 5 else "")
            self._say("compiled", f"compiled modules run eagerly while inspected ({listed}), so "
                      "that every module inside them is recorded; the values are those of the "
                      "eager model. insp.stop() gives the compiled code back.")

    def _wrap_step_methods(self, owner: Borrowed) -> None:
        """Lightning drives a LightningModule through training_step & co., not forward: each
        call of one of those is a step too."""
        for name in STEP_METHODS:
            method = getattr(self.model, name, None)
            if callable(method) and getattr(method, "__self__", None) is self.model:
                owner.set_attr(self.model, name, _StepMethod(self, method), f"{name} is a step")

    def _attach_late(self, owner: Borrowed) -> None:
        """torch runs global forward hooks before a module's own: a module with its own forward
        hooks (which may replace its output) is recorded by a hook of its own, added after them,
        so that its rows hold what its caller receives."""
        for module in self.model.modules():
            target = self._targets.get(id(module))
            if (target is not None and module._forward_hooks
                    and not isinstance(module, torch.jit.ScriptModule)):
                del self._hooked[id(module)]
                hook = functools.partial(self._on_forward, own_hooks=True)
                owner.add_handle(module.register_forward_hook(hook, with_kwargs=True),
                                 f"forward hook after those of {target.path or 'the model'}")

    def _attach_probes(self, owner: Borrowed) -> None:
        """Until the first step: notice children that run outside a call of the model.

        One global pre-hook, not one per child: registering a hook costs ~10 µs, which a flat
        Sequential of 5 000 layers would pay at every inspect(). It is gone at the first step
        (or once it has spoken), so only calls made before that take torch's hook path.
        """
        self._probed = {id(child) for child in self.model.children()}
        handle = register_module_forward_pre_hook(self._on_child_probe)
        self._probes.append(owner.add_handle(handle, "probe: children called directly"))

    def _remove_probes(self) -> None:
        probes, self._probes = self._probes, []
        for handle in probes:
            handle.remove()

    def _attach_param_hooks(self, owner: Borrowed) -> None:
        seen: set[int] = set()
        for module in self.model.modules():
            target = self._targets.get(id(module))
            if target is None:
                continue
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen or not param.requires_grad:
                    continue
                seen.add(id(param))
                hook = self._param_grad_hook(target, module, name)
                owner.add_handle(param.register_post_accumulate_grad_hook(hook),
                                 f"grad hook {target.path}.{name}")

    def _attach_optimizer_hook(self, owner: Borrowed) -> None:
        """params=True: after each optimiser step, record the parameters it updated and the
        gradients it used (under DDP: after their all-reduce, so equal on every rank)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._param_targets: dict[int, tuple[_Target, str, nn.Module]] = {}
        # Buffers (BatchNorm's running statistics...) with their modules: read after the first
        # optimiser step of each step, when this step's forward has updated them.
        self._buffer_modules: list[tuple[_Target, nn.Module]] = []
        for module in self.model.modules():
            target = self._targets.get(id(module))
            if target is not None:
                for name, param in module.named_parameters(recurse=False):
                    self._param_targets.setdefault(id(param), (target, name, module))
                if next(module.named_buffers(recurse=False), None) is not None:
                    self._buffer_modules.append((target, module))
        handle = register_optimizer_step_post_hook(_eager(self._on_optimizer_step))

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
            if "buffers" not in self._calls:  # once per step (_calls is cleared at each)
                self._calls["buffers"] = 1
                for target, module in self._buffer_modules:
                    for name, buffer in module.named_buffers(recurse=False):
                        self._guarded(self._record_tensor, target, 0, "buffer", name,
                                      buffer.detach(), module.training)
        for param, target, name, module in mine:
            key = ("param", id(param))  # an optimiser stepping twice in one step: call 0, 1
            call = self._calls.get(key, 0)
            self._calls[key] = call + 1
            training = module.training
            self._guarded(self._record_tensor, target, call, "param", name, param.detach(),
                          training)
            if param.grad is not None:
                self._guarded(self._record_tensor, target, call, "step_grad", name, param.grad,
                              training)

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
            _GLOBAL_WITH_KWARGS.pop(handle.id, None)

    def _remove_tensor_hooks(self) -> None:
        with self._lock:
            hooks, self._tensor_hooks = self._tensor_hooks, []
        for handle in hooks:
            handle.remove()

    # --- steps and the open call ------------------------------------------------------------
    def _begin_step(self) -> None:
        if self._probes:  # a step began: the model is called the way the engine expects
            self._remove_probes()
        self._flush()
        # Gradient hooks of the previous step go: tensors that outlive a step (a module
        # returning its own Parameter) would otherwise collect one more hook per step.
        self._remove_tensor_hooks()
        self._step += 1
        self._recording = self._step % self.every == 0
        self._calls.clear()
        if self._recording and self._owner is not None:
            self._install_global_hook()
        else:
            self._remove_global_hook()

    def _spans_step(self) -> bool:
        """Whether the global hook stays installed for the whole step, not only during calls:
        manual steps record every call until step(); gradients need it during backward, where
        gradient checkpointing recomputes forwards (see _on_recomputed)."""
        return self._manual_steps or self.grads

    def _open_call(self, kind: str) -> tuple[int, int] | None:
        """A call of the model (kind "root") or of a step method ("method") begins.

        Returns the nesting to restore when it ends, or None when another thread's call is in
        progress (this call is then not recorded). The outermost call begins a step.
        """
        me = _get_ident()
        with self._lock:
            if self._depth and not self._settle_open_call(me, kind):
                opened = None
            else:
                opened = (self._depth, self._root_depth)
                if self._depth == 0:
                    self._thread = me
                self._depth += 1
                self._root_depth += kind == "root"
        if opened is None:
            self._say("threads", "the model was called from two threads at once: calls made "
                      "while another thread's call is running are not recorded.")
        elif opened[0] == 0 and (not self._manual_steps or self._step < 0):
            self._begin_step()
        return opened

    def _close_call(self, opened: tuple[int, int]) -> None:
        with self._lock:
            if self._thread != _get_ident():
                return
            self._depth, self._root_depth = opened
            if self._depth == 0 and not self._spans_step():
                self._remove_global_hook()

    def _settle_open_call(self, me: int | None = None, kind: str = "") -> bool:
        """Close calls that Ctrl-C left open; True when thread `me` may open a call now.

        torch runs always-called hooks only for Exception, so a KeyboardInterrupt inside the
        model leaves its call open. The calls of the model really running are counted on the
        stack of the thread that opened them (nn.Module._call_impl frames); a step method's own
        `finally` always closes its call, so only calls of the model can be left open.
        """
        with self._lock:
            if not self._depth:
                return True
            owner = self._thread
            stack = sys._getframe() if owner == me else sys._current_frames().get(owner)
            if stack is None:  # the thread that opened the call has ended
                self._depth = self._root_depth = 0
            else:
                running = _calls_on_stack(stack, self.model)
                if owner == me and kind == "root":
                    running -= 1  # the call opening now is on the stack already
                stale = self._root_depth - running
                if stale > 0:
                    self._depth -= stale
                    self._root_depth -= stale
            if self._depth == 0 and not self._spans_step():
                self._remove_global_hook()
            return self._depth == 0 or owner == me

    # --- hooks ------------------------------------------------------------------------------
    def _on_root_pre(self, module, args, kwargs) -> None:
        if module is not self.model or _is_compiling() or _in_backward():
            # a copy of the model carries our hooks (see __deepcopy__): not the model; a
            # recomputation (gradient checkpointing) belongs to the step it recomputes
            return
        try:
            opened = self._open_call("root")
        except Exception as e:
            self._failed(e, "")
            return
        if opened is None or opened[1] or not self._recording or self.inputs != "root":
            return  # a recursive call of the root records no inputs of its own
        target = self._targets.get(id(module))
        if target is not None:
            call = self._calls.get(id(module), 0)  # the forward hook counts this call
            self._guarded(self._record_structure, target, call, "input", (args, kwargs),
                          module.training)

    def _on_root_post(self, module, args, output) -> None:
        if module is not self.model or _is_compiling() or _in_backward():
            return
        if self._depth and self._root_depth and self._thread == _get_ident():
            key = id(self.model)
            if (self._depth == 1 and self._recording and key in self._targets
                    and key not in self._calls and sys.exc_info()[1] is None):
                # the model's own output hook runs before this one unless compiled code
                # bypassed the hooks (or the forward raised: then an exception is being handled)
                self._say("bypassed", f"{type(self.model).__name__} ran, but none of its "
                          "modules reached the inspector: it was run by code compiled with "
                          "torch.compile, which bypasses module hooks. Inspect "
                          "torch.compile(model) itself (it then runs eagerly while inspected), "
                          "or call the model outside the compiled function.")
            self._close_call((self._depth - 1, self._root_depth - 1))

    def _on_child_probe(self, module, args) -> None:
        if (id(module) not in self._probed or self._depth or self._manual_steps
                or id(module) not in self._targets):
            return
        self._remove_probes()
        if self._step < 0:
            path = self._targets[id(module)].path
            name = type(self.model).__name__
            self._say("no-step", f"{path!r} of {name} ran outside a call of the {name} itself "
                      "(called as model.child(...) or from a method other than forward), so it "
                      "starts no step and nothing is recorded. Call the model itself, pass "
                      "steps='manual' and call insp.step() after each step, or inspect the "
                      "submodule you call.")

    def _on_forward(self, module, args, kwargs, output, own_hooks: bool = False) -> None:
        """The global forward hook; with `own_hooks`, the hook of a module with forward hooks of
        its own, which runs after them (see _attach_late). One body for both: this runs once
        per module call, where each Python frame counts."""
        target = (self._targets if own_hooks else self._hooked).get(id(module))
        if target is None or not self._recording or _is_compiling():
            return
        if self._depth and self._thread == _get_ident():
            self._record_call(target, module, args, kwargs, output)
        else:
            self._on_outside_call(target, module, args, kwargs, output)

    def _on_outside_call(self, target, module, args, kwargs, output) -> None:
        """A module call while the hook is installed, but not inside this thread's call."""
        if self._manual_steps and not self._depth:
            self._record_call(target, module, args, kwargs, output)  # manual: all calls count
        elif _in_backward():
            if self.grads:
                self._guarded(self._on_recomputed, target, module, output)
        elif self._depth:
            self._say("threads", "the model was called from two threads at once: calls made "
                      "while another thread's call is running are not recorded.")

    def _on_recomputed(self, target: _Target, module: nn.Module, output: Any) -> None:
        """Gradient checkpointing re-runs a forward during backward. Its outputs are those of
        the step being recomputed: no new rows, but their gradients (with use_reentrant=True
        only the recomputed graph carries them) are that step's, under the same call number."""
        task = _graph_task_id()
        if task != self._recomputed_task:  # a new backward pass: calls count from 0 again
            self._recomputed_task, self._recomputed_calls = task, {}
        key = id(module)
        call = self._recomputed_calls.get(key, 0)
        self._recomputed_calls[key] = call + 1
        items = [("", output)] if type(output) is torch.Tensor else walk_tensors(output)
        for index, t in items:
            if t.requires_grad:
                self._hook_grad(t, target, call, index, module.training)

    def _record_call(self, target: _Target, module: nn.Module, args, kwargs, output) -> None:
        key = id(module)
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        training = module.training
        try:
            if self.inputs is True:
                self._record_structure(target, call, "input", (args, kwargs), training)
            inputs = (args, kwargs) if self.trap else None
            if type(output) is torch.Tensor:  # the common case, without walking a structure
                self._record_tensor(target, call, "output", "", output, training, inputs)
            else:
                self._record_structure(target, call, "output", output, training, inputs)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, target.path)

    def _record_structure(self, target: _Target, call: int, io: str, obj: Any,
                          training: bool, inputs: Any = None) -> None:
        if io == "input":
            args, kwargs = obj
            items = walk_tensors(args)
            for key, value in kwargs.items():
                found = walk_tensors(value, f"[{key!r}]")
                items += found
                items.truncated |= found.truncated
        else:
            items = walk_tensors(obj)
        if items.truncated:
            where = repr(target.path) if target.path else "the model"
            self._say("truncated", f"the {io} of {where} holds more than "
                      f"{MAX_TENSORS_PER_OUTPUT} tensors (or {MAX_OBJECTS_PER_OUTPUT} objects): "
                      "only the first are recorded (for this and any other such structure).")
        for index, tensor in items:
            self._record_tensor(target, call, io, index, tensor, training, inputs)

    def _record_tensor(self, target: _Target, call: int, io: str, index: str,
                       t: torch.Tensor, training: bool, inputs: Any = None) -> None:
        dtype = t.dtype
        values = None
        with self._lock:
            pending = self._pending
            slot = None
            if reducible(t):
                shape = tuple(t.shape)
                try:
                    version = t._version
                except RuntimeError:  # an inference tensor (inference_mode) has no version
                    version = None
                cached = self._seen.get(id(t))
                if (cached is not None and cached[0]() is t and version is not None
                        and cached[1] == version):
                    slot = cached[2]  # a container's output seen again: reuse its statistics
                else:
                    slot = pending.stats.add(t, shape, immediate=self.trap)
                    if len(self._seen) >= _SEEN_WINDOW:
                        self._seen.clear()
                    self._seen[id(t)] = (weakref.ref(t), version, slot)
                if self.trap:
                    values = pending.stats.value(slot)
            else:
                shape = odd_shape(t)
            device = t.device
            pending.rows.append((self._step, target.path, target.type_name, call, io, index,
                                 shape, _DTYPE_NAMES.get(dtype) or str(dtype)[6:],
                                 _DEVICE_NAMES.get(device) or _device_name(device), training))
            pending.slots.append(slot)
            full = len(pending.rows) >= self.max_rows
            if target.hist and io == "output" and slot is not None and t.numel():
                self._guarded(self._take_histogram, target, t)
        if full:  # steps="manual" without step(): pending rows stay bounded too
            self._flush()
        if values is not None:
            self._check_finite(target, call, io, index, values, inputs)
        if self.grads and io == "output" and t.requires_grad:
            self._hook_grad(t, target, call, index, training)

    def _hook_grad(self, t: torch.Tensor, target: _Target, call: int, index: str,
                   training: bool) -> None:
        # Handles are kept so that the hooks go when the step ends (_begin_step, stop).
        handle = t.register_hook(self._grad_hook(target, call, index, training))
        with self._lock:
            self._tensor_hooks.append(handle)

    def _check_finite(self, target, call, io, index, values, inputs) -> None:
        # an empty tensor has no statistics: its counts are NaN, not a NaN found
        nan, inf = (int(v) if v == v and v else 0 for v in values[5:7])
        if nan or inf:
            inputs_finite = None
            if inputs is not None:
                inputs_finite = all(
                    bool(torch.isfinite(t).all()) for _, t in walk_tensors(inputs)
                    if reducible(t) and (t.is_floating_point() or t.is_complex()))
            self._flush()
            raise NonFiniteError(target.path, target.type_name, io, index, self._step, call,
                                 nan, inf, inputs_finite)

    def _grad_hook(self, target: _Target, call: int, index: str, training: bool):
        step = self._step

        def on_grad(grad: torch.Tensor) -> None:
            if self._owner is not None and grad is not None:
                self._guarded(self._record_grad, target, call, "grad", index, grad, step, training)

        return on_grad

    def _param_grad_hook(self, target: _Target, module: nn.Module, name: str):
        def on_param_grad(param: torch.Tensor) -> None:
            if self._owner is not None and self._recording and param.grad is not None:
                self._guarded(self._record_grad, target, 0, "param_grad", name, param.grad,
                              self._step, module.training)

        return on_param_grad

    def _record_grad(self, target, call, io, index, grad, step, training) -> None:
        if step != self._step:
            return  # a backward through a graph of an older step: not this step's gradient
        self._record_tensor(target, call, io, index, grad, training)

    def _take_histogram(self, target: _Target, t: torch.Tensor) -> None:
        values = torch.nan_to_num(t.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
        lo_hi = torch.stack(torch.aminmax(values))
        self._pending.hists[target.path] = (torch.histc(values, bins=self.hist_bins), lo_hi)

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
                "are only listed in insp.errors.", RuntimeWarning, stacklevel=_user_stacklevel())

    def _say(self, kind: str, message: str) -> None:
        """Tell the user once per kind what cannot be recorded as asked (also in insp.notes)."""
        if kind in self._said:
            return
        self._said.add(kind)
        self.notes.append(message)
        warnings.warn(f"singlecard_nb: {message}", UserWarning, stacklevel=_user_stacklevel())

    # --- moving results to the host ---------------------------------------------------------
    def _snapshot(self) -> list[_StepRecord]:
        with self._lock:
            return list(self._records)

    def _flush(self) -> None:
        """Move the pending step's statistics to the host (one transfer per device)."""
        with self._lock:
            pending, self._pending = self._pending, _Pending(self.exact_std)
            self._seen.clear()
            if not pending.rows:
                return
            # Ctrl-C can land between the two appends of _record_tensor
            n = min(len(pending.rows), len(pending.slots))
            rows, slots = pending.rows[:n], pending.slots[:n]
            try:
                values = pending.stats.table(slots)
            except Exception as e:  # e.g. a reduction interrupted half-way: keep the rows
                self._failed(e, f"statistics of step {rows[0][0]}")
                values = np.full((n, len(VALUES)), np.nan)
            record = _StepRecord(rows, values, _rank())
            for path, (counts, lo_hi) in pending.hists.items():
                try:
                    lo, hi = lo_hi.tolist()
                    self._histograms[path] = (counts.cpu().numpy(),
                                              np.linspace(lo, hi, len(counts) + 1))
                except Exception as e:
                    self._failed(e, path)
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

    meta = pd.DataFrame([row for record in records for row in record.meta], columns=list(_META))
    if records:
        values = np.concatenate([record.values for record in records])
    else:
        values = np.empty((0, len(VALUES)))
    columns: dict[str, Any] = {}
    for i, name in enumerate(VALUES):
        column = values[:, i]
        # counts are integers, missing (<NA>) where no statistics were taken
        columns[name] = pd.array(column, dtype="Int64") if name in ("nan", "inf") else column
    columns["rank"] = np.repeat([r.rank for r in records], [len(r.meta) for r in records])
    columns["training"] = meta["training"].astype(bool)
    return pd.concat([meta.iloc[:, :9], pd.DataFrame(columns, index=meta.index)], axis=1)


def _eager(fn: Callable) -> Callable:
    """`fn`, never traced into a compiled graph (torch.compiler.disable where available)."""
    disable = getattr(torch.compiler, "disable", None)
    return disable(fn) if disable is not None else fn


def _remove_filter(entry: tuple) -> None:
    if entry in warnings.filters:
        warnings.filters.remove(entry)
        getattr(warnings, "_filters_mutated", lambda: None)()  # what filterwarnings calls


def inspector(model: nn.Module) -> Inspector:
    """The Inspector most recently started on `model`: by `inspect()`, `%inspect model` or
    `%%inspect model` (also once stopped, while something keeps it). Raises ValueError if none."""
    found = _latest.get(id(model))
    if found is None or (model is not found.model and model is not found._wrapper):
        raise ValueError(f"no inspector has been started on this {type(model).__name__}: start "
                         "one with insp = singlecard_nb.inspect(model) or %inspect model.")
    return found


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
