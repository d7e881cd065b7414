"""Every hook and patch of one inspector, owned by one `Borrowed`: the inspector is active
exactly while that owner holds its changes (so `borrow.restore_all()`, as `%unload_ext` runs it,
stops the inspector too).

A root forward pre-hook starts each step; on a recorded step the call tracker installs ONE
global module forward hook (`global_hook.py`), removed again by the root's (always-called)
forward hook. Compiled modules run eagerly while inspected (`eagerly.py`); optimiser steps are
heard through the process's one set of listeners (`optimizer_steps.py`).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from ...borrow import Borrowed, uninterrupted
from ...errors import TRAP_FRAME, NonFiniteError, without_our_frames
from ..diagnostics import Diagnostics, user_stacklevel
from ..targets import Target
from . import losses
from .calls import CallTracker, StepMethod
from .copies import Uncopied
from .eagerly import compiled_later, eager, run_compiled_modules_eagerly
from .extras import ParamTargets
from .global_hook import GlobalHook
from .optimizer_rows import OptimizerRows
from .optimizer_steps import optimizer_steps
from .recorder import Recorder

# Methods a LightningModule (or anything shaped like one) is driven through instead of forward.
STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")
class Attachment:
    """The hooks and patches of one inspector; `active` is whether its owner holds them."""

    def __init__(self, name: str, diagnostics: Diagnostics):
        self._name = name
        self._say = diagnostics.say
        self._owner: Borrowed | None = None
        self._model: nn.Module | None = None  # held while attached (unless `hold` is False)
        self._model_ref: Callable[[], nn.Module | None] = lambda: None
        # the global forward hook: the call tracker installs and removes it (engine.py)
        self._global_hook = GlobalHook()
        self.install_hook = self._global_hook.install
        self.remove_hook = self._global_hook.remove
        self._probes: list = []  # handles of the "called some other way" probe
        self._said_no_optimizer = False  # params=True saw no optimiser step (said once)

    def is_active(self) -> bool:
        """Whether the owner still holds the hooks: not once given back, by `detach` or by
        `borrow.restore_all()` (then without this inspector being told first)."""
        owner = self._owner
        return owner is not None and owner.active

    active = property(is_active)

    def attach(self, model: nn.Module, wrapper: nn.Module | None, targets: dict[int, Target],
               calls: CallTracker, recorder: Recorder, *, params: bool,
               on_detach: Callable[[], None], hold: bool = True) -> None:
        """Attach every hook and patch; on failure nothing stays. `on_detach` runs when the
        owner gives them back (by `detach`, or by `borrow.restore_all` on unload). `hold`
        False: the model is held weakly, by its hooks' owner too (inspect_all: a model goes
        when the script drops it; its hooks go with it, the rest when the inspector stops)."""
        with uninterrupted():  # a Ctrl-C meanwhile comes once the owner holds every hook
            owner = Borrowed(self._name)
            try:
                self._attach_all(owner, model, wrapper, targets, calls, recorder, params,
                                 on_detach, hold)
            except BaseException:
                owner.restore()
                raise
            self._owner = owner

    def _attach_all(self, owner: Borrowed, model: nn.Module, wrapper: nn.Module | None,
                    targets: dict[int, Target], calls: CallTracker, recorder: Recorder,
                    params: bool, on_detach: Callable[[], None], hold: bool) -> None:
        self._model = model if hold else None  # strongly, until the owner gives all back
        self._model_ref = weakref.ref(model)

        def detached() -> None:  # runs last: after every hook is gone
            self._model, self._model_ref = None, lambda: None
            on_detach()

        owner.on_restore(detached, "inspector state")
        uncopied = Uncopied()  # torch.save(model), deepcopy: without our hooks
        owner.on_restore(uncopied.give_back, "copies of the model without our hooks")
        calls.targets, calls.hooked = targets, dict(targets)
        self._global_hook.hook = calls.on_forward
        run_compiled_modules_eagerly(owner, model, wrapper, self._say)
        # before the root's: those are not the user's
        self._attach_late(owner, model, calls, uncopied)
        # The root hooks always run eagerly, also where torch.compile traces the model from
        # outside (compiled code then bypasses the module hooks: the root hook says so).
        uncopied.hook(model, owner.add_hook(lambda: model.register_forward_pre_hook(
            eager(calls.on_root_pre), with_kwargs=True), "root pre-hook"))
        uncopied.hook(model, owner.add_hook(lambda: model.register_forward_hook(
            eager(calls.on_root_post), always_call=True), "root hook"))
        for name in STEP_METHODS:  # Lightning drives a LightningModule through these
            method = getattr(model, name, None)
            if callable(method) and getattr(method, "__self__", None) is model:
                owner.set_attr(model, name, StepMethod(calls, method), f"{name} is a step")
                uncopied.attribute(model, name)
        owner.on_restore(self.remove_hook, "module forward hooks")
        owner.on_restore(recorder.remove_tensor_hooks, "gradient hooks on this step's tensors")
        losses.listen(owner, recorder.ran_this_step, recorder.record_loss)
        if recorder.grads:
            self._attach_param_hooks(owner, model, targets, calls, recorder)
        if params:
            self._attach_optimizer_hook(owner, model, targets, calls, recorder)
        if calls.manual_steps and calls.recording:
            self.install_hook()  # a manual step records every call until step()
        elif recorder.step < 0:
            self._attach_probes(owner, model, calls)

    def listen_to_optimizers(self, listener: Callable) -> None:
        """`listener(optimizer)` after every torch.optim step while attached."""
        optimizer_steps.add(None, listener)
        self._owner.on_restore(lambda: optimizer_steps.discard(None, listener),
                               "optimizer step listener (memory=True)")

    def detach(self) -> None:
        """Give every hook and patch back (harmless when already given back)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.restore()

    # --- the probe ----------------------------------------------------------------------------
    def end_probes(self) -> None:
        if self._probes:
            probes, self._probes = self._probes, []
            for handle in probes:
                handle.remove()

    def _attach_probes(self, owner: Borrowed, model: nn.Module, calls: CallTracker) -> None:
        """Until the first step: notice children that run outside a call of the model.

        One global pre-hook, not one per child: registering a hook costs ~10 µs, which a flat
        Sequential of 5 000 layers would pay at every inspect(). It is gone at the first step
        (or once it has spoken), so only calls made before that take torch's hook path.
        """
        probed = {id(child) for child in model.children()}
        hook = functools.partial(calls.on_child_probe, probed)
        self._probes.append(owner.add_hook(lambda: register_module_forward_pre_hook(hook),
                                           "probe: children called directly"))

    # --- module hooks and patches -----------------------------------------------------------
    def compiled_later(self, model: nn.Module, wrapper: nn.Module,
                       targets: dict[int, Target]) -> bool:
        """`torch.compile(model)` or `module.compile()` (then `wrapper` is the module) while
        attached: the wrapper runs the model eagerly, the module its eager call, until the owner
        gives it back (stop() then gives the compiled code back). False if not attached."""
        owner = self._owner
        if owner is None or not owner.active:
            return False
        return compiled_later(owner, model, wrapper, self._model_ref(), targets, self._say)

    def _attach_late(self, owner: Borrowed, model: nn.Module, calls: CallTracker,
                     uncopied: Uncopied) -> None:
        """torch runs global forward hooks before a module's own: a module with its own forward
        hooks (which may replace its output) is recorded by a hook of its own, added after them,
        so that its rows hold what its caller receives."""
        for module in model.modules():
            target = calls.targets.get(id(module))
            if (target is not None and module._forward_hooks
                    and not isinstance(module, torch.jit.ScriptModule)):
                del calls.hooked[id(module)]
                hook = functools.partial(calls.on_forward, own_hooks=True)
                uncopied.hook(module, owner.add_hook(
                    lambda m=module, h=hook: m.register_forward_hook(h, with_kwargs=True),
                    f"forward hook after those of {target.path or 'the model'}"))

    def _attach_param_hooks(self, owner: Borrowed, model: nn.Module, targets: dict[int, Target],
                            calls: CallTracker, recorder: Recorder) -> None:
        seen: set[int] = set()
        for module in model.modules():
            target = targets.get(id(module))
            if target is None:
                continue
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen or not param.requires_grad:
                    continue
                seen.add(id(param))
                hook = self._param_grad_hook(target, module, name, calls, recorder)
                owner.add_hook(lambda p=param, h=hook: p.register_post_accumulate_grad_hook(h),
                               f"grad hook {target.path}.{name}")

    def _param_grad_hook(self, target: Target, module: nn.Module, name: str,
                         calls: CallTracker, recorder: Recorder):
        def on_param_grad(param: torch.Tensor) -> None:
            __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
            if self.active and calls.recording and param.grad is not None:
                try:
                    recorder.record_safely(target, 0, "param_grad", name, param.grad,
                                           module.training)
                except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
                    without_our_frames(trapped)
                    raise

        return on_param_grad

    def _attach_optimizer_hook(self, owner: Borrowed, model: nn.Module,
                               targets: dict[int, Target], calls: CallTracker,
                               recorder: Recorder) -> None:
        """params=True: after each optimiser step, record the parameters it updated and the
        gradients it used (under DDP: after their all-reduce, so equal on every rank)."""
        rows = OptimizerRows(recorder, self._say)
        param_targets = ParamTargets()  # weakly: swapped-out modules go, ids are checked
        # Buffers (BatchNorm's running statistics...) with their modules: read after the first
        # optimiser step of each step, when this step's forward has updated them.
        buffer_modules: list[tuple[Target, weakref.ref]] = []
        for module in model.modules():
            target = targets.get(id(module))
            if target is not None:
                for name, param in module.named_parameters(recurse=False):
                    param_targets.add(param, target, name, module)
                if next(module.named_buffers(recurse=False), None) is not None:
                    buffer_modules.append((target, weakref.ref(module)))

        def on_optimizer_step(optimizer) -> None:
            __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
            if self.active and calls.recording:
                rows.after_step(optimizer, param_targets, buffer_modules)

        def before_optimizer_step(optimizer) -> None:
            if self.active and calls.recording:
                rows.before_step(optimizer, param_targets)

        optimizer_steps.add(before_optimizer_step, on_optimizer_step)

        def remove() -> None:
            optimizer_steps.discard(before_optimizer_step, on_optimizer_step)
            rows.snapshots.clear()
            # when inspection ends: say if nothing was seen of a model that trained (one only
            # evaluated, as a reloaded best checkpoint, has no optimiser to see)
            if (recorder.optimizer_steps == 0 and recorder.step >= 0 and recorder.trained
                    and not self._said_no_optimizer):  # once: a model loaded back reattaches
                self._said_no_optimizer = True
                warnings.warn(
                    "singlecard_nb: params=True, but no torch.optim optimiser stepped this "
                    "model's parameters on a recorded step, so there are no 'param' / "
                    "'step_grad' rows (parameters updated by hand are not seen).",
                    RuntimeWarning, stacklevel=user_stacklevel())

        owner.on_restore(remove, "optimizer step hook")

