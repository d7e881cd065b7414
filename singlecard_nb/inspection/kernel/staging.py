"""Copies of same-shaped small tensors, kept for one step and reduced together (`stats.py`)."""

from __future__ import annotations

import torch

from ... import borrow


class Staging:
    """Copies of same-shaped small tensors, written row by row into preallocated chunks.

    Rows of a chunk rather than one clone each: a step then holds a few tensor objects instead
    of thousands, which keeps Python's garbage collector from walking the user's model.
    """

    __slots__ = ("shape", "dtype", "device", "slots", "chunks", "filled", "capacity")

    def __init__(self, shape: tuple, dtype: torch.dtype, device: torch.device):
        self.shape, self.dtype, self.device = shape, dtype, device
        self.slots: list[int] = []
        self.chunks: list[torch.Tensor] = []
        self.filled = 0  # rows used in the last chunk
        self.capacity = 0  # rows in the last chunk (an int: len(tensor) is slow Python)

    def _new_chunk(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, *self.shape), dtype=self.dtype, device=self.device)

    def add(self, x: torch.Tensor, slot: int) -> int:
        """Copy `x` into the next row (converting its dtype); returns the bytes reserved."""
        reserved = 0
        if self.filled == self.capacity:
            rows = min(16 << len(self.chunks), 1024)  # grows geometrically, bounded waste
            if torch.is_inference_mode_enabled():
                # A normal tensor even under inference_mode: a step can mix inference_mode
                # calls with normal ones, and an inference tensor cannot be written outside
                # it. Ctrl-C held back (~20 µs, so only here): one landing in its __exit__
                # would leave the user's thread in another mode.
                with borrow.uninterrupted(), torch.inference_mode(False):
                    chunk = self._new_chunk(rows)
            else:
                chunk = self._new_chunk(rows)
            self.chunks.append(chunk)
            self.filled, self.capacity = 0, rows
            reserved = self.chunks[-1].nbytes
        self.chunks[-1][self.filled].copy_(x)
        self.filled += 1
        self.slots.append(slot)
        return reserved

    def matrix(self) -> torch.Tensor:
        """All copies as one [k, n] matrix."""
        last = self.chunks[-1][: self.filled]
        stacked = torch.cat([*self.chunks[:-1], last]) if len(self.chunks) > 1 else last
        return stacked.reshape(len(self.slots), -1)
