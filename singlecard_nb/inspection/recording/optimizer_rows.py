"""params=True: what each optimiser step adds to the pending step: the parameters it updated,
the gradients it used and their update Δw ("param", "step_grad", "update" rows), the model's
buffers once per step, and the param groups' lr and weight decay."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from ...errors import TRAP_FRAME
from .extras import ParamTargets, Snapshots, param_groups, under_grad_scaler
from .recorder import Recorder


class OptimizerRows:
    """The rows of `recorder` that optimiser steps make while one attachment lasts.

    snapshots: the parameters just before a step (for Δw; within a byte budget).
    """

    def __init__(self, recorder: Recorder, say: Callable[[str, str], None]):
        self._recorder = recorder
        self.snapshots = Snapshots(say)
        # id(param) -> its .grad, weakly, with that grad's _version and the writes one step
        # makes (_GradSeen: one object a parameter, see there).
        # A fresh .grad (after set_to_none) shows how many writes a step makes to it (1
        # by backward; 2 under DDP, which copies in the reduced bucket; +1 for clipping or
        # unscale_): the same tensor exactly that many versions on at the next step took
        # one more backward pass and no zeroing (zero_() is one write more)
        self._grads: dict[int, _GradSeen] = {}
        # id(optimizer) -> (the optimizer, weakly; its parameters of this model, as _mine
        # gives them): found by before_step, used by after_step of the same step (one look-up
        # per parameter, not four)
        self._stepping: dict[int, tuple] = {}

    def before_step(self, optimizer, param_targets: ParamTargets) -> None:
        """Copies of the parameters `optimizer` is about to update (for Δw; bounded).

        Every inspector hears every optimiser of the process (one hook for all): another
        model's, stepping in another thread meanwhile, must leave this one's copies alone."""
        mine = _mine(optimizer, param_targets)
        if mine:
            self._stepping[id(optimizer)] = (weakref.ref(optimizer), mine)  # for after_step
            self._recorder.guarded(self.snapshots.take, [entry[0]() for entry in mine])

    def after_step(self, optimizer, param_targets: ParamTargets, buffer_modules: list) -> None:
        """The parameters `optimizer` updated (and the gradients it used, and Δw: "update");
        the buffers once per step, after its first optimiser step, when this step's forward has
        updated them; the param groups' lr and weight decay."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        recorder = self._recorder
        calls = recorder.calls  # cleared, never replaced, at each step
        stepping = self._stepping.pop(id(optimizer), None)
        if stepping is not None and stepping[0]() is optimizer:
            mine = stepping[1]  # before_step's, of this very step
        else:  # no pre-hook ran (the inspector began during this step)
            mine = _mine(optimizer, param_targets)
        if not mine:
            return  # another model's optimiser: this model's copies (Δw) stay for its own step
        recorder.optimizer_steps += 1
        carried = self._carried(mine)
        recorder.add_param_groups(optimizer, param_groups(optimizer, param_targets,
                                                          under_grad_scaler(), carried))
        if "buffers" not in calls:  # once per step (calls is cleared at each)
            calls["buffers"] = 1
            for target, module_ref in buffer_modules:
                module = module_ref()
                if module is None:
                    continue
                for name, buffer in module.named_buffers(recurse=False):
                    recorder.guarded(recorder.record_tensor, target, 0, "buffer", name,
                                     buffer.detach(), module.training)
        record = recorder.record_safely  # each row's failure said, never raised
        take_back = self.snapshots.take_back
        # parameter by parameter, Δw made (if at all: record_parameter reads it unmade) and read
        # and let go in turn: no tensor, tuple or list per parameter outlives its rows
        # (recorder._GradHook says why that matters), and at most one Δw exists at a time (a
        # foreach subtraction of all held a second copy of the parameters; on the CPU it cost
        # the same per tensor)
        for entry in mine:
            param, module = entry[0](), entry[3]()
            if param is None or module is None:
                continue
            target, name = entry[1], entry[2]
            key = ("param", id(param))  # an optimiser stepping twice in one step: call 0, 1
            call = calls.get(key, 0)
            calls[key] = call + 1
            training = module.training
            before = take_back(param)  # None where it was not copied (beyond the budget)
            if recorder.record_parameter(target, call, name, param, before, training):
                continue
            record(target, call, "param", name, param.detach(), training)
            grad = param.grad
            if grad is not None:
                record(target, call, "step_grad", name, grad, training)
            if before is not None:
                recorder.guarded(self._record_update, target, call, name, param, before,
                                 training)
        self.snapshots.clear()

    def _record_update(self, target, call: int, name: str, param, before, training: bool) -> None:
        """The "update" row of `param`: Δw since `before`, its copy from before the step (as
        `Snapshots.take_back` gives it)."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        update = param.detach() - self.snapshots.as_tensor(param, before)
        self._recorder.record_safely(target, call, "update", name, update, training)

    def _carried(self, mine: list) -> set[int]:
        """ids of the parameters whose .grad this step is last step's tensor, one version on:
        nothing zeroed it (the version check costs no device read)."""
        carried = set()
        for entry in mine:
            param = entry[0]()
            if param is None:
                continue
            grad = param.grad
            if grad is None:
                self._grads.pop(id(param), None)
                continue
            known = self._grads.get(id(param))
            if known is not None and known() is grad:
                writes = known.writes
                if grad._version - known.version == writes:
                    carried.add(id(param))
            else:  # a new tensor: one step's writes are its version now, plus its creation
                writes = grad._version + 1
            seen = _GradSeen(grad)
            seen.version, seen.writes = grad._version, writes
            self._grads[id(param)] = seen
        return carried


class _GradSeen(weakref.ref):
    """A parameter's .grad, weakly, with its `_version` and the writes one step makes to it
    (set after it is made: no Python __init__ a parameter a step). One object where a tuple and
    a weak reference were two: each parameter's is made anew every step, lives until the next
    one and so counts for the garbage collector as long-lived (see recorder._GradHook)."""

    __slots__ = ("version", "writes")


def _mine(optimizer, param_targets: ParamTargets) -> list[tuple]:
    """The entries of `param_targets` (param, target, name, module; param and module weakly)
    of each parameter of `optimizer` that is this model's: its own long-lived tuples, so that a
    step makes none per parameter (recorder._GradHook says why that matters)."""
    entry = param_targets.entry
    found = (entry(p) for group in optimizer.param_groups for p in group["params"])
    return [e for e in found if e is not None]
