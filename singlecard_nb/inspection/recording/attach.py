"""Every hook and patch of one inspector, owned by one `Borrowed`: the inspector is active
exactly while that owner holds its changes (so `borrow.restore_all()`, as `%unload_ext` runs it,
stops the inspector too).

A root forward pre-hook starts each step; on a recorded step the call tracker installs ONE
global module forward hook, removed again by the root's (always-called) forward hook, so other
models, and steps that `every=N` skips, run on torch's hook-free fast path. Compiled modules run
eagerly while inspected (compiled code bypasses module hooks).
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from ...borrow import Borrowed, Listeners, uninterrupted, wrap_like
from ..diagnostics import Diagnostics
from ..targets import Target
from .calls import CallTracker, StepMethod
from .copies import Uncopied
from .extras import ParamTargets
from .recorder import Recorder

# Methods a LightningModule (or anything shaped like one) is driven through instead of forward.
STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")
# torch's handle for register_module_forward_hook(..., with_kwargs=True) does not remove the
# with_kwargs entry it made (torch <= 2.13): the engine removes it itself.
_GLOBAL_WITH_KWARGS: dict = getattr(_module_globals, "_global_forward_hooks_with_kwargs", {})
# None on a torch without these tables: the hook is then registered through torch's function
_GLOBAL_HOOKS: dict | None = (getattr(_module_globals, "_global_forward_hooks", None)
                              if hasattr(_module_globals, "_global_forward_hooks_with_kwargs")
                              else None)
_GLOBAL_ALWAYS_CALLED: dict = getattr(_module_globals, "_global_forward_hooks_always_called", {})
_TORCH_COMPILE_HOOK_NOTE = r"Using `torch.compile\(module\)` when there are global hooks"


def eager(fn: Callable) -> Callable:
    """`fn`, never traced into a compiled graph (torch.compiler.disable where available)."""
    disable = getattr(torch.compiler, "disable", None)
    return disable(fn) if disable is not None else fn


def _remove_filter(entry: tuple) -> None:
    if entry in warnings.filters:
        warnings.filters.remove(entry)
        getattr(warnings, "_filters_mutated", lambda: None)()  # what filterwarnings calls


def _run_wrapper_eagerly(owner: Borrowed, model: nn.Module, wrapper: nn.Module) -> None:
    owner.set_attr(wrapper, "forward", model.__call__,
                   "torch.compile wrapper runs the original module")
    # torch notes that global hooks also fire for the wrapper; ours ignore it
    warnings.filterwarnings("ignore", message=_TORCH_COMPILE_HOOK_NOTE)
    owner.on_restore(functools.partial(_remove_filter, warnings.filters[0]),
                     "warnings filter for torch.compile's global hook note")


def _step_wrapper_code():
    """The code of torch's `optimizer.step()` wrapper (every optimiser class's step runs in one;
    None where torch has no `profile_hook_step`)."""
    make = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    try:
        return make(lambda *args, **kwargs: None).__code__ if make is not None else None
    except Exception:  # noqa: BLE001 - a torch that changed it: steps are never known idle
        return None


_STEP_WRAPPER = _step_wrapper_code()
_STEP_CODE = "_optimizer_step_code"  # torch calls optimizer._optimizer_step_code() after step


def steps_running() -> int | None:
    """How many `optimizer.step()` calls are running now, over every thread's stack (None:
    unknown, on a torch without the wrapper)."""
    if _STEP_WRAPPER is None:
        return None
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            count += frame.f_code is _STEP_WRAPPER
            frame = frame.f_back
    return count


class _OptimizerSteps(Listeners):
    """One point before and one after each optimiser step for every inspector of the process
    that listens to steps, made when the first listener comes and given back when the last one
    goes.

    After a step: `torch.optim.Optimizer._optimizer_step_code` (which torch calls after each
    step) is swapped for one that calls torch's and then the listeners: a class attribute, so
    it comes and goes at any instant. Before a step there is only torch's table of global
    pre-hooks, which `optimizer.step()` iterates: an entry removed meanwhile (by an inspector
    stopped in another thread, or inside a step hook) raises "OrderedDict mutated during
    iteration" in the training thread. So the entry leaves when no step is running in any
    thread; while one is, the last listener's leaving is deferred to the end of that step
    (after its pre-hooks, at `_optimizer_step_code`) or to the next listener leaving.
    Listeners are kept in tuples that are replaced, never changed, so a step looping over them
    in another thread never sees them change.
    """

    name = "inspect: optimizer step hooks"

    def __init__(self) -> None:
        super().__init__()
        self.before: tuple[Callable, ...] = ()
        self.after: tuple[Callable, ...] = ()
        self._lock = threading.RLock()

    def add(self, before: Callable | None, after: Callable | None) -> None:  # type: ignore[override]
        """`before(optimizer)` before and `after(optimizer)` after each step (None: neither)."""
        with uninterrupted(), self._lock:
            self._install_once()
            if before is not None:
                self.before = (*self.before, before)
            if after is not None:
                self.after = (*self.after, after)

    def discard(self, before: Callable | None, after: Callable | None) -> None:  # type: ignore[override]
        with self._lock:
            self.before = tuple(fn for fn in self.before if fn is not before)
            self.after = tuple(fn for fn in self.after if fn is not after)
        self._leave_if_idle(0)

    @property
    def installed(self) -> bool:
        return self._owner is not None and self._owner.active

    def _leave_if_idle(self, steps_here: int) -> None:
        """Give everything back if nobody listens and no step but the `steps_here` this thread
        is in (past their pre-hooks) is running."""
        with uninterrupted(), self._lock:
            if self.before or self.after or self._owner is None:
                return
            running = steps_running()
            if running is None or running > steps_here:
                return  # deferred: a step may be iterating torch's pre-hook table
            owner, self._owner = self._owner, None
            owner.restore()

    def install(self, owner: Borrowed) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        owner.add_hook(lambda: register_optimizer_step_pre_hook(eager(self._before)),
                       "optimizer step pre-hook (all params=True inspectors)")
        original = torch.optim.Optimizer.__dict__.get(_STEP_CODE)
        if callable(original) and _STEP_WRAPPER is not None:
            def step_code(optimizer) -> None:
                original(optimizer)  # torch's: the profiler hooks into it
                self._after(optimizer)
                if not self.after:
                    self._leave_if_idle(1)  # this step is past its pre-hooks

            owner.set_attr(torch.optim.Optimizer, _STEP_CODE,
                           eager(wrap_like(original, step_code)),
                           "torch.optim.Optimizer._optimizer_step_code (after each step)")
        else:  # a torch without it: its table of post-hooks, left when no step runs
            owner.add_hook(lambda: register_optimizer_step_post_hook(
                eager(lambda optimizer, args, kwargs: self._after(optimizer))),
                "optimizer step hook (all params=True inspectors)")

    def _before(self, optimizer, args, kwargs) -> None:
        for listener in self.before:  # a tuple: replaced, never changed, while we loop
            listener(optimizer)

    def _after(self, optimizer) -> None:
        for listener in self.after:
            listener(optimizer)


_optimizer_steps = _OptimizerSteps()


class Attachment:
    """The hooks and patches of one inspector; `active` is whether its owner holds them."""

    def __init__(self, name: str, diagnostics: Diagnostics):
        self._name = name
        self._say = diagnostics.say
        self._owner: Borrowed | None = None
        self._model: nn.Module | None = None  # held while attached (unless `hold` is False)
        self._model_ref: Callable[[], nn.Module | None] = lambda: None
        self._forward_hook: Callable | None = None
        self._global_handle = None
        self._probes: list = []  # handles of the "called some other way" probe

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
        self._forward_hook = calls.on_forward
        self._run_compiled_modules_eagerly(owner, model, wrapper)
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
        _optimizer_steps.add(None, listener)
        self._owner.on_restore(lambda: _optimizer_steps.discard(None, listener),
                               "optimizer step listener (memory=True)")

    def detach(self) -> None:
        """Give every hook and patch back (harmless when already given back)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.restore()

    # --- the global hook and the probe ------------------------------------------------------
    def install_hook(self) -> None:
        """The global forward hook (with_kwargs), entered into torch's tables in an order that
        is safe at any instant: another thread running any module never finds the hook
        without its with_kwargs flag (torch's own register sets the flag second, and such a
        call would pass the hook the wrong arguments), and the handle is ours before the hook
        is in a table, so a Ctrl-C in between leaves nothing that remove_hook cannot find."""
        if self._global_handle is not None:
            return
        if _GLOBAL_HOOKS is None:  # a torch without these tables: its own register
            self._global_handle = register_module_forward_hook(self._forward_hook,
                                                               with_kwargs=True)
            return
        handle = RemovableHandle(_GLOBAL_HOOKS, extra_dict=_GLOBAL_ALWAYS_CALLED)
        self._global_handle = handle
        _GLOBAL_WITH_KWARGS[handle.id] = True
        _GLOBAL_HOOKS[handle.id] = self._forward_hook

    def remove_hook(self) -> None:
        """The hook out of torch's tables, then its flag; forgotten only once both are gone
        (an interrupted removal is finished by the next call)."""
        handle = self._global_handle
        if handle is not None:
            handle.remove()
            _GLOBAL_WITH_KWARGS.pop(handle.id, None)
            self._global_handle = None

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
    def _run_compiled_modules_eagerly(self, owner: Borrowed, model: nn.Module,
                                      wrapper: nn.Module | None) -> None:
        """Compiled code bypasses module hooks: while inspected, compiled modules run eagerly."""
        compiled = []
        for path, m in model.named_modules():
            if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile()
                owner.set_attr(m, "_compiled_call_impl", None, "compiled module runs eagerly")
                compiled.append(repr(path))
        if wrapper is not None:  # torch.compile(module): call the original instead
            _run_wrapper_eagerly(owner, model, wrapper)
            compiled.insert(0, f"the torch.compile wrapper of {type(model).__name__}")
        if compiled:
            listed = ", ".join(compiled[:5]) + (", ..." if len(compiled) > 5 else "")
            self._say("compiled", f"compiled modules run eagerly while inspected ({listed}), so "
                      "that every module inside them is recorded; the values are those of the "
                      "eager model. insp.stop() gives the compiled code back.")

    def compiled_later(self, model: nn.Module, wrapper: nn.Module,
                       targets: dict[int, Target]) -> bool:
        """`torch.compile(model)` or `module.compile()` (then `wrapper` is the module) while
        attached: the wrapper runs the model eagerly, the module its eager call, until the owner
        gives it back (stop() then gives the compiled code back). False if not attached."""
        owner = self._owner
        if owner is None or not owner.active:
            return False
        if wrapper is model and id(model) in targets:  # module.compile(): in place
            owner.set_attr(model, "_compiled_call_impl", None, "compiled module runs eagerly")
            self._say("compiled", f"{type(model).__name__}.compile() while it is inspected: it "
                      "runs eagerly while inspected, so that every module inside it is "
                      "recorded. insp.stop() gives the compiled code back.")
            return False
        if model is not self._model_ref():
            return False
        _run_wrapper_eagerly(owner, model, wrapper)
        self._say("compiled", f"torch.compile({type(model).__name__}) while it is inspected: "
                  "the compiled wrapper runs the model eagerly while inspected, so that every "
                  "module inside it is recorded; the values are those of the eager model. "
                  "insp.stop() gives the compiled code back.")
        return True

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
            if self.active and calls.recording and param.grad is not None:
                recorder.guarded(recorder.record_grad, target, 0, "param_grad", name,
                                 param.grad, recorder.step, module.training)

        return on_param_grad

    def _attach_optimizer_hook(self, owner: Borrowed, model: nn.Module,
                               targets: dict[int, Target], calls: CallTracker,
                               recorder: Recorder) -> None:
        """params=True: after each optimiser step, record the parameters it updated and the
        gradients it used (under DDP: after their all-reduce, so equal on every rank)."""
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
            if self.active and calls.recording:
                recorder.record_optimizer_step(optimizer, param_targets, buffer_modules)

        def before_optimizer_step(optimizer) -> None:
            if self.active and calls.recording:
                recorder.before_optimizer_step(optimizer, param_targets)

        _optimizer_steps.add(before_optimizer_step, on_optimizer_step)

        def remove() -> None:
            _optimizer_steps.discard(before_optimizer_step, on_optimizer_step)
            recorder.snapshots.clear()
            # when inspection ends: say if nothing was seen
            if recorder.optimizer_steps == 0 and recorder.step >= 0:
                warnings.warn(
                    "singlecard_nb: params=True, but no torch.optim optimiser stepped this "
                    "model's parameters on a recorded step, so there are no 'param' / "
                    "'step_grad' rows (parameters updated by hand are not seen).",
                    RuntimeWarning, stacklevel=4)

        owner.on_restore(remove, "optimizer step hook")

