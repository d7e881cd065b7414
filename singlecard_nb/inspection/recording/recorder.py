"""A recorded call's tensors to rows of the pending step (`pending.py`), which `flush` moves to
the host; the rows of optimiser steps are `optimizer_rows.py`'s.

Per tensor: a row of metadata (a tuple of atomic values) and a statistics slot of `stats.py`;
a container's output that is a child's output seen a few hooks earlier reuses its slot (dedupe).
Gradients are rows too, from hooks put on this step's tensors (removed when the step ends).
With the trap on, each result is read at once and a NaN/Inf raises `NonFiniteError`.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...dtypes import NAMES as _DTYPE_NAMES
from ...dtypes import dtype_name
from ...errors import TRAP_FRAME, NonFiniteError, without_our_frames
from ..diagnostics import Diagnostics
from ..kernel import contiguous_in_place, plain, reducible
from ..memory import MemoryLedger, peak_bytes
from ..targets import Target
from .extras import channel_stats
from .heap import HEAP
from .losses import last_operations
from .pending import Pending
from .store import Store
from .structures import MAX_OBJECTS_PER_OUTPUT, MAX_TENSORS_PER_OUTPUT, odd_shape, walk_tensors

# A container's output is the same tensor as a child's, seen a few hooks earlier: remembering
# only the last few keeps dedupe's weak references from piling up for the garbage collector.
_SEEN_WINDOW = 64
# Dedupe saves a read of a large tensor; below this many values the read costs less than the
# bookkeeping (a weak reference, its look-up), so small tensors are read again.
DEDUPE_NUMEL = 16384
# Rows of tensors made for the row (a parameter's detached view, Δw): never seen again, so
# dedupe cannot pay for them at any size and they take the dense path whole
_FRESH_EACH_TIME = frozenset({"param", "update"})
# What describes the data and the code rather than the step, the model input's per-channel
# statistics and the names of the loss's last operations, is read on steps that are multiples
# of this: on a 4-module MLP they were a third of what --inspect added to each step (~50 and
# ~15 us of ~215), and what the ranking reads of them is the latest, dated with its step
DESCRIBED_EVERY = 16
_FLOAT64, _STRIDED = torch.float64, torch.strided  # module globals: read once per tensor
_PARAMETER = nn.Parameter
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

_ARG_INDEX = tuple(f"[{i}]" for i in range(8))  # walk_tensors' index of positional tensors
_NO_MEMORY = (float("nan"),) * 3  # memory columns of a row that is not an output
_DEVICE_NAMES: dict[torch.device, str] = {}
# The shapes of rows, each one tuple however many rows have it: a row whose shape tuple is as
# new as itself can stay tracked by the garbage collector (it checks the row before the shape)
# and count as long-lived (see _GradHook); an older, untracked shape lets it be untracked
_SHAPES: dict[tuple, tuple] = {}
_SHAPES_KEPT = 4096  # then begun again: a job whose shapes keep changing keeps no more


def _shape(size: torch.Size) -> tuple:
    """`tuple(size)`, the same tuple each time (_SHAPES)."""
    shape = _SHAPES.get(size)  # a torch.Size is a tuple: it finds its tuple
    if shape is None:
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        shape = tuple(size)
        _SHAPES[shape] = shape
    return shape


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


_hook_keys = itertools.count(-1, -1)  # below RemovableHandle's ids (from 0 up): never the same
_has_torch_function = torch._C._has_torch_function_unary


def _add_grad_hook(t: torch.Tensor, hook: Callable) -> tuple:
    """`t.register_hook(hook)` as torch's own does it, without its RemovableHandle (~2 µs of a
    ~3 µs call, once per output of every module call with grads=True): returns (the tensor's
    hook dict, our key), or (torch's handle, None) where torch would do more (a subclass, a
    mode)."""
    if type(t) is not torch.Tensor or _has_torch_function(t):
        return t.register_hook(hook), None
    hooks = t._backward_hooks
    if hooks is None:
        hooks = t._backward_hooks = OrderedDict()
        if t.grad_fn is not None:
            t.grad_fn._register_hook_dict(t)
    key = next(_hook_keys)
    hooks[key] = hook
    return hooks, key


class _GradHook:
    """The gradient hook on one output of a step: records the gradient as a "grad" row of
    the call that made it. One object, where a closure was eight (a function, its cells and
    their tuple): each lives until the step ends, through many collections of the young
    generation, so the garbage collector counts it as long-lived, and enough of those make it
    walk every object of the process (a full collection: 0.2 s under a 5 000-module model,
    every third step with grads=True; benchmarks/per_call.py's table of collections)."""

    __slots__ = ("recorder", "target", "call", "index", "training", "step")

    def __init__(self, recorder: Recorder, target: Target, call: int, index: str,
                 training: bool):
        self.recorder, self.target, self.call = recorder, target, call
        self.index, self.training, self.step = index, training, recorder.step

    def __call__(self, grad: torch.Tensor) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        recorder = self.recorder
        if grad is not None and self.step == recorder.step and recorder._active():
            try:  # (an older step's graph run backward now: not this step's gradient)
                recorder.record_safely(self.target, self.call, "grad", self.index, grad,
                                       self.training)
            except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
                without_our_frames(trapped)
                raise


class Recorder:
    """Records tensors into the pending step and hands finished steps to the store.

    Lock contract: the pending step (rows, slots, dedupe window, gradient hook handles) changes
    only under `lock`, the inspector's one RLock, so that another thread may flush or read
    frames while the model runs (and autograd's thread records gradients). `step` and `calls`
    change only between steps, when the call tracker begins one (`begin_step`).

    active: whether the inspector's hooks are attached (a gradient hook of a stopped inspector
        that still fires records nothing).
    memory: memory=True's ledger (its owner is the Inspector's memory part), or None.
    """

    def __init__(self, store: Store, diagnostics: Diagnostics, lock: threading.RLock,
                 active: Callable[[], bool], *, inputs: bool | str, trap: bool, grads: bool,
                 exact_std: bool, hist_bins: int, memory: MemoryLedger | None = None):
        self.inputs, self.trap, self.grads = inputs, trap, grads
        self.exact_std, self.hist_bins = exact_std, hist_bins
        self.step = -1  # the step the pending rows belong to; the call tracker advances it
        self.calls: dict[Any, int] = {}  # id(module), ("param", id), "buffers" -> count
        self.step_thread: int | None = None
        self.pending = Pending(exact_std, store.max_rows)
        self._spare_rows: tuple | None = None  # a flushed step's RAW rows chunk, see flush
        self.optimizer_steps = 0  # optimiser steps that updated the model's parameters
        self.trained = False  # called in training mode with gradients on: a model that learns
        self._store = store
        self._diagnostics = diagnostics
        self._failed = diagnostics.failed
        self._lock = lock
        self._active = active
        self._seen: dict[int, tuple] = {}  # id(tensor) -> (weakref, _version, slot): dedupe
        self._tensor_hooks: list = []  # gradient hooks put on this step's tensors, in pairs
        self._recomputed_calls: dict[int, int] = {}
        self._recomputed_task = -1
        self.memory = memory
        # most tensors take `_record_dense`: not with the trap (read at once) or memory rows
        self._dense_path = not trap and memory is None
        self._dense_calls = self._dense_path and inputs is not True  # a call's only row: its output
        self._kernels = self.pending.stats.kernels  # native's: filled in place once built
        self._differences = self.pending.stats.differences  # likewise
        self._call_saved = 0.0  # what the call being recorded saved: on its first output row
        # what the trap adds when a module's own weights are already non-finite (the engine
        # asks the ranking: the first parameter that grew)
        self.trap_cause: Callable[[], str | None] | None = None
        # the ranking's likeliest cause begun by a step, which the trap's explanation says first
        self.prior_cause: Callable[[int], str | None] | None = None

    def begin_step(self) -> int:
        """The pending step reaches the host and the next one begins; returns its number."""
        self.flush()
        # Gradient hooks of the previous step go: tensors that outlive a step (a module
        # returning its own Parameter) would otherwise collect one more hook per step.
        self.remove_tensor_hooks()
        self.step += 1
        self.calls.clear()
        self.step_thread = threading.get_ident()  # where this step's forward runs
        if self.memory is not None:
            self.memory.begin_step(self.step)
        return self.step

    # --- the loss ---------------------------------------------------------------------------
    def ran_this_step(self) -> bool:
        """Whether the model ran a forward of the current step in this thread (a backward here
        is then of its loss, or of a loss it shares)."""
        return (self._active() and self.step >= 0 and bool(self.calls)
                and self.step_thread == threading.get_ident())

    def record_loss(self, loss: torch.Tensor, sharers: int) -> None:
        """A loss that `loss.backward()` was called on, kept on the device until the step
        crosses to the host; with trap=True, a non-finite loss is the trap."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        try:
            value = loss.detach()
            if value.dim():  # a loss of one value in a shape: kept as a 0-d view
                value = value.reshape(())
            with self._lock:
                first = not self.pending.losses
                self.pending.losses.append(value)
                if first:
                    if self.trap or self.step % DESCRIBED_EVERY == 0:  # the trap's words name them
                        self.pending.loss_ops = last_operations(loss)
                    self.pending.loss_shared = sharers
        except Exception as e:
            self._failed(e, "the loss")
            return
        if self.trap and value.is_floating_point() and not bool(torch.isfinite(value)):
            nan = int(torch.isnan(value))
            self.flush()
            raise NonFiniteError("", "loss", "loss", "", self.step, 0, nan, 1 - nan, None,
                                 dtype=dtype_name(value.dtype), shape=tuple(loss.shape),
                                 prior=self._prior(), cause=" ← ".join(last_operations(loss)))

    def _prior(self) -> str | None:
        if self.prior_cause is None:
            return None
        try:  # words beside the trap: they never replace it
            return self.prior_cause(self.step)
        except Exception as e:  # noqa: BLE001 - said as a failed diagnostic
            self._failed(e, "the trap's cause")
            return None

    # --- module calls -----------------------------------------------------------------------
    def record_call(self, target: Target, module: nn.Module, args, kwargs, output) -> None:
        """One call of an inspected module: its output (and inputs, with inputs=True)."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        key = id(module)
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        training = module.training
        try:
            if (self._dense_calls and type(output) is torch.Tensor and output.is_cpu
                    and not target.hist
                    and self._record_dense(target, call, "output", "", output, training)):
                return  # most calls: one plain CPU tensor out
            if self.memory is not None:
                self._call_saved = float(self.memory.leave(module, target.path))
            if self.inputs is True:
                self.record_structure(target, call, "input", (args, kwargs), training)
            inputs = (args, kwargs) if self.trap else None
            if type(output) is torch.Tensor:  # the common case, without walking a structure
                self.record_tensor(target, call, "output", "", output, training, inputs)
            else:
                self.record_structure(target, call, "output", output, training, inputs)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, target.path)

    def record_root_inputs(self, target: Target, module: nn.Module, args, kwargs) -> None:
        call = self.calls.get(id(module), 0)  # the forward hook counts this call
        self.guarded(self.record_structure, target, call, "input", (args, kwargs),
                     module.training)

    def record_structure(self, target: Target, call: int, io: str, obj: Any,
                         training: bool, inputs: Any = None) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        if io == "input":
            args, kwargs = obj
            if (not kwargs and type(args) is tuple and len(args) <= len(_ARG_INDEX)
                    and all(type(a) is torch.Tensor for a in args)):
                # most calls: plain tensors as positional arguments, indexed as walk_tensors does
                for index, tensor in zip(_ARG_INDEX, args):
                    self.record_tensor(target, call, io, index, tensor, training, inputs)
                return
            items = walk_tensors(args)
            for key, value in kwargs.items():
                found = walk_tensors(value, f"[{key!r}]")
                items += found
                items.truncated |= found.truncated
        else:
            items = walk_tensors(obj)
        if items.truncated:
            where = repr(target.path) if target.path else "the model"
            self._diagnostics.say(
                "truncated", f"the {io} of {where} holds more than {MAX_TENSORS_PER_OUTPUT} "
                f"tensors (or {MAX_OBJECTS_PER_OUTPUT} objects): only the first are recorded "
                "(for this and any other such structure).")
        for index, tensor in items:
            self.record_tensor(target, call, io, index, tensor, training, inputs)

    def record_tensor(self, target: Target, call: int, io: str, index: str,
                      t: torch.Tensor, training: bool, inputs: Any = None) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        if (self._dense_path and type(t) is torch.Tensor and t.is_cpu and not target.hist
                and self._record_dense(target, call, io, index, t, training)):
            if io == "input" and not target.path and call == 0:  # the model's own input
                with self._lock:
                    self.guarded(self._take_channels, target, index, t)
            return
        dtype = t.dtype
        values = None
        with self._lock:
            pending = self.pending
            slot = None
            data = t if type(t) is torch.Tensor else self._plain(t)  # subclasses: their data
            if data is not None and reducible(t):
                shape = _shape(t.shape)
                try:
                    version = t._version
                except RuntimeError:  # an inference tensor (inference_mode) has no version
                    version = None
                cached = self._seen.get(id(t))
                if (cached is not None and cached[0]() is t and version is not None
                        and cached[1] == version):
                    slot = cached[2]  # a container's output seen again: reuse its statistics
                else:
                    slot = pending.stats.add(data, shape, immediate=self.trap)
                    if len(self._seen) >= _SEEN_WINDOW:
                        self._seen.clear()
                    self._seen[id(t)] = (weakref.ref(t), version, slot)
                if self.trap:
                    values = pending.stats.value(slot)
            else:
                shape = odd_shape(t)
            device = t.device
            pending.rows.append((self.step, target.path, target.type_name, call, io, index,
                                 shape, _DTYPE_NAMES.get(dtype) or dtype_name(dtype),
                                 _DEVICE_NAMES.get(device) or _device_name(device), training))
            pending.slots.append(slot)
            if self.memory is not None:
                pending.memory.append(self._memory_row(target, io, t))
            full = len(pending.rows) >= pending.max_rows
            if target.hist and io == "output" and slot is not None and data.numel():
                self.guarded(self._take_histogram, target, data)
            if io == "input" and not target.path and call == 0 and slot is not None:
                self.guarded(self._take_channels, target, index, data)
        if full:  # steps="manual" without step(): pending rows stay bounded too
            self.flush()
        if values is not None:
            self._check_finite(target, call, io, index, values, inputs, dtype, target.ref(),
                               shape, device)
        if self.grads and io == "output" and t.requires_grad:
            self.hook_grad(t, target, call, index, training)

    def _record_dense(self, target: Target, call: int, io: str, index: str, t: torch.Tensor,
                      training: bool) -> bool:
        """record_tensor for most tensors of a CPU step, with the least per-tensor Python: a
        plain (the caller checked), contiguous, small CPU tensor whose dtype has a kernel,
        without trap or memory rows (`_dense_path`), or one of any size that is never seen
        again (`_FRESH_EACH_TIME`). The same kernel call and row as the general path, so the
        same statistics to the bit; no dedupe, which only pays for large tensors' reads.
        False: nothing recorded, the general path takes it."""
        dtype = t.dtype
        kernel = self._kernels.get(dtype)
        if kernel is None or dtype is _FLOAT64:  # float64: its range is checked (stats.py)
            return False
        n = t.numel()
        if (not 0 < n or (n > DEDUPE_NUMEL and io not in _FRESH_EACH_TIME)
                or t.layout is not _STRIDED or t.is_nested
                or not t.is_contiguous() or t.is_neg() or not t.data_ptr()):
            return False  # data_ptr() 0: no memory to read (a ZeroTensor)
        with self._lock:
            pending = self.pending
            slot = pending.stats.add_dense(t, n, kernel)
            pending.rows.append((self.step, target.path, target.type_name, call, io, index,
                                 _shape(t.shape), _DTYPE_NAMES[dtype], "cpu", training))
            pending.slots.append(slot)
            full = len(pending.rows) >= pending.max_rows
        if full:  # steps="manual" without step(): pending rows stay bounded too
            self.flush()
        if self.grads and io == "output" and t.requires_grad:
            self.hook_grad(t, target, call, index, training)
        return True

    def record_parameter(self, target: Target, call: int, name: str, param: torch.Tensor,
                         before: torch.Tensor | int | None, training: bool) -> bool:
        """params=True's rows of a parameter an optimiser step updated, in one go for the
        common case, a plain float32 CPU parameter in one block, without trap or memory rows:
        "param", "step_grad" (its .grad, when there) and "update" (Δw = param - its copy from
        before the step, when there: `before`, the copy's address, as extras.Snapshots takes
        it). Δw is read by the difference kernel without torch making it, and the rest as
        `_record_dense` reads it: the same rows to the bit as `record_safely` makes of each,
        for about half the time a parameter (docs/speed.md). False: nothing recorded (a copy
        that is a tensor too), the caller records each row that way. A failure is said once,
        never raised (as `record_safely`'s)."""
        try:
            return self._parameter_rows(target, call, name, param, before, training)
        except Exception as e:
            self._failed(e, target.path)
            return True

    def _parameter_rows(self, target: Target, call: int, name: str, param: torch.Tensor,
                        before: torch.Tensor | int | None, training: bool) -> bool:
        kernel, difference = self._kernels.get(param.dtype), self._differences.get(param.dtype)
        if (kernel is None or difference is None or not self._dense_path
                or type(param) is not _PARAMETER or not param.is_cpu or target.hist
                or not contiguous_in_place(param)
                or (before is not None and type(before) is not int)):
            return False
        n, grad = param.numel(), param.grad
        grad_here = (grad is not None and type(grad) is torch.Tensor and grad.is_cpu
                     and grad.dtype is param.dtype and n <= DEDUPE_NUMEL
                     and grad.numel() == n and contiguous_in_place(grad))  # n values read
        meta = (_shape(param.shape), _DTYPE_NAMES[param.dtype], "cpu", training)
        head = (target.path, target.type_name, call)
        with self._lock:
            pending = self.pending
            stats, rows, slots, step = pending.stats, pending.rows, pending.slots, self.step
            slots.append(stats.add_dense(param, n, kernel))
            rows.append((step, *head, "param", name, *meta))
            if grad_here:
                slots.append(stats.add_dense(grad, n, kernel))
                rows.append((step, *head, "step_grad", name, *meta))
        if grad is not None and not grad_here:  # a large one may have been read (dedupe)
            self.record_safely(target, call, "step_grad", name, grad, training)
        if before is not None:
            with self._lock:
                pending = self.pending  # the same, unless the general path just flushed it
                slot = pending.stats.add_difference(param, before, n, difference)
                pending.slots.append(slot)  # None: a row without statistics, said below
                pending.rows.append((self.step, *head, "update", name, *meta))
            if slot is None:
                self._diagnostics.say("update-memory", f"the update Δw of {name!r} (and any "
                                      "other that cannot) is recorded without statistics: "
                                      "there was no memory to subtract into.")
        if len(self.pending.rows) >= self.pending.max_rows:  # steps="manual" without step()
            self.flush()
        return True

    def _plain(self, t: torch.Tensor) -> torch.Tensor | None:
        """A subclass's data to reduce (a Parameter's, a DTensor's local shard, a MaskedTensor's
        values), or None, said once per kind: a row with its shape, without statistics."""
        try:
            data = plain(t)
        except Exception as e:  # a subclass's own method failing: no statistics, said once
            data, why = None, f"reading it raised {type(e).__name__}: {e}"
        else:
            why = "it holds no memory of its own to read (a wrapper subclass)"
        if data is None:
            kind = type(t).__name__
            self._diagnostics.say(f"subclass:{kind}", f"{kind} tensors get rows without "
                                  f"statistics: {why}. Their shapes and dtypes are recorded.")
        return data

    def _memory_row(self, target: Target, io: str, t: torch.Tensor) -> tuple:
        if io != "output":
            return _NO_MEMORY
        saved, self._call_saved = self._call_saved, 0.0  # the call's first output row has it
        return self.memory.output(t, target.path), saved, peak_bytes(t)

    def _check_finite(self, target, call, io, index, values, inputs, dtype=None,
                      module=None, shape=None, device=None) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        # an empty tensor has no statistics: its counts are NaN, not a NaN found
        nan, inf = (int(v) if v == v and v else 0 for v in values[5:7])
        if nan or inf:
            loss_ops = list(self.pending.loss_ops)  # before flush() lets the step go
            inputs_finite = None
            if inputs is not None:
                inputs_finite = all(
                    bool(torch.isfinite(t).all()) for _, t in walk_tensors(inputs)
                    if reducible(t) and (t.is_floating_point() or t.is_complex()))
            bad_params = [name for name, p in (module.named_parameters(recurse=False)
                                               if module is not None else ())
                          if p.is_floating_point() and not bool(torch.isfinite(p).all())]
            self.flush()
            cause = self.trap_cause() if bad_params and self.trap_cause is not None else None
            prior = self._prior()
            # The trap: this module's output holds NaN/Inf. The explanation under the traceback
            # names the module and why; the inspector's frames above this one are hidden.
            raise NonFiniteError(target.path, target.type_name, io, index, self.step, call,
                                 nan, inf, inputs_finite, dtype=dtype_name(dtype),
                                 bad_params=bad_params, cause=cause, shape=shape,
                                 device=None if device is None else _device_name(device),
                                 prior=prior, loss_ops=loss_ops)

    def _take_channels(self, target: Target, index: str, t: torch.Tensor) -> None:
        if self.step % DESCRIBED_EVERY:
            return  # read on steps 0, 16, 32, ... (DESCRIBED_EVERY)
        stats = channel_stats(t)
        if stats is not None:
            self.pending.channels[index or "[0]"] = (tuple(t.shape), stats)

    def _take_histogram(self, target: Target, t: torch.Tensor) -> None:
        values = torch.nan_to_num(t.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
        lo_hi = torch.stack(torch.aminmax(values))
        self.pending.hists[target.path] = (torch.histc(values, bins=self.hist_bins), lo_hi)

    def guarded(self, fn, *args) -> None:
        """Run a recording step; a failure is recorded and warned about once, never raised."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        try:
            fn(*args)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, args[0].path if args and isinstance(args[0], Target) else "?")

    def record_safely(self, target: Target, call: int, io: str, index: str, t: torch.Tensor,
                      training: bool) -> None:
        """`record_tensor` as `guarded` runs it, in few frames: it runs per gradient and
        parameter (never for an input)."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        try:
            if not (self._dense_path and type(t) is torch.Tensor and t.is_cpu
                    and not target.hist and self._record_dense(target, call, io, index, t,
                                                               training)):
                self.record_tensor(target, call, io, index, t, training)
        except NonFiniteError:
            raise
        except Exception as e:
            self._failed(e, target.path)

    # --- gradients --------------------------------------------------------------------------
    def hook_grad(self, t: torch.Tensor, target: Target, call: int, index: str,
                  training: bool) -> None:
        # Kept so that the hooks go when the step ends (begin_step, stop): two entries each,
        # (hook dict, key) or (handle, None), put in by one call (a Ctrl-C lands before or
        # after it) and with no tuple of their own that the garbage collector would count
        hooked = _add_grad_hook(t, _GradHook(self, target, call, index, training))
        with self._lock:
            self._tensor_hooks.extend(hooked)

    def on_recomputed(self, target: Target, module: nn.Module, output: Any) -> None:
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
                self.hook_grad(t, target, call, index, module.training)

    def remove_tensor_hooks(self) -> None:
        with self._lock:
            hooks, self._tensor_hooks = self._tensor_hooks, []
        for i in range(0, len(hooks), 2):
            held, key = hooks[i], hooks[i + 1]
            if key is None:  # torch's RemovableHandle
                held.remove()
            else:  # the tensor's hook dict and our key: _add_grad_hook
                held.pop(key, None)

    # --- to the host ------------------------------------------------------------------------
    def flush(self) -> None:
        """Move the pending step's statistics to the host (one transfer per device)."""
        with self._lock:
            pending = self.pending
            self.pending = Pending(self.exact_std, self._store.max_rows, self._spare_rows)
            self._spare_rows = None
            self._seen.clear()
            step = pending.to_host(self._failed, memory=self.memory is not None)
            # its RAW rows are copied: the next step writes the same chunk (two take turns)
            self._spare_rows = pending.stats.spare_rows()
            if step is None:
                return
            self._store.receive(*step)
        self._store.tell_listeners()
        HEAP.step()  # the steps kept can keep a loop's freed tensors from being given back

    def add_param_groups(self, optimizer, groups: list[dict]) -> None:
        """params=True: the param groups of `optimizer` that hold this model's parameters, as
        this step's (optimizer_rows.py)."""
        with self._lock:
            self.pending.optimizer[id(optimizer)] = groups
