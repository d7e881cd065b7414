"""The pending step: the rows recorded since the step began, whose statistics may still be on
the device, and what they become on the host (one transfer per device, at `to_host`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..kernel import VALUES, StepStats
from .extras import channels_to_host

_FLOAT32 = torch.float32  # a module global: read once per loss


class Pending:
    """Rows of the current step whose statistics may still be on the device."""

    def __init__(self, exact_std: bool, max_rows: int, raw_rows: tuple | None = None):
        self.max_rows = max_rows  # flushed when reached (the store's bound, read per step)
        self.rows: list[tuple] = []  # (step, path, type, call, io, index, shape, dtype, device)
        self.slots: list[int | None] = []  # each row's statistics slot (None: not reducible)
        # raw_rows: an earlier step's chunk of RAW rows to write again (StepStats.spare_rows)
        self.stats = StepStats(exact_std, rows=raw_rows)
        self.hists: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.memory: list[tuple[float, float, float]] = []  # memory=True: per row (memory.py)
        # model input index -> (shape, (mean, std, absmax), each [C] on the device)
        self.channels: dict[str, tuple] = {}
        self.optimizer: dict[int, list[dict]] = {}  # id(optimizer) -> its param groups
        self.losses: list[torch.Tensor] = []  # what loss.backward() was called on (0-d, device)
        self.loss_ops: list[str] = []  # the first loss's last autograd operations
        self.loss_shared = 1  # how many inspected models took the first loss

    def to_host(self, failed: Callable[[BaseException, str], None], *,
                memory: bool) -> tuple | None:
        """(rows, values, hists, memory, extras) as the store receives them, or None when no
        row was recorded; values is `StepStats.raw_rows`' (raw, numel, exact), which the store
        finishes when read. A failure is handed to `failed` (a reduction interrupted half-way:
        the rows are kept, with NaN statistics).

        memory: whether memory=True's columns were recorded (else None in their place)."""
        if not self.rows:
            return None
        # Ctrl-C can land between the two appends of record_tensor
        n = min(len(self.rows), len(self.slots))
        rows, slots = self.rows, self.slots  # this step's for good: no copy unless cut
        if len(rows) != n or len(slots) != n:
            rows, slots = rows[:n], slots[:n]
        try:
            values = self.stats.raw_rows(slots)
        except Exception as e:  # e.g. a reduction interrupted half-way: keep the rows
            failed(e, f"statistics of step {rows[0][0]}")
            values = np.full((n, len(VALUES)), np.nan)
        columns = np.array(self.memory[:n], dtype=float) if memory else None
        return rows, values, self.hists, columns, self._extras(failed, rows[0][0])

    def _extras(self, failed: Callable[[BaseException, str], None], step: int) -> dict | None:
        """What the step holds beside its rows, by name (channels cross to the host here)."""
        if not self.channels and not self.optimizer and not self.losses:
            return None
        extras: dict = {"step": step}
        try:
            if self.channels:
                extras["channels"] = channels_to_host(self.channels)
        except Exception as e:
            failed(e, f"input channels of step {step}")
        if self.optimizer:
            extras["optimizer"] = tuple(g for groups in self.optimizer.values() for g in groups)
        try:
            if self.losses:  # one transfer for the step's losses
                values = _to_host(self.losses)
                extras["loss"] = {"values": tuple(values), "ops": tuple(self.loss_ops),
                                  "shared": self.loss_shared}  # tuples: see channels_to_host
        except Exception as e:
            failed(e, f"the loss of step {step}")
        return extras


def _to_host(values: list[torch.Tensor]) -> list[float]:
    """0-d tensors as the floats of their float32 values: one transfer for all, or on the CPU
    each read where it lies (the same floats, without a stack and a copy)."""
    if all(v.is_cpu for v in values):  # float() of a float32 loss is itself, one op later
        return [(v if v.dtype is _FLOAT32 else v.float()).item() for v in values]
    return torch.stack([v.float() for v in values]).cpu().tolist()

