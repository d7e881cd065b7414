"""Recorded steps on the host: a ring buffer of step records bounded by `max_rows`, the latest
histograms, the listeners told when a step arrives, and the DataFrame they make."""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...job import rank
from ..diagnostics import Diagnostics
from ..kernel import VALUES, finish_rows

# `training` is the module's .training flag at the call (train vs eval); it comes last so that
# the columns of version 0.1 keep their places.
COLUMNS = (
    "step", "module", "type", "call", "io", "index", "shape", "dtype", "device",
    "mean", "std", "min", "max", "absmax", "nan", "inf", "zeros", "rank", "training",
)
META = (*COLUMNS[:9], "training")  # the row tuple of one tensor, without statistics and rank
DEFAULT_MAX_ROWS = 100_000
MEMORY_COLUMNS = ("mem_out", "mem_saved", "mem_peak")  # memory=True (see memory.py)
# Steps wait to be finished together up to this many rows (the RAW rows, as many bytes as
# their VALUES); then a new batch begins, so a first read never finishes more at once.
_FINISH_ROWS = 1 << 16
_FIRST_ROWS = 1 << 10  # a batch's first arrays: then doubled as steps come
HIST_STEPS = 50  # histograms kept per module for insp.hist() over steps (bounded memory)


class StepRecord:
    """One step's rows on the host: metadata tuples and a [rows, 8] array of VALUES.

    A recorded step arrives with its RAW rows (`StepStats.raw_rows`), which become VALUES when
    first read: every step received since then at once (`_Unfinished`), so a run that nobody
    reads while it trains pays one `finish` per read, not one per step."""

    __slots__ = ("meta", "_values", "_unfinished", "_span", "rank", "memory", "extras",
                 "_first_rows", "__weakref__")

    def __init__(self, meta: list[tuple], values: np.ndarray | None, rank: int,
                 memory: np.ndarray | None = None, extras: dict | None = None):
        self.meta = meta
        self._values = values
        # while `values` waits to be finished: its batch and its rows there (start, end)
        self._unfinished: _Unfinished | None = None
        self._span = (0, 0)
        self.rank = rank
        self.memory = memory  # memory=True: [rows, 3] of MEMORY_COLUMNS
        # beside the rows, by name: {"step", "channels": {index: {"shape", "values"}},
        # "optimizer": [{"optimizer", "group", "lr", "weight_decay", "params"}]} (extras.py)
        self.extras = extras
        self._first_rows: dict[tuple, dict[str, int]] = {}

    @property
    def values(self) -> np.ndarray:
        values = self._values
        if values is None:
            batch = self._unfinished
            if batch is None:  # another thread has just finished it
                return self._values
            start, end = self._span
            values = self._values = batch.finish()[start:end]  # the same slice in any thread
            self._unfinished = None
        return values

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


class _Unfinished:
    """RAW rows of steps received, not yet VALUES: `finish` turns all of them at once (one
    `finish` of their rows together: row by row, so the same values to the bit). Records point
    here, never the other way: a record the ring buffer lets go is freed at once, and the batch
    with the last of its records.

    A step's rows are copied into arrays that grow by doubling, not kept as arrays of their
    own: a small allocation kept per step can split the place a large tensor just freed in
    the C heap, which then grows by a tensor a step (heap.py)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # a reader may finish while the recorder adds a step
        self._raw: np.ndarray | None = None  # [capacity, RAW] once a step came
        self._numel: np.ndarray | None = None
        self._exact: list[tuple[int, tuple]] = []  # (row in the batch, VALUES)
        self.rows = 0
        self._values: np.ndarray | None = None

    def add(self, raw: np.ndarray, numel: np.ndarray, exact: tuple) -> tuple[int, int] | None:
        """The rows (start, end) of a step's RAW rows taken to finish later; None once this
        batch is finished (a new batch takes them)."""
        with self.lock:
            if self._values is not None:
                return None
            start = self.rows
            end = start + len(raw)
            if self._raw is None or end > len(self._raw):
                capacity = max(end, _FIRST_ROWS, 2 * (0 if self._raw is None else len(self._raw)))
                grown = np.empty((capacity, raw.shape[1]))
                grown_numel = np.empty(capacity)
                if start:
                    grown[:start], grown_numel[:start] = self._raw[:start], self._numel[:start]
                self._raw, self._numel = grown, grown_numel
            self._raw[start:end] = raw
            self._numel[start:end] = numel
            self._exact += [(start + row, taken) for row, taken in exact]
            self.rows = end
            return start, end

    def finish(self) -> np.ndarray:
        """VALUES of every row taken, computed once (a second reader waits, then has them)."""
        with self.lock:
            if self._values is None:
                rows = self.rows  # a record is added before it reads: never 0 here
                self._values = finish_rows(self._raw[:rows], self._numel[:rows], self._exact)
                self._raw, self._numel, self._exact = None, None, []  # let the RAW rows go
            return self._values


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
        self._unfinished = _Unfinished()  # steps whose VALUES are not yet taken (StepRecord)

    def receive(self, rows: list[tuple], values: np.ndarray | tuple,
                hists: dict[str, tuple[torch.Tensor, torch.Tensor]],
                memory: np.ndarray | None = None, extras: dict | None = None) -> None:
        """Keep one (part of a) step: its rows, their VALUES (or the (raw, numel, exact) of
        `StepStats.raw_rows`, finished when read), histograms, memory columns and what the
        ranking reads beside them (extras)."""
        with self._lock:
            if isinstance(values, tuple):
                record = StepRecord(rows, None, rank(), memory, extras)
                span = (self._unfinished.add(*values) if self._unfinished.rows < _FINISH_ROWS
                        else None)
                if span is None:  # that batch was finished (read), or is full: a new one
                    self._unfinished = _Unfinished()
                    span = self._unfinished.add(*values)
                record._unfinished, record._span = self._unfinished, span
            else:
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
