"""Recorded steps on the host: a ring buffer of step records bounded by `max_rows`, the latest
histograms, the listeners told when a step arrives, and the DataFrame they make."""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...job import rank
from ..diagnostics import Diagnostics
from ..kernel import VALUES

# `training` is the module's .training flag at the call (train vs eval); it comes last so that
# the columns of version 0.1 keep their places.
COLUMNS = (
    "step", "module", "type", "call", "io", "index", "shape", "dtype", "device",
    "mean", "std", "min", "max", "absmax", "nan", "inf", "zeros", "rank", "training",
)
META = (*COLUMNS[:9], "training")  # the row tuple of one tensor, without statistics and rank
DEFAULT_MAX_ROWS = 100_000
MEMORY_COLUMNS = ("mem_out", "mem_saved", "mem_peak")  # memory=True (see memory.py)
HIST_STEPS = 50  # histograms kept per module for insp.hist() over steps (bounded memory)


@dataclasses.dataclass
class StepRecord:
    """One step's rows on the host: metadata tuples and a [rows, 8] array of VALUES."""

    meta: list[tuple]
    values: np.ndarray
    rank: int
    memory: np.ndarray | None = None  # memory=True: [rows, 3] of MEMORY_COLUMNS
    # beside the rows, by name: {"step", "channels": {index: {"shape", "values"}},
    # "optimizer": [{"optimizer", "group", "lr", "weight_decay", "params"}]} (extras.py)
    extras: dict | None = None
    _first_rows: dict[tuple, dict[str, int]] = dataclasses.field(default_factory=dict)

    def first_rows(self, io: str, training: bool | None = None) -> dict[str, int]:
        """Module path -> row of its first `io` tensor in its earliest call (cached); with
        `training` given, only among rows with that .training flag."""
        key = (io, training)
        first = self._first_rows.get(key)
        if first is None:
            first = self._first_rows[key] = {}
            earliest: dict[str, int] = {}
            for i, (_, path, _, call, row_io, *_rest, flag) in enumerate(self.meta):
                if row_io != io or (training is not None and flag != training):
                    continue
                if path not in first or call < earliest[path]:
                    first[path], earliest[path] = i, call
        return first


class Store:
    """The steps that reached the host. Changed and read under `lock`, the inspector's one lock
    (the recorder hands steps over while another thread may read frames)."""

    def __init__(self, lock: threading.RLock, max_rows: int, diagnostics: Diagnostics,
                 subject: Any):
        self.max_rows = max_rows
        self.steps_recorded = 0
        self.dropped = 0  # rows the ring buffer let go
        self.row_count = 0
        self.histograms: dict[str, tuple[Any, Any]] = {}
        self._hist_steps: dict[str, deque] = {}  # path -> (step, counts, edges), the recent ones
        self.listeners: list[Callable[[Any], None]] = []
        self._records: deque[StepRecord] = deque()
        self._lock = lock
        self._diagnostics = diagnostics
        self._subject = subject  # what listeners are called with: the Inspector
        self.last_step = -1

    def receive(self, rows: list[tuple], values: np.ndarray,
                hists: dict[str, tuple[torch.Tensor, torch.Tensor]],
                memory: np.ndarray | None = None, extras: dict | None = None) -> None:
        """Keep one (part of a) step: its rows, their VALUES, histograms, memory columns and
        what the ranking reads beside them (extras)."""
        with self._lock:
            record = StepRecord(rows, values, rank(), memory, extras)
            for path, (counts, lo_hi) in hists.items():
                try:
                    lo, hi = lo_hi.tolist()
                    kept = (counts.cpu().numpy(), np.linspace(lo, hi, len(counts) + 1))
                    self.histograms[path] = kept
                    self._hist_steps.setdefault(path, deque(maxlen=HIST_STEPS)).append(
                        (record.meta[0][0], *kept))
                except Exception as e:
                    self._diagnostics.failed(e, path)
            if record.meta[0][0] != self.last_step:  # a step can reach the host in parts
                self.steps_recorded += 1
            self.last_step = record.meta[-1][0]
            self._keep(record)

    def tell_listeners(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self._subject)
            except Exception as e:
                self._diagnostics.errors.append(f"listener {listener!r} failed: {e!r}")

    def snapshot(self) -> list[StepRecord]:
        with self._lock:
            return list(self._records)

    def latest_histograms(self) -> dict[str, tuple[Any, Any]]:
        with self._lock:
            return dict(self.histograms)

    def histogram_steps(self) -> dict[str, list[tuple[int, Any, Any]]]:
        with self._lock:
            return {path: list(kept) for path, kept in self._hist_steps.items()}

    def _keep(self, record: StepRecord) -> None:
        """Append a record, dropping the oldest rows beyond max_rows (a ring buffer)."""
        self._records.append(record)
        self.row_count += len(record.meta)
        excess = self.row_count - self.max_rows
        if excess <= 0:
            return
        if self.dropped == 0:
            warnings.warn(
                f"singlecard_nb: max_rows={self.max_rows} reached; the oldest rows are now "
                "dropped (ring buffer). Pass inspect(..., max_rows=N) or every=N to keep more "
                "steps.", RuntimeWarning, stacklevel=5)
        self.dropped += excess
        self.row_count -= excess
        while excess > 0:
            oldest = self._records[0]
            if len(oldest.meta) <= excess:
                self._records.popleft()
                excess -= len(oldest.meta)
            else:
                memory = oldest.memory[excess:] if oldest.memory is not None else None
                self._records[0] = StepRecord(oldest.meta[excess:], oldest.values[excess:],
                                              oldest.rank, memory, oldest.extras)
                excess = 0


def to_frame(records: Sequence[StepRecord]):
    """The DataFrame of `records`, columns `COLUMNS`."""
    import pandas as pd

    meta = pd.DataFrame([row for record in records for row in record.meta], columns=list(META))
    if records:
        values = np.concatenate([record.values for record in records])
    else:
        values = np.empty((0, len(VALUES)))
    columns: dict[str, Any] = {}
    for i, name in enumerate(VALUES):
        column = values[:, i]
        # counts are integers, missing (<NA>) where no statistics were taken
        columns[name] = pd.array(column, dtype="Int64") if name in ("nan", "inf") else column
    columns["rank"] = np.repeat([r.rank for r in records], [len(r.meta) for r in records])
    columns["training"] = meta["training"].astype(bool)
    if any(r.memory is not None for r in records):  # memory=True: bytes, NaN where not taken
        memory = np.concatenate([r.memory if r.memory is not None
                                 else np.full((len(r.meta), 3), np.nan) for r in records])
        for i, name in enumerate(MEMORY_COLUMNS):
            if name != "mem_peak" or not np.isnan(memory[:, i]).all():  # mem_peak: GPU only
                columns[name] = memory[:, i]
    return pd.concat([meta.iloc[:, :9], pd.DataFrame(columns, index=meta.index)], axis=1)
