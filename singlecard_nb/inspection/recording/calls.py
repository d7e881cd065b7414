"""The open call: which call of the model runs, in which thread, and which step it belongs to.

A step is one call of the model (its root pre-hook opens it), one call of a Lightning-style
`training_step` / `validation_step` / ..., or, with `steps="manual"`, what lies between two
`insp.step()` calls. Real training code leaves that simple picture in a few ways, each handled
here: Ctrl-C skips torch's always-called hooks (`settle`), gradient checkpointing re-runs
forwards inside backward (`_on_outside_call`), another thread may run the model (its calls are
not recorded). What the stack says (`calls_on_stack`, `in_backward`) and the step methods'
wrapper (`StepMethod`) are here too: each answers the one question of this module, which call
and which step is open.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...errors import TRAP_FRAME, NonFiniteError, without_our_frames
from ..diagnostics import Diagnostics
from ..memory import MemoryLedger
from ..targets import Target
from .recorder import Recorder

_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
_get_ident = threading.get_ident
_STEP_CLOCK = itertools.count(1)  # steps of every inspector, in the order they began
_THREADS = ("the model was called from two threads at once: calls made while another "
            "thread's call is running are not recorded.")
_UNSEEN = object()  # on_forward called without an output (see there)

_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_CALL_IMPL = nn.Module._call_impl.__code__


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass (where checkpointing recomputes)."""
    return _graph_task_id() != -1


def calls_on_stack(frame: Any, module: nn.Module) -> int:
    """How many calls of `module` (its nn.Module._call_impl frames) are running in this stack:
    after Ctrl-C skipped torch's always-called hooks, and where `inspect_all` finds a model."""
    count = 0
    while frame is not None:
        if frame.f_code is _CALL_IMPL and frame.f_locals.get("self") is module:
            count += 1
        frame = frame.f_back
    return count


def step_clock() -> int:
    """A tick of the clock steps begin by: a model recorded in another process (a rank's)
    is placed on it as it is read back, so `inspector()` knows which came last."""
    return next(_STEP_CLOCK)


