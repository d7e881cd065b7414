"""Models found while code runs: `inspect_all()` inspects every model a script trains, unchanged.

A model is the outermost `nn.Module` the code calls (no other module's call is running below it
on the stack) that has parameters. A DataParallel / DDP / FSDP / torch.compile wrapper counts as
the model it wraps; a module found while a method of a bigger module runs (a LightningModule's
`training_step` calling `self.encoder`) counts as that bigger module. Loss modules and other
parameterless modules are not models, nor are submodules of a model called on their own, nor
copies of a model (`copy.deepcopy` for EMA, `AveragedModel`). A model loaded back from a
checkpoint of a model found before (`torch.save(model)`, later `model = torch.load(path)`: the
unpickle, never a model its constructor built) continues that model's records once the original
is dropped (checkpoints.py).

Cost: ONE global forward pre-hook looks for models. It is taken out of torch's table when a
known model's call begins and put back when that call returns, so the calls inside a model run
as they would under `inspect(model)` alone (on torch's hook-free path on steps `every=N` skips),
and code that calls no module never meets it.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from typing import Any

from torch import nn

from ...borrow import Borrowed, uninterrupted
from ..diagnostics import user_stacklevel
from ..engine import Inspector
from ..recording import calls_on_stack, compile_listeners
from .finder_hook import FinderHook
from .found import FoundModels
from .marks import Marks
from .model_rules import (
    COPY_CLASSES,
    call_kwargs,
    has_parameters,
    method_owner,
    other_call_below,
    unwrapped,
)

__all__ = ["Discovery", "inspect_all", "inspectors"]

# torch's note, as a pattern unlike recording/eagerly.py's: warnings keeps one copy of equal filters, so an
# inspector giving its filter back would otherwise take this one away too
_TORCH_COMPILE_HOOK_NOTE = r"Using `torch\.compile\(module\)` when there are global hooks"

# Code that makes and calls modules in a loop (a new nn.Linear per batch) would otherwise get an
# inspector per instance, without bound: past this many, new models are not inspected (said once)
MAX_MODELS = 32
_current: Discovery | None = None  # the latest inspect_all(): what inspectors() reads


class Discovery:
    """Finds models as they are called and inspects each with the same options; see
    `inspect_all()`. `found` callbacks get (name, Inspector) of each new model."""

    def __init__(self, **options: Any):
        Inspector(nn.Module(), **options)  # the options checked where inspect() checks them
        self.options = options
        self._models = FoundModels(options, self._say_once)  # their names and inspectors
        # id(module) -> (weak ref, its inspector or None): models and their wrappers, and what is
        # no model (a model's submodules, copies, modules called inside another's call)
        self._known: dict[int, tuple[weakref.ref, Inspector | None]] = {}
        self._marks = Marks(self._on_return, self._on_saved)  # our hooks on the models found
        self._owner: Borrowed | None = None
        # what a run's compiled wrappers borrow (each wrapper holds its model): given back by
        # the next run's reset, so a model of one run never outlives the next
        self._run_patches = Borrowed("inspect all: compiled wrappers run eagerly")
        self._finder = FinderHook(self._on_call, lambda: self.active)
        self._compile_listener = self._compiled
        self._lock = threading.RLock()
        self.found: list = []  # callbacks fn(name, insp), e.g. the live view of %inspect all
        self.errors: list[str] = []  # what could not be done, each said once
        self._said: set[str] = set()

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        owner = self._owner
        return owner is not None and owner.active

    def start(self) -> Discovery:
        """Look for models from now on (stops another inspect_all); idempotent."""
        global _current
        if self.active:
            return self
        if _current is not None and _current is not self:
            _current.stop()
        try:  # a Ctrl-C (held back until the owner holds it all) or a failure: nothing stays
            with uninterrupted():
                owner = Borrowed("inspect all: finding models")
                try:
                    self._finder.register(owner)
                    compile_listeners.add(self._compile_listener)
                    owner.on_restore(lambda: compile_listeners.discard(self._compile_listener),
                                     "torch.compile listener")
                    # torch warns at each compiled wrapper's call that global hooks exist:
                    # ours skips it
                    warnings.filterwarnings("ignore", message=_TORCH_COMPILE_HOOK_NOTE)
                    entry = warnings.filters[0]
                    owner.on_restore(lambda: _remove_filter(entry), "warnings filter")
                    owner.on_restore(self._models.stop, "inspectors of the models found")
                    owner.on_restore(self._run_patches.restore, "compiled wrappers run eagerly")
                    owner.on_restore(self._marks.remove, "hooks on the models found")
                except BaseException:
                    owner.restore()
                    raise
                self._owner = owner
                _current = self
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> Discovery:
        """Stop looking and stop every inspector; their records stay readable."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.restore()
        return self

    def reset(self) -> None:
        """A new run (`%run` again): the models found so far are stopped and forgotten."""
        with self._lock:
            self._models.clear()
            self._run_patches.restore()
            self._marks.remove()  # a model of the last run called again is a model again
            self._known = {}
            self._finder.arm()

    def adopt(self, found: dict[str, Any]) -> None:
        """Models recorded in other processes join `inspectors()` by name: each rank's models
        of a `%run` under `%singlecard cpu --ranks N` (`GPT[rank 1]`, read from its file)."""
        with self._lock:
            self._models.adopt(found)

    def flush(self) -> None:
        """Each inspector's statistics to the host; looking again after a Ctrl-C (which skips
        the hook that puts the finder back when a model's call returns)."""
        self._models.stop_gone()
        for insp in list(self._models.by_name.values()):
            if insp.active:
                insp.flush()
        self._finder.arm()

    def __enter__(self) -> Discovery:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def inspectors(self) -> dict[str, Inspector]:
        """{name: Inspector} of every model found, in the order found (the user's own, where
        `inspect(model)` replaced ours)."""
        with self._lock:
            self._models.follow_replacements()
            return dict(self._models.by_name)

    def __repr__(self) -> str:
        state = "looking" if self.active else "stopped"
        names = ", ".join(self._models.by_name) or "no model yet"
        return f"<inspect_all: {state}; {names}>"

    # --- the finder back in torch's table (finder_hook.py) when a model's call returns ---------
    def _on_return(self, module, args, output) -> None:
        self._finder.arm()  # the model's call is over: look for models again

    def __deepcopy__(self, memo: dict) -> Discovery:
        return self  # a copy of a model carries our hook, still ours: that is how copies show

    # --- finding ----------------------------------------------------------------------------
    def _on_call(self, module: nn.Module, args: tuple) -> None:
        entry = self._known.get(id(module))
        if entry is not None and entry[0]() is module:
            if entry[1] is not None:
                self._finder.disarm()  # a model's call: its inspector records it; back when it returns
            return
        if not has_parameters(module):
            return  # a loss, an activation: no model
        try:
            with self._lock:
                self._consider(module, args)
        except Exception as e:  # finding a model must never break the user's forward
            self._known[id(module)] = (weakref.ref(module), None)
            self._say_once(f"{type(e).__name__}: {e}", f"could not inspect the "
                           f"{type(module).__name__} called: {e!r}", RuntimeWarning)

    def _say_once(self, kind: str, message: str, category: type[Warning] = UserWarning) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self.errors.append(message)
            warnings.warn(f"singlecard_nb: inspect all: {message}", category,
                          stacklevel=user_stacklevel())  # the user's line that ran the model

    def _consider(self, module: nn.Module, args: tuple) -> None:
        frame = sys._getframe(2)
        if calls_on_stack(frame, module) < 1 or other_call_below(frame, module):
            self._forget_as_model(module)  # called inside another module's call
            return
        outer, method = method_owner(frame, module)
        candidate = outer or module
        model, chain = unwrapped(candidate)
        if type(model).__name__ in COPY_CLASSES or self._marks.on_copy(model):
            self._forget_as_model(candidate)
            return
        inner = getattr(model, "_orig_mod", model)
        entry = self._known.get(id(inner))
        fresh = False
        if entry is not None and entry[0]() is inner and entry[1] is not None:
            insp = entry[1]  # a new wrapper (DDP, torch.compile) of a model found before
        elif len(self._models) >= MAX_MODELS:
            self._forget_as_model(candidate)
            self._say_once("many", f"more than {MAX_MODELS} models were found, so "
                           f"{type(inner).__name__} and later new models are not inspected "
                           "(a script that makes a new module per step?). Inspect the one you "
                           "mean with singlecard_nb.inspect(model).")
            return
        else:
            name, insp, fresh = self._models.inspector(model, inner)
            self._found(name, insp, model, inner)
        for wrapper in (candidate, *chain, model):
            self._known[id(wrapper)] = (weakref.ref(wrapper), insp)
        self._marks.add(candidate)
        self._finder.disarm()
        if not fresh:
            return  # its hooks were there before this call began: they record it
        if outer is not None:
            insp.found_in_method(method if insp.model is outer else None)
        elif candidate is model and insp.model is model:
            # Found in this call's pre-hooks: the step this call is begins here (its root
            # hook, added to the module's forward hooks, which torch reads after forward,
            # ends it).
            insp.found_in_call(args, call_kwargs(sys._getframe(2)))

    def _found(self, name: str, insp: Inspector, model: nn.Module, inner: nn.Module) -> None:
        """A model found (or loaded back): known from now on, marked, announced."""
        self._forget_as_model(inner)  # its parts called on their own are no new model
        if inner is not model:
            self._known[id(inner)] = (weakref.ref(inner), insp)
        self._marks.add(inner)  # also the mark a copy (deepcopy for EMA) carries
        for callback in self.found:
            callback(name, insp)

    def _on_saved(self, module: nn.Module) -> dict | None:
        """A found model (or its wrapper) is pickled: its checkpoint is remembered, and the
        attributes its pickle carries returned (found.py)."""
        entry = self._known.get(id(module))
        if entry is not None and entry[0]() is module:
            with self._lock:
                return self._models.saved(entry[1])
        return None

    def _forget_as_model(self, module: nn.Module) -> None:
        known = self._known
        for sub in module.modules():
            entry = known.get(id(sub))
            if entry is None or entry[0]() is not sub:  # absent, or a dead module's id
                known[id(sub)] = (weakref.ref(sub), None)

    def _compiled(self, model: nn.Module, wrapper: nn.Module) -> None:
        """torch.compile(model) while looking: the wrapper runs the model eagerly from its first
        call on (torch chooses what a call runs before the hook that finds it)."""
        if (self.active and wrapper is not model and has_parameters(model)
                and getattr(wrapper, "_orig_mod", None) is model):
            self._run_patches.set_attr(
                wrapper, "forward", model.__call__,
                "torch.compile wrapper runs eagerly while models are looked for")


def _remove_filter(entry: tuple) -> None:
    if entry in warnings.filters:
        warnings.filters.remove(entry)
        getattr(warnings, "_filters_mutated", lambda: None)()


def inspect_all(**options: Any) -> Discovery:
    """Inspect every model the code calls from now on, each with `inspect()`'s options; returns
    the handle (also a context manager: `with scn.inspect_all(grads=True): train()`).

    A model is the outermost `nn.Module` called that has parameters (see the module's rules);
    `inspectors()` lists them by class name (`GPT`, then `GPT#2` for a second instance).
    Starting it stops a previous inspect_all.
    """
    return Discovery(**options).start()


def inspectors() -> dict[str, Inspector]:
    """{name: Inspector} of every model the latest `inspect_all()` found, in the order found."""
    return _current.inspectors if _current is not None else {}


def current() -> Discovery | None:
    """The latest inspect_all() (looking or stopped), or None."""
    return _current
