"""Every optimiser step of the process, heard before and after by the inspectors that listen
(params=True, memory=True): one shared set of listeners whose patch and hook come with the first
listener and go with the last, never while a step iterates torch's table of pre-hooks."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import torch

from ...borrow import Borrowed, Listeners, uninterrupted, wrap_like
from ...errors import TRAP_FRAME, NonFiniteError, without_our_frames
from .eagerly import eager


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
                __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
                original(optimizer)  # torch's: the profiler hooks into it
                try:
                    self._after(optimizer)
                except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
                    without_our_frames(trapped)
                    raise
                if not self.after:
                    self._leave_if_idle(1)  # this step is past its pre-hooks

            owner.set_attr(torch.optim.Optimizer, _STEP_CODE,
                           eager(wrap_like(original, step_code)),
                           "torch.optim.Optimizer._optimizer_step_code (after each step)")
        else:  # a torch without it: its table of post-hooks, left when no step runs
            owner.add_hook(lambda: register_optimizer_step_post_hook(
                eager(lambda optimizer, args, kwargs: self._after_step_hook(optimizer))),
                "optimizer step hook (all params=True inspectors)")

    def _before(self, optimizer, args, kwargs) -> None:
        for listener in self.before:  # a tuple: replaced, never changed, while we loop
            listener(optimizer)

    def _after(self, optimizer) -> None:
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        for listener in self.after:
            listener(optimizer)

    def _after_step_hook(self, optimizer) -> None:
        """The post-hook where torch has no `_optimizer_step_code` to follow."""
        __tracebackhide__ = TRAP_FRAME  # a NonFiniteError passes through
        try:
            self._after(optimizer)
        except NonFiniteError as trapped:  # raised as from torch's call (errors.py)
            without_our_frames(trapped)
            raise


optimizer_steps = _OptimizerSteps()  # the process's one