class CallTracker:
    """Opens and closes calls of the model, begins steps (`every`), and routes module calls.

    Lock contract: `depth`, `root_depth` and `thread` change only under `lock`, the inspector's
    one RLock (shared with the recorder): calls open and close in the model's thread, `settle`
    may run in another (flush from a cell's end, frames read meanwhile). The per-module hook
    (`on_forward`) reads them without the lock: a call of this thread sees its own writes, and
    another thread's call only needs to see that a call is open elsewhere.

    hook: `install_hook()` / `remove_hook()` put torch's global module hook (routed to
    `on_forward`) in place and take it away; `end_probes()` ends the "called some other way"
    probe (all from the attach owner). memory: memory=True's ledger, whose saved-tensor hooks
    are pushed when a recorded call opens and popped when no call is open.
    """

    def __init__(self, model: nn.Module, recorder: Recorder, diagnostics: Diagnostics,
                 lock: threading.RLock, *, every: int, manual_steps: bool,
                 active: Callable[[], bool], install_hook: Callable[[], None],
                 remove_hook: Callable[[], None], end_probes: Callable[[], None],
                 memory: MemoryLedger | None = None):
        self.every = every
        self.manual_steps = manual_steps
        self.recording = False  # whether the current step is recorded
        self.targets: dict[int, Target] = {}  # every inspected module (set when attached)
        self.hooked: dict[int, Target] = {}  # those the global hook records (see attach.py)
        # how deep calls of the model (and of its step methods) are nested in the thread that
        # runs them, and how many of those are calls of the model itself
        self.depth = self.root_depth = 0
        self.thread = 0
        self.began = 0  # when its latest step began (_STEP_CLOCK), 0 before the first
        self._midway: tuple[Any, tuple[int, int]] | None = None  # see open_midway
        self._model = weakref.ref(model)
        self._recorder = recorder
        self._record_call = recorder.record_call  # pre-bound: the per-module-call path
        self._say = diagnostics.say
        self._failed = diagnostics.failed
        self._lock = lock
        self._active = active
        self._install_hook, self._remove_hook = install_hook, remove_hook
        self._end_probes = end_probes
        self._memory = memory  # memory=True: its saved-tensor hooks span each recorded call

    def __deepcopy__(self, memo: dict) -> CallTracker:
        # A deepcopy of the inspected model (EMA, SWA) copies its hooks, and with them bound
        # methods of this tracker: they stay this tracker's, which ignores the copy.
        return self

    def follow(self, model: nn.Module) -> None:
        """The calls to track are now `model`'s (the inspected model loaded back: engine.py)."""
        self._model = weakref.ref(model)

    # --- steps ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Before the hooks are attached: no call is open; manual steps: step 0 starts now."""
        self.close_all()
        if self.manual_steps and self._recorder.step < 0:
            self._recorder.step = 0
            self.recording = True

    def close_all(self) -> None:
        """The hooks are gone: no call of the model is open any more."""
        with self._lock:
            self.depth = self.root_depth = 0
            self._midway = None
            if self._memory is not None:
                self._memory.exit()

    def _calls_ended(self) -> None:
        """No call of the model is open: the global hook goes unless the step spans calls."""
        if not self.spans_step():
            self._remove_hook()
        if self._memory is not None:
            self._memory.exit()

    def begin_step(self) -> None:
        self._end_probes()  # a step began: the model is called the way the engine expects
        self.began = next(_STEP_CLOCK)  # which model was called last: `inspector()`
        step = self._recorder.begin_step()
        self.recording = step % self.every == 0
        if self.recording and self._active():
            self._install_hook()
        else:
            self._remove_hook()

    def spans_step(self) -> bool:
        """Whether the global hook stays installed for the whole step, not only during calls:
        manual steps record every call until step(); gradients need it during backward, where
        gradient checkpointing recomputes forwards (see _on_outside_call)."""
        return self.manual_steps or self._recorder.grads

    # --- the open call ----------------------------------------------------------------------
    def open(self, kind: str) -> tuple[int, int] | None:
        """A call of the model (kind "root") or of a step method ("method") begins.

        Returns the nesting to restore when it ends, or None when another thread's call is in
        progress (this call is then not recorded). The outermost call begins a step.
        """
        me = _get_ident()
        if self._midway is not None:
            self._close_midway()
        with self._lock:
            if self.depth and not self.settle(me, kind):
                opened = None
            else:
                opened = (self.depth, self.root_depth)
                if self.depth == 0:
                    self.thread = me
                self.depth += 1
                self.root_depth += kind == "root"
        if opened is None:
            self._say("threads", _THREADS)
        elif opened[0] == 0 and (not self.manual_steps or self._recorder.step < 0):
            self.begin_step()
        if opened is not None and opened[0] == 0 and self.recording and self._memory is not None:
            self._memory.enter(kind == "root")  # memory=True: saves seen in the call
        return opened

    def open_midway(self, frame: Any) -> None:
        """A step method already running when the inspector starts (`inspect_all` found the
        model inside it): its call opens now, and closes at the next call once `frame` (the
        method's frame) has returned."""
        opened = self.open("method")
        if opened is not None:
            self._midway = (frame, opened)

    def _close_midway(self) -> None:
        frame, opened = self._midway
        running = sys._getframe()
        while running is not None and running is not frame:
            running = running.f_back
        if running is None:  # the method has returned
            self._midway = None
            self.close(opened)

    def close(self, opened: tuple[int, int]) -> None:
        with self._lock:
            if self.thread != _get_ident():
                return
            self.depth, self.root_depth = opened
            if self.depth == 0:
                self._calls_ended()

    def settle(self, me: int | None = None, kind: str = "") -> bool:
        """Close calls that Ctrl-C left open; True when thread `me` may open a call now.

        torch runs always-called hooks only for Exception, so a KeyboardInterrupt inside the
        model leaves its call open. The calls of the model really running are counted on the
        stack of the thread that opened them (nn.Module._call_impl frames); a step method's own
        `finally` always closes its call, so only calls of the model can be left open.
        """
        with self._lock:
            if not self.depth:
                return True
            owner = self.thread
            stack = sys._getframe() if owner == me else sys._current_frames().get(owner)
            model = self._model()
            if stack is None or model is None:  # the thread that opened the call has ended
                self.depth = self.root_depth = 0
            else:
                running = calls_on_stack(stack, model)
                if owner == me and kind == "root":
                    running -= 1  # the call opening now is on the stack already
                stale = self.root_depth - running
                if stale > 0:
                    self.depth -= stale
                    self.root_depth -= stale
            if self.depth == 0:
                self._calls_ended()
            return self.depth == 0 or owner == me

    # --- hooks ------------------------------------------------------------------------------
    def on_root_pre(self, module, args, kwargs) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        if module is not self._model() or _is_compiling() or in_backward():
            # a copy of the model carries our hooks (see Inspector.__deepcopy__): not the
            # model; a recomputation (gradient checkpointing) belongs to the step it recomputes
            return
        try:
            opened = self.open("root")
        except Exception as e:
            self._failed(e, "")
            return
        if not self._recorder.trained and module.training and torch.is_grad_enabled():
            self._recorder.trained = True
        if (opened is None or opened[1] or not self.recording
                or self._recorder.inputs != "root"):
            return  # a recursive call of the root records no inputs of its own
        target = self.targets.get(id(module))
        if target is not None:
            try:
                self._recorder.record_root_inputs(target, module, args, kwargs)
            except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
                without_our_frames(trapped)
                raise

    def on_root_post(self, module, args, output) -> None:
        model = self._model()
        if module is not model or _is_compiling() or in_backward():
            return
        if self.depth and self.root_depth and self.thread == _get_ident():
            key = id(model)
            if (self.depth == 1 and self.recording and key in self.targets
                    and key not in self._recorder.calls and sys.exc_info()[1] is None):
                # the model's own output hook runs before this one unless compiled code
                # bypassed the hooks (or the forward raised: then an exception is being handled)
                self._say("bypassed", f"{type(model).__name__} ran, but none of its "
                          "modules reached the inspector: it was run by code compiled with "
                          "torch.compile, which bypasses module hooks. Inspect "
                          "torch.compile(model) itself (it then runs eagerly while inspected), "
                          "or call the model outside the compiled function.")
            self.close((self.depth - 1, self.root_depth - 1))

    def on_child_probe(self, probed: set[int], module, args) -> None:
        """Until the first step: a child of the model called outside a call of the model."""
        if (id(module) not in probed or self.depth or self.manual_steps
                or id(module) not in self.targets):
            return
        self._end_probes()
        if self._recorder.step < 0:
            path = self.targets[id(module)].path
            name = type(self._model()).__name__
            self._say("no-step", f"{path!r} of {name} ran outside a call of the {name} itself "
                      "(called as model.child(...) or from a method other than forward), so it "
                      "starts no step and nothing is recorded. Call the model itself, pass "
                      "steps='manual' and call insp.step() after each step, or inspect the "
                      "submodule you call.")

    def on_forward(self, module, args, kwargs, output=_UNSEEN, own_hooks: bool = False) -> None:
        """The global forward hook; with `own_hooks`, the hook of a module with forward hooks of
        its own, which runs after them (see attach.py). One body for both: this runs once
        per module call, where each Python frame counts.

        No `output`: another thread's module call took torch's hook table before the hook was
        removed and read its with_kwargs flag after (torch then passes (module, args,
        output)); the hook is on its way out, so that call is let be.
        """
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        if output is _UNSEEN:
            return
        target = (self.targets if own_hooks else self.hooked).get(id(module))
        if target is None or not self.recording or _is_compiling() or target.ref() is not module:
            return
        try:  # no cost until it raises
            if self.depth and self.thread == _get_ident():
                self._record_call(target, module, args, kwargs, output)
            else:
                self._on_outside_call(target, module, args, kwargs, output)
        except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
            without_our_frames(trapped)
            raise

    def _on_outside_call(self, target, module, args, kwargs, output) -> None:
        """A module call while the hook is installed, but not inside this thread's call."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        if self.manual_steps and not self.depth:
            self._record_call(target, module, args, kwargs, output)  # manual: all calls count
        elif in_backward():
            if self._recorder.grads:
                self._recorder.guarded(self._recorder.on_recomputed, target, module, output)
        elif self.depth:
            self._say("threads", _THREADS)


class StepMethod:
    """A model's training_step (or validation_step...) while inspected: each call is a step.

    Set on the model instance (and removed by the inspector's owner). A copy of the model made
    meanwhile (deepcopy by an EMA or SWA callback, pickling) gets the plain method of the copy.
    """

    def __init__(self, calls: CallTracker, method: Callable):
        self._calls = calls
        functools.update_wrapper(self, method)  # __wrapped__: Lightning's is_overridden, inspect

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opened = self._calls.open("method")
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            if opened is not None:
                self._calls.close(opened)

    def __reduce__(self):
        method = self.__wrapped__
        return getattr, (method.__self__, method.__name__)

    def __deepcopy__(self, memo: dict) -> Any:
        method = self.__wrapped__
        copied = memo.get(id(method.__self__), method.__self__)
        return getattr(type(copied), method.__name__).__get__(copied)
