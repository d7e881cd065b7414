"""Per-module tensor shapes and statistics on forward and backward passes.

    with singlecard_nb.inspect(model) as insp:
        loss = model(x).sum(); loss.backward()
    insp.frame()      # one row per (step, module call, tensor)

`inspect()` is the spine, first below; `Inspector` is the facade users call, one class with
two halves: options and start/stop, then what was recorded, read and shown. Its parts, one
module each in `recording/`: the call tracker (`calls.py`: the open call, steps, `every`), the
recorder (`recorder.py`: tensors of the pending step), the
store (`store.py`: steps on the host), and the attach owner (`attach.py`: every hook and patch,
whose state is `active`). Statistics are taken on the tensor's device (`kernel/stats.py`) and
reach the host once per step. No activation is referenced after its hook returns, and a stopped
inspector holds its model only weakly.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

from ..borrow import uninterrupted
from .diagnostics import Diagnostics
from .kernel import VALUES
from .memory import MemoryWatch
from .options import Kept, check_arguments, check_memory
from .recording import (
    COLUMNS,
    DEFAULT_MAX_ROWS,
    Attachment,
    CallTracker,
    Recorder,
    StepRecord,
    Store,
    compile_listeners,
    step_clock,
    to_frame,
)
from .targets import globs, select_targets, track_histograms
from .views import Summary

__all__ = ["COLUMNS", "Inspector", "inspect", "inspector"]


def inspect(model: nn.Module, include=None, exclude=None, every: int = 1, grads: bool = False,
            trap: bool = False, max_rows: int | None = None, *, inputs: bool | str = "root",
            hist=None, hist_bins: int = 64, exact_std: bool = False,
            steps: str = "forward", params: bool = False, memory: bool = False) -> Inspector:
    """Inspect `model`: use as `with inspect(model) as insp:` or call `.start()` / `.stop()`.

    What happens, in order:
    1. The options are checked (`options.check_arguments`): a bad one is refused naming its
       value, before any hook is attached.
    2. The parts are made: the call tracker, the recorder, the store on the host, the memory
       watch (memory=True).
    3. `start()`: the modules to record are chosen (`targets.select_targets`), an inspector
       already recording this model is stopped, and every hook and patch is attached under
       one owner (`recording/attach`), Ctrl-C held back until all of it is owned.
    4. Each call of the model records its tensors' statistics on their device; they reach the
       host once per step (trap=True reads each at once and raises `NonFiniteError`).
    5. `stop()` (the `with` block's end, also on an error or Ctrl-C): every hook and patch is
       given back and the last step moved to the host; the rows stay readable (`frame()`,
       `summary()`, `findings()`, `live()`, `plot()`, `save()`).

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
    memory: also the bytes of each output's storage ("mem_out") and what each module's
        forward saved for backward ("mem_saved"; on a GPU also the running peak, "mem_peak"),
        and `insp.memory()`: what each module holds.
    """
    return Inspector(model, include, exclude, every, grads, trap, max_rows, inputs, hist,
                     hist_bins, exact_std, steps, params, memory).start()


# Inspectors recording a model (one per model: a re-run cell replaces the older one), and the
# latest started per model for `inspector(model)`; keys are id(model), checked against .model.
_active: dict[int, Inspector] = {}
_latest: weakref.WeakValueDictionary[int, Inspector] = weakref.WeakValueDictionary()



class Inspector:
    """Records shapes and statistics of module tensors; see `inspect()` for the options.

    Two halves in one class: recording (options, start/stop, steps) and reading (rows,
    histories, views), which reads the recording's parts (`_recorder`, `_store`, `_lock`,
    `_calls`, `_memory`) and never changes them but to flush the pending step to the host."""

    every = Kept("_calls")
    grads = Kept("_recorder")
    trap = Kept("_recorder")
    inputs = Kept("_recorder")
    exact_std = Kept("_recorder")
    hist_bins = Kept("_recorder")
    max_rows = Kept("_store")
    errors = Kept("_diagnostics")  # failures inside the inspector, never raised to the user
    notes = Kept("_diagnostics")  # what could not be recorded as asked, said once per kind

    def __init__(self, model: nn.Module, include=None, exclude=None, every: int = 1,
                 grads: bool = False, trap: bool = False, max_rows: int | None = None,
                 inputs: bool | str = "root", hist=None, hist_bins: int = 64,
                 exact_std: bool = False, steps: str = "forward", params: bool = False,
                 memory: bool = False):
        model, wrapper = check_arguments(model, every, max_rows, steps, inputs)
        # Weak references: while active the attach owner holds the model (and the model's hooks
        # hold this inspector); once stopped, nothing here keeps the model's memory alive.
        self._model = weakref.ref(model)
        self._wrapper = weakref.ref(wrapper) if wrapper is not None else None
        self._model_id, self._model_name = id(model), type(model).__name__
        self.include, self.exclude = globs(include), globs(exclude)
        self.hist_patterns = globs(hist)
        self.params = params
        # One lock around the pending step: the model may run in one thread (and its backward
        # in autograd's) while another reads frames. The parts share it.
        self._lock = lock = threading.RLock()
        self._diagnostics = Diagnostics()
        self._store = Store(lock, max_rows or DEFAULT_MAX_ROWS, self._diagnostics, self)
        self._attach = Attachment(f"inspect({self._model_name})", self._diagnostics)
        # memory=True: what each module saved for backward and returned. Its part owns the
        # ledger; the recorder and the call tracker are handed it and feed it.
        self._memory = (MemoryWatch(model, lambda: self._calls.targets, self._diagnostics)
                        if check_memory(memory) else None)
        ledger = self._memory.ledger if self._memory is not None else None
        self._recorder = Recorder(self._store, self._diagnostics, lock, self._attach.is_active,
                                  inputs=inputs, trap=trap, grads=grads, exact_std=exact_std,
                                  hist_bins=hist_bins, memory=ledger)
        self._calls = CallTracker(model, self._recorder, self._diagnostics, lock, every=every,
                                  manual_steps=steps == "manual", active=self._attach.is_active,
                                  install_hook=self._attach.install_hook,
                                  remove_hook=self._attach.remove_hook,
                                  end_probes=self._attach.end_probes, memory=ledger)
        self._recorder.trap_cause = self._first_grown  # what the trap names as the cause
        self._recorder.prior_cause = self._prior_cause  # ... and a cause that came before it
        self._compile_listener = self._compiled_later  # one bound object: discard needs it
        # the inspector started on the model while this one recorded it (which stopped this)
        self.replaced_by: Inspector | None = None

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module | None:
        """The inspected model; None once stopped and the model is gone (the rows stay)."""
        return self._model()

    @property
    def active(self) -> bool:
        """Whether the hooks are attached: False after stop() and after `%unload_ext`."""
        return self._attach.active

    def start(self, *, hold_model: bool = True) -> Inspector:
        """Attach hooks (one owner removes them all); idempotent.

        Starting an inspector on a model that another active inspector records stops that one
        (a re-run notebook cell would otherwise stack recorders). `hold_model` False: the
        model is not kept alive by this inspector (inspect_all's); once it is collected there
        is nothing more to record, and `stop()` gives back the rest.
        """
        if self._attach.active:
            return self
        model = self._model()
        if model is None:
            raise RuntimeError(f"the {self._model_name} this inspector recorded no longer "
                               "exists, so it cannot start again; its rows stay readable. "
                               "Inspect the new model: singlecard_nb.inspect(model).")
        self.replaced_by = None  # recording its model again (a cell re-run)
        previous = _active.get(id(model))
        if previous is not None and previous is not self and previous.model is model:
            previous.stop()
            previous.replaced_by = self  # inspect_all lists (and saves) this one instead
            self._diagnostics.say(
                "replaced", "this inspector replaces the inspector already recording this "
                f"{self._model_name} (stopped; its rows stay readable). One model has one "
                "recording inspector: a re-run cell does not stack them.")
        self._calls.prepare()
        targets = select_targets(model, self.include, self.exclude, self.hist_patterns,
                                 self._diagnostics.say)
        wrapper = self._wrapper_object()
        try:  # a Ctrl-C (held back until all is attached) or a failure: nothing stays
            with uninterrupted():
                self._attach.attach(model, wrapper, targets, self._calls, self._recorder,
                                    params=self.params, on_detach=self._detached,
                                    hold=hold_model)
                compile_listeners.add(self._compile_listener)
                if self._memory is not None:
                    self._memory.started(model, self._attach.listen_to_optimizers)
                _active[id(model)] = self
                _latest[id(model)] = self
                if wrapper is not None:
                    _latest[id(wrapper)] = self
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> Inspector:
        """Remove every hook and move the last step's statistics to the host."""
        try:
            self._attach.detach()
        finally:
            self._detached()
        return self

    def _detached(self) -> None:
        """The hooks are gone (stop(), or `borrow.restore_all()` on unload): no call is open,
        the last step reaches the host, and this inspector no longer records its model."""
        if _active.get(self._model_id) is self:
            del _active[self._model_id]
        compile_listeners.discard(self._compile_listener)
        if self._memory is not None:
            self._memory.stopped(self._model())
        self._calls.close_all()
        self._recorder.flush()
        self._store.tell_listeners()  # also when no step was pending: a view draws "stopped"

    def __enter__(self) -> Inspector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        """End the current step now. From the first call on, only `step()` advances steps;
        with gradient accumulation (several forwards per optimiser step) pass
        `steps="manual"` so that the first step is counted the same way."""
        self._calls.manual_steps = True
        self._calls.begin_step()

    def flush(self) -> None:
        """Move the statistics recorded so far in this step to the host now (and close a call
        of the model that Ctrl-C interrupted: `%inspect` does this after each cell)."""
        self._recorder.flush()
        self._calls.settle(threading.get_ident())

    # --- for inspect_all, which finds a model while it already runs ---------------------
    def found_in_method(self, method: Any) -> None:
        """The model was found inside a bigger module's step method (training_step & co.,
        `method` its frame, or None when it is not this model's): that call is step 0."""
        self._attach.end_probes()
        if method is not None:
            self._calls.open_midway(method)

    def found_in_call(self, args: tuple, kwargs: dict) -> None:
        """The model was found in its own call's pre-hooks: that call is step 0 (torch took
        the list of the model's pre-hooks already, so the root hook missed its beginning)."""
        self._calls.on_root_pre(self._model(), args, kwargs)

    def continue_on(self, model: nn.Module) -> None:
        """`model` (or the torch.compile wrapper it came in) is this inspector's model loaded
        back from a checkpoint (`torch.load` makes a new object) after the original was
        dropped: record it from its next call on, with the same records and step numbers.
        Stopped inspectors of a dropped model only; not with memory=True (its ledger measures
        the model it was made for)."""
        if self.active or self.model is not None or self._memory is not None:
            raise RuntimeError(f"this inspector of {self._model_name} cannot continue on "
                               "another model (it is active, its model lives, or memory=True)")
        model, wrapper = check_arguments(model, self.every, None, "forward", self.inputs)
        self._model = weakref.ref(model)
        self._wrapper = weakref.ref(wrapper) if wrapper is not None else None
        self._model_id = id(model)
        self._calls.follow(model)
        self.start(hold_model=False)

    @property
    def current_step(self) -> int:
        """The number of the step running or last run (-1 before the first)."""
        return self._recorder.step

    @property
    def last_called(self) -> int:
        """When the model's latest step began (a clock of steps across inspectors; 0: never)."""
        return self._calls.began

    def __deepcopy__(self, memo: dict) -> Inspector:
        # A deepcopy of the inspected model (EMA, SWA) copies its hooks, and with them bound
        # methods of this inspector: they stay this inspector's, which ignores the copy.
        return self

    def __repr__(self) -> str:
        state = "active" if self.active else "stopped"
        return (f"<Inspector {self._model_name}: {state}, {len(self._calls.targets)} modules, "
                f"{self.steps_recorded} steps recorded, {self._store.row_count} rows>")

    def _first_grown(self) -> str | None:
        from .causes import first_grown

        return first_grown(self._tracks())

    def _prior_cause(self, step: int) -> str | None:
        from .causes import prior_cause

        return prior_cause(self._tracks(), step)

    def _wrapper_object(self) -> nn.Module | None:
        return self._wrapper() if self._wrapper is not None else None

    def _compiled_later(self, model: nn.Module, wrapper: nn.Module) -> None:
        """torch.compile(model) while inspected: the wrapper runs eagerly until stop()."""
        if self._attach.compiled_later(model, wrapper, self._calls.targets):
            self._wrapper = weakref.ref(wrapper)
            _latest[id(wrapper)] = self

    # === reading: what was recorded, and the views of it ================================
    # --- rows ------------------------------------------------------------------------------
    @property
    def steps_recorded(self) -> int:
        """Recorded steps so far, the one whose rows are still on the device included (its
        statistics reach the host with the next frame(), flush() or step)."""
        with self._lock:
            rows = self._recorder.pending.rows
            waiting = bool(rows) and rows[0][0] != self._store.last_step
            return self._store.steps_recorded + waiting

    def frame(self, ranks: str | None = None):
        """All recorded rows as a pandas DataFrame (columns: `COLUMNS`); safe to call from
        another thread while the model runs (a snapshot of the steps that reached the host).

        ranks: None for this process's rows; "all" for every rank's rows of a torch.distributed
            job, gathered on its process group (a collective: call it on every rank). Outside a
            multi-process job both give this process's rows.
        """
        from .runs import gather

        self._recorder.flush()
        return gather(to_frame(self._store.snapshot()), ranks)

    def records(self) -> list[StepRecord]:
        """The recorded steps on the host, oldest first, the pending one flushed there first:
        what the views read (a snapshot, safe while the model runs in another thread)."""
        self._recorder.flush()
        return self._store.snapshot()

    def save(self, path: str | os.PathLike):
        """Write this process's records to an SQLite file; returns the path written.

        In a job of several processes each rank writes its own file: `run.db` becomes
        `run.rank<N>.db` (or put `{rank}` in the path, or give a directory). Read them back,
        all ranks merged, with `singlecard_nb.load(path)`. The input channels' statistics and
        the optimiser's param groups are saved beside the rows, so `scn.findings()` of the
        loaded frame ranks as `insp.findings()` does.
        """
        from .runs import save

        records = self.records()  # rows and extras of the same steps
        return save(to_frame(records), path, meta={
            "model": self._model_name, "every": self.every, "grads": self.grads,
            "params": self.params, "include": self.include, "exclude": self.exclude,
            "steps_recorded": self.steps_recorded, "rows_dropped": self._store.dropped},
            extras=[r.extras for r in records if r.extras])

    def last_step(self):
        """Rows of the latest recorded step whose statistics reached the host."""
        records = self._store.snapshot()
        if not records:
            return to_frame([])
        step = records[-1].meta[0][0]
        return to_frame([r for r in records if r.meta[0][0] == step])

    def history(self, stat: str = "absmax", io: str = "output", training: bool | None = None):
        """A module x step table of one statistic (each module's first call, first tensor).

        training: True keeps rows of modules in train mode, False in eval mode, None both.
        """
        import pandas as pd

        if stat not in VALUES:
            raise ValueError(f"stat must be one of {', '.join(VALUES)}; got {stat!r}")
        self._recorder.flush()
        column = VALUES.index(stat)
        series: dict[int, dict[str, float]] = {}
        for record in self._store.snapshot():
            rows = record.first_rows(io, training)
            if not rows:
                continue
            step = series.setdefault(record.meta[0][0], {})
            for path, row in rows.items():
                step.setdefault(path, record.values[row, column])
        return pd.DataFrame(series)

    def histograms(self, steps: bool = False) -> dict[str, Any]:
        """Latest histograms (counts, edges as numpy arrays) of modules selected by `hist`;
        with `steps=True`, the recent steps' ones: a list of (step, counts, edges) per module."""
        self._recorder.flush()
        return self._store.histogram_steps() if steps else self._store.latest_histograms()

    def summary(self, top: int | None = None) -> Summary:
        """Per-module aggregate over steps, most changed first (the live view's order); renders
        as a table in notebooks. top: only the first `top` modules."""
        return Summary(self, top)

    def memory(self, optimizer=None):
        """memory=True: what each module holds (parameters, gradients, optimizer state, and of
        the last recorded step the activations saved for backward and the outputs), biggest
        first, with totals against the pinned card. `.frame()` gives the DataFrame.

        optimizer: whose state to count (default: the torch.optim optimisers seen stepping
            this model's parameters while inspected).
        """
        if self._memory is None:
            raise ValueError("insp.memory() needs an inspector started with memory=True: "
                             "scn.inspect(model, memory=True) or %inspect model --memory.")
        self._recorder.flush()
        return self._memory.table(self._model(), optimizer)

    def add_listener(self, fn: Callable[[Any], None]) -> None:
        """Call `fn(insp)` each time a recorded step's statistics reach the host, and when the
        inspector stops."""
        self._store.listeners.append(fn)

    def remove_listener(self, fn: Callable[[Any], None]) -> None:
        if fn in self._store.listeners:
            self._store.listeners.remove(fn)

    def live(self):
        """Display a view of the latest step that updates in place while training runs."""
        from .views import live_view

        return live_view(self)

    def plot(self, stat: str = "absmax", training: bool | None = None, relative: bool = False,
             top: int = 40, io: str = "output"):
        """A module x step heatmap of `stat` (matplotlib Figure); steps run in eval mode are
        marked. training: True or False keeps only rows in that mode. relative: each row ÷ its
        first step. top: rows shown, those the ranking puts first (see `views.heatmap`).
        io: "output", "input", "grad"; per parameter "param", "param_grad", "step_grad",
        "update" (params=True / grads=True)."""
        from .views import heatmap

        return heatmap.heatmap(self, stat, io, training=training, relative=relative, top=top)

    def findings(self, top: int | None = 10) -> list:
        """The ranked rows that show something, likeliest cause first (`causes/`): every
        recorded series (outputs, inputs, parameters, gradients, the optimiser's groups)."""
        from .views import findings

        self._recorder.flush()
        return findings(self._tracks(), top)

    def _tracks(self):
        """Every recorded series of the steps that reached the host (`causes.Tracks`)."""
        from .causes import Tracks

        tracks = Tracks()
        tracks.feed(self._store.snapshot())
        return tracks

    def hist(self, modules=None, bins: int | None = None):
        """Histograms of activation values of `modules` (globs), computed on the device.

        Histograms are taken for the modules given as `hist=` and, from the next recorded step
        on, for any `modules` asked for here; no activation is kept for them. On a GPU each
        histogram reads its range back once (torch.histc), so ask only for the modules you need.
        """
        from .views import histograms

        patterns = globs(modules) or []
        added = track_histograms(self._calls.targets, patterns)
        self.hist_patterns = (self.hist_patterns or []) + patterns
        try:
            return histograms.histograms(self, modules, bins or self.hist_bins)
        except ValueError:
            if not added:
                raise
            raise ValueError(
                f"no histogram recorded yet for {', '.join(added)}: they are taken from the next "
                "recorded step on. Run a step, then call insp.hist() again.") from None

    def _repr_html_(self) -> str:
        return self.summary()._repr_html_()


def inspector(model: nn.Module | None = None) -> Inspector:
    """The Inspector most recently started on `model`: by `inspect()`, `%inspect model`,
    `%%inspect model` or `inspect_all()` (also once stopped, while something keeps it).
    With no model: the inspector of the model called most recently (after a `%run` of N ranks,
    rank 0's model, read back: of several, the one with most steps). Raises ValueError if none."""
    if model is None:
        called = [insp for insp in _latest.values() if insp.last_called]
        if _elsewhere is not None and all(i.last_called < _elsewhere[0] for i in called):
            return _elsewhere[1]  # rank 0's model of the `%run` of N ranks read back last
        if not called:
            raise ValueError("no inspected model has been called yet: start an inspector with "
                             "singlecard_nb.inspect(model) or singlecard_nb.inspect_all(), then "
                             "run the model.")
        return max(called, key=lambda insp: insp.last_called)
    found = _latest.get(id(model))
    if found is None or (model is not found.model and model is not found._wrapper_object()):
        raise ValueError(f"no inspector has been started on this {type(model).__name__}: start "
                         "one with insp = singlecard_nb.inspect(model) or %inspect model.")
    return found


_elsewhere: tuple[int, Any] | None = None  # (step clock, a model recorded in another process)


def recorded_elsewhere(recorded: Any) -> None:
    """A model recorded in another process, read back now (rank 0's of a `%run` of N ranks):
    `inspector()` with no model answers with it until a model here is called."""
    global _elsewhere
    _elsewhere = (step_clock(), recorded)


def recording_inspector(model: nn.Module) -> Inspector | None:
    """The active inspector recording `model` itself, if any (one model has one)."""
    found = _active.get(id(model))
    return found if found is not None and found.model is model else None
