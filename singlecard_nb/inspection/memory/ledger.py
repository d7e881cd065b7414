"""`memory=True`: what each module's forward saved for backward, and the bytes of its outputs.

While a recorded call of the model runs, autograd's saved-tensor hooks
(`torch.autograd.graph.saved_tensors_hooks`, pushed when the call opens and popped when it
closes) see every tensor autograd saves. Each saved storage is counted once per step (views and
shared storages are not counted twice) for the innermost inspected module running, known from a
stack that a global forward pre-hook pushes and the recorder's per-call hook pops. Parameters and
buffers are resident anyway and are not counted. The hooks pack a detached alias (packing the
tensor itself would tie a saved output to its own graph in a cycle that outlives the step; a
leaf, which has no graph, is packed itself) and check its version on unpack, as autograd does
without hooks: an in-place change of a saved tensor is still an error.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from ..diagnostics import Diagnostics
from ..targets import target_of

_push = torch._C._autograd._push_saved_tensors_default_hooks
_pop = torch._C._autograd._pop_saved_tensors_default_hooks
_NAN = float("nan")
_OUTSIDE = ""  # saves made in no inspected module (the root's own code is the root's, "")


def storage_of(t: torch.Tensor) -> tuple[int, int, Any] | None:
    """(key, bytes, storage) of a tensor's storage; None for tensors without one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes(), storage
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


_Parameter = nn.Parameter


def _unpack(saved: tuple) -> torch.Tensor:
    """What `_pack` kept, a (detached alias, version) pair: the version checked as autograd
    checks it without hooks."""
    t, version = saved
    if version is not None and t._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{t.type()} {list(t.shape)}] is at version {t._version}; "
            f"expected version {version} instead. (singlecard_nb's memory=True checks "
            "this in its saved-tensor hooks, as autograd does without them.)")
    return t


def _plain(t: torch.Tensor) -> tuple:
    """What `_pack` keeps for a tensor it does not count."""
    try:
        version = t._version
    except RuntimeError:
        version = None
    return (t if t.is_leaf else t.detach()), version


