"""What an Inspector recorded, read and shown: frames, histories, histograms, records saved,
listeners, and the views (summary, live view, figures, the memory table).

`InspectorResults` is the half of `Inspector` (engine.py) that reads: it reads the parts the
engine builds (`_recorder`, `_store`, `_lock`, `_calls`, `_memory`), never changes them but to
flush the pending step to the host. Views get what they show through these public methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .kernel.values import VALUES
from .recording.store import StepRecord, to_frame
from .targets import globs, track_histograms
from .views import Summary


class InspectorResults:
    """The reading half of `Inspector`: queries of the recorded rows and the views of them."""

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