class MemoryLedger:
    """Saved-for-backward and output bytes of one inspector's recorded steps.

    Changed only in the model's thread (hooks of its forward), under the inspector's lock where
    the recorder calls it; `table()` copies what the last finished step recorded.
    """

    def __init__(self, model: nn.Module, targets: Callable[[], dict], diagnostics: Diagnostics):
        self._model = weakref.ref(model)
        self._targets = targets  # id(module) -> Target, the call tracker's
        self._say = diagnostics.say
        self._stack: list[nn.Module] = []
        self._pushed = False
        self._pre_hook = None
        self._exclude: set[int] = set()  # storages of the buffers (this step)
        self._tree: list[weakref.ref] = []  # the modules whose buffers those are
        self._tree_of: dict | None = None  # the targets the tree was read for
        self._saved_keys: dict[int, Any] = {}  # saved storages of this step -> weakref
        self._output_keys: dict[int, str] = {}  # output storages of this step -> its module
        self._pending: dict[int, int] = {}  # id(module) -> saved bytes of its open call
        # path -> bytes of this step (ints in two dicts: no container per call for the
        # garbage collector to walk), and the last finished step's path -> (saved, outputs)
        self._saved: dict[str, int] = {}
        self._outputs: dict[str, int] = {}
        self.last: dict[str, tuple[int, int]] = {}
        self.last_step = self._step_no = -1
        self.outside = 0  # saved in no inspected module (this step)
        self._thread = 0  # the thread whose saved-tensor hooks are pushed (they are per thread)
        # Autograd's hook stack is per thread: a stop from another thread cannot pop it. The
        # model's thread then pops at the end of its call (an always-called hook put on the
        # model by that stop, which removes itself) or at its next save (`_pack`).
        self._closer = None
        self._orphaned = False  # stopped elsewhere while pushed: the model's thread pops

    # --- a recorded call of the model -------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if self._saved or self._outputs:
            self.last, self.last_step = self._table(), self._step_no
        self._step_no = step
        self._saved, self._outputs, self._saved_keys, self._output_keys = {}, {}, {}, {}
        self._pending, self.outside = {}, 0

    def enter(self, root_running: bool) -> None:
        """The outermost recorded call of the model (`root_running`: the model itself, whose
        pre-hooks torch has already chosen, so it is put on the stack here) or of a step
        method opens: saves are seen from now on."""
        if self._pushed:
            return
        model = self._model()
        if model is None:
            return
        self._orphaned = False
        # parameters are told by their class (views of them by their base), buffers by storage
        targets = self._targets()
        self._exclude = self._buffer_keys(model, targets)
        self._stack[:] = [model] if root_running and target_of(targets, model) else []
        try:
            _push(self._pack, _unpack)
        except RuntimeError as e:  # saved-tensor hooks disabled by the caller (vmap, compile)
            self._say("memory-hooks", f"memory=True cannot see what autograd saves here: {e}. "
                      "mem_saved stays empty for these calls.")
            return
        self._pushed, self._thread = True, threading.get_ident()
        stack = self._stack

        def entered(module: nn.Module, args: Any) -> None:  # per module call: kept lean
            target = targets.get(id(module))
            if target is not None and target.ref() is module:  # not a freed module's id()
                stack.append(module)

        # Its own pre-hook: the recorder sees a module only when its call ends (a forward
        # hook), too late to tell a parent's saves from its children's.
        self._pre_hook = register_module_forward_pre_hook(entered)

    def _buffer_keys(self, model: nn.Module, targets: dict) -> set[int]:
        """Storages of the buffers, read each step (a buffer may be replaced or registered in a
        forward) from the modules of the tree the inspector started on: walking the tree each
        step (`model.buffers()`, a path string per module) took 8 ms a step on mlp5000."""
        if self._tree_of is not targets:  # the inspector (re)started: its tree, weakly
            self._tree = [weakref.ref(m) for m in model.modules()]
            self._tree_of = targets
        keys = set()
        for ref in self._tree:
            module = ref()
            if module is not None and module._buffers:
                for t in module._buffers.values():
                    if t is not None and (found := storage_of(t)) is not None:
                        keys.add(found[0])
        return keys

    def exit(self) -> None:
        """The call closed (or Ctrl-C left it open and it was settled, or the inspector
        stopped): hooks off. From another thread than the call's, its saved-tensor hooks stay
        pushed until that thread's call ends (they are that thread's), and this says so."""
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None
        self._stack.clear()
        if not self._pushed:
            self._remove_closer()
        elif self._thread == threading.get_ident():
            self._pop()
        elif self._thread not in sys._current_frames():  # that thread ended: its stack too
            self._pushed = self._orphaned = False
        elif not self._orphaned:
            self._orphaned = True
            model = self._model()
            if model is not None:  # torch reads the hooks after the forward: this one runs
                self._closer = model.register_forward_hook(self._call_ended, always_call=True)
            self._say("memory-open-call", "memory=True was stopped while a call of the model "
                      "runs in another thread: that thread's saved-tensor hooks come off when "
                      "its call ends (autograd's hooks are per thread). See "
                      "docs/memory.md#threads.")

    def _pop(self) -> None:
        """Pop this thread's saved-tensor hooks (ours: pushed by `enter` in this thread)."""
        self._pushed = self._orphaned = False
        _pop()

    def _remove_closer(self) -> None:
        closer, self._closer = self._closer, None
        if closer is not None:
            closer.remove()

    def _call_ended(self, module: nn.Module, args: Any, output: Any) -> None:
        """After a call of the model, once stopped from another thread: pops in the model's
        thread. It removes itself, except where torch runs it while an error leaves the
        forward (torch then walks the hook table itself: a removal would break that walk); it
        goes then at the model's next call, or when the inspector is stopped again."""
        if self._pushed and self._thread == threading.get_ident():
            self._pop()
        if not self._pushed and sys.exc_info()[1] is None:
            self._remove_closer()

    def _pack(self, t: torch.Tensor) -> Any:
        # Once per saved tensor (mlp5000: 7 500 a step), so one frame with the common cases
        # first. A leaf has no graph to tie into a cycle: it is kept itself, not an alias.
        if self._orphaned:  # stopped elsewhere: ours is the top of this thread's stack
            if self._pushed and self._thread == threading.get_ident():
                self._pop()  # this save keeps the pair it already took
            return _plain(t)
        try:
            version = t._version
        except RuntimeError:  # an inference tensor has no version counter
            version = None
        alias = t if t.is_leaf else t.detach()
        if type(t) is _Parameter or type(t._base) is _Parameter:
            return alias, version  # resident anyway (isinstance would run Python per tensor)
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            return alias, version  # no storage (a sparse or functorch tensor): nothing to count
        if key and key not in self._exclude:
            ref = self._saved_keys.get(key)
            if ref is None or ref() is None:  # not a view of (or the same) storage saved before
                try:
                    self._count_saved(key, storage)
                except Exception as e:  # accounting never breaks the forward it watches
                    self._say("memory-failed",
                              f"memory=True could not count a saved tensor ({e!r}).")
        return alias, version

    def _count_saved(self, key: int, storage: Any) -> None:
        """A storage saved for the first time this step: for the innermost module running."""
        nbytes = storage.nbytes()
        self._saved_keys[key] = weakref.ref(storage)
        returned_by = self._output_keys.pop(key, None)
        if returned_by is not None:  # an output saved by a later module: an activation now
            self._outputs[returned_by] -= nbytes
        if self._stack:
            module = id(self._stack[-1])
            self._pending[module] = self._pending.get(module, 0) + nbytes
        else:
            self.outside += nbytes

    # --- per module call (from the recorder) ------------------------------------------------
    def leave(self, module: nn.Module, path: str) -> int:
        """A call of `module` ended: the bytes it saved (its children's are theirs)."""
        stack = self._stack
        if stack and stack[-1] is module:
            stack.pop()
        elif module in stack:  # calls that raised never popped: they end with their caller
            while stack and stack.pop() is not module:
                pass
        saved = self._pending.pop(id(module), 0)
        self._saved[path] = self._saved.get(path, 0) + saved
        return saved

    def output(self, t: torch.Tensor, path: str) -> float:
        """Bytes of an output's storage; the first module to return a storage holds it."""
        try:  # inline, not storage_of: once per output row
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            return float("nan")
        if (key and key not in self._output_keys and key not in self._exclude
                and key not in self._saved_keys):
            self._output_keys[key] = path
            self._outputs[path] = self._outputs.get(path, 0) + nbytes
        return float(nbytes)

    def table(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """(step, path -> (saved, outputs)) of the latest step whose forward has ended."""
        if self.last and (self._pushed or not (self._saved or self._outputs)):
            return self.last_step, dict(self.last)  # this step's forward still runs
        return self._step_no, self.current()

    def _table(self) -> dict[str, tuple[int, int]]:
        return {p: (self._saved.get(p, 0), self._outputs.get(p, 0))
                for p in {**self._saved, **self._outputs}}

    def current(self) -> dict[str, tuple[int, int]]:
        """This step so far, calls still running included (what the out-of-memory rule reads
        while the failed step's tensors are still alive)."""
        table = self._table()
        targets = self._targets()
        for module, saved in list(self._pending.items()):
            target = targets.get(module)
            if target is not None:
                done, outputs = table.get(target.path, (0, 0))
                table[target.path] = (done + saved, outputs)
        return table


def peak_bytes(t: torch.Tensor) -> float:
    """The device's running peak of allocated bytes (CUDA tensors only; NaN elsewhere)."""
    if not t.is_cuda:  # an attribute: t.device builds an object per output row
        return _NAN
    return float(torch.cuda.max_memory_allocated(t.device))
