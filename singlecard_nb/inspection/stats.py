"""On-device statistics of tensors, collected for one step and moved to the host together.

Every tensor gets the same eight values, `VALUES`. How they are taken follows what each
reduction costs (measured on a 2-core CPU, see benchmarks/): `sum`, `aminmax` and
`linalg.vector_norm` are one cheap pass each, while `std_mean`, `count_nonzero` and
`isnan().sum()` are many times slower. So, for a large tensor:

    min, max   aminmax, or amin and amax for large CPU tensors (faster there); both propagate
               NaN/Inf, so they also say whether NaN/Inf counts are needed
    mean       sum / n, accumulated in float32 on a CPU and in float64 on a GPU
    std        from the sum of squares in one pass (unbiased, like torch.std). On a CPU, with
               float32 sums, its relative error grows like 1e-7 * (mean/std)**2: labelled as a
               one-pass value; `exact_std=True` switches to torch.var_mean (two-pass, slower).
    zeros      fraction of exact zeros: none when 0 lies outside [min, max], else counted as
               dot(sign(x), sign(x)), several times faster than a bool sum on the CPU
    nan, inf   counted only when min or max is non-finite on a CPU (reading a CPU value costs
               nothing); on a GPU, where reading would synchronise, always counted on device.

Small tensors cost mostly per-operation overhead, so they are copied (an activation is never
referenced after its hook) and reduced together, grouped by shape, when the step is collected;
those use the exact two-pass variance. All results on a device reach the host in one transfer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

VALUES = ("mean", "std", "min", "max", "absmax", "nan", "inf", "zeros")
EMPTY = (math.nan,) * len(VALUES)  # what an empty or unreducible tensor gets
SMALL_NUMEL = 16384  # at or below this, per-op overhead dominates: copy, defer and batch
DEFER_BYTES_LIMIT = 64 << 20  # deferred copies are reduced early beyond this (bounded memory)
_AMINMAX_NUMEL = 200_000  # below this one aminmax beats amin + amax (fewer dispatches)
_EXACT_FLOAT_COUNT = 1 << 24  # float32 sums of ones stay exact below this many elements

_REDUCIBLE = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
})


def reducible(t: torch.Tensor) -> bool:
    """Whether statistics can be taken; sparse, quantized, nested and meta tensors cannot."""
    return (t.dtype in _REDUCIBLE and t.layout is torch.strided and not t.is_nested
            and not t.is_meta)


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The float type reductions run in: float64 keeps float64 and 32/64-bit integers (token
    ids and counts stay exact); half, bfloat16, small ints and bool accumulate in float32."""
    return torch.float64 if dtype in (torch.float64, torch.int32, torch.int64) else torch.float32


def _as_real(x: torch.Tensor) -> torch.Tensor | None:
    """A float tensor to reduce, or None when `x` already is one."""
    if x.is_complex():
        return x.abs()  # magnitudes
    dtype = _real_dtype(x.dtype)
    return None if x.dtype == dtype else x.to(dtype)


def _values_on_device(n, total, second, lo, hi, nan, inf, nonzero, exact: bool) -> torch.Tensor:
    """Stack the eight VALUES from raw reductions (scalars or [k] vectors), on the device.

    `second` is the sum of squares, or the variance itself when `exact`.
    """
    mean = total / n
    if exact:
        var = second
    else:
        var = (second - total * mean).clamp_min(0) / (n - 1) if n > 1 else second * math.nan
    std = var.sqrt()
    absmax = torch.maximum(lo.abs(), hi.abs())
    zeros = (n - nonzero) / n
    dtype = mean.dtype
    return torch.stack([mean, std, lo.to(dtype), hi.to(dtype), absmax.to(dtype),
                        nan.to(dtype), inf.to(dtype), zeros.to(dtype)], dim=-1)


class _Staging:
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

    def add(self, x: torch.Tensor, slot: int) -> int:
        """Copy `x` into the next row (converting its dtype); returns the bytes reserved."""
        reserved = 0
        if self.filled == self.capacity:
            rows = min(16 << len(self.chunks), 1024)  # grows geometrically, bounded waste
            self.chunks.append(torch.empty((rows, *self.shape), dtype=self.dtype,
                                           device=self.device))
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


class StepStats:
    """Statistics of the tensors seen in one step: `add` gives a slot, `table` the VALUES.

    exact_std: take the two-pass variance for large tensors too.
    """

    def __init__(self, exact_std: bool = False):
        self.exact_std = exact_std
        self._count = 0
        self._known: dict[int, Sequence[float]] = {}  # slot -> VALUES already on the host
        self._tables: list[tuple[list[int], np.ndarray]] = []  # many slots' VALUES at once
        self._small: dict[tuple, _Staging] = {}  # (device, dtype, shape) -> deferred copies
        self._small_bytes = 0
        # results on an accelerator: device -> (slots, [VALUES] vectors or [k, VALUES] tables)
        self._on_device: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}

    def add(self, t: torch.Tensor, shape: tuple, *, immediate: bool = False) -> int:
        """Take statistics of `t`; `immediate` forbids deferring (the NaN trap reads at once)."""
        slot = self._count
        self._count += 1
        n = t.numel()
        if n == 0:
            return slot  # an empty tensor has a shape but no statistics (NaN row)
        x = t.detach()
        dtype = x.dtype
        if n <= SMALL_NUMEL and not immediate:
            if dtype.is_complex:
                x = x.abs()  # magnitudes
                dtype = x.dtype
            staged_dtype = _real_dtype(dtype)  # the staging copy converts
            key = (x.device, staged_dtype, shape)
            staging = self._small.get(key)
            if staging is None:
                staging = self._small[key] = _Staging(shape, staged_dtype, x.device)
            self._small_bytes += staging.add(x, slot)  # a copy, never the activation itself
            if self._small_bytes > DEFER_BYTES_LIMIT:
                self._reduce_small()
            return slot
        real = _as_real(x)
        v = x if real is None else real
        if v.device.type == "cpu":
            self._known[slot] = self._reduce_cpu(v, n)
        elif immediate:  # the trap reads at once: this synchronises, as documented
            self._known[slot] = self._reduce_on_device(v, n).tolist()
        else:
            slots, vectors = self._on_device.setdefault(v.device, ([], []))
            slots.append(slot)
            vectors.append(self._reduce_on_device(v, n))
        return slot

    def value(self, slot: int) -> Sequence[float]:
        """The VALUES of one slot taken with `immediate=True` (or an empty tensor's NaNs)."""
        return self._known.get(slot, EMPTY)

    def table(self, row_slots: Sequence[int | None]) -> np.ndarray:
        """VALUES for each row ([rows, 8] float64, NaN where none), after one collection."""
        self.collect()
        values = np.full((self._count + 1, len(VALUES)), np.nan)  # last row: "no statistics"
        for slot, known in self._known.items():
            values[slot] = known
        for slots, table in self._tables:
            values[slots] = table
        index = np.fromiter((self._count if s is None else s for s in row_slots), np.intp,
                            count=len(row_slots))
        return values[index]

    def collect(self) -> None:
        """Reduce deferred tensors and move results to the host: one transfer per device."""
        self._reduce_small()
        for slots, tables in self._on_device.values():
            rows = torch.cat([table.view(-1, len(VALUES)).to(torch.float64) for table in tables])
            self._tables.append((slots, rows.to("cpu").numpy()))
        self._on_device = {}

    # --- reductions -----------------------------------------------------------------------
    def _reduce_cpu(self, v: torch.Tensor, n: int) -> tuple:
        if n <= _AMINMAX_NUMEL:
            lo_t, hi_t = torch.aminmax(v)
        else:  # amin + amax: ~1.4x faster than aminmax on large CPU tensors
            lo_t, hi_t = v.amin(), v.amax()
        lo, hi = lo_t.item(), hi_t.item()
        if math.isfinite(lo) and math.isfinite(hi):
            nan = inf = 0
            if lo > 0 or hi < 0:
                nonzero = n  # zero lies outside [min, max]: no pass needed
            elif n < _EXACT_FLOAT_COUNT and v.is_contiguous():
                signs = v.view(-1).sign()
                nonzero = torch.dot(signs, signs).item()  # counts non-zeros, BLAS-fast
            else:
                nonzero = torch.count_nonzero(v).item()
        else:
            nan = int(torch.isnan(v).sum())
            inf = int(torch.isinf(v).sum())
            nonzero = n - int((v == 0).sum())
        if self.exact_std:
            var_t, mean_t = torch.var_mean(v)
            mean, var = mean_t.item(), var_t.item()
        else:
            total = v.sum().item()
            mean = total / n
            if v.is_contiguous():  # a BLAS dot is ~1.7x faster than vector_norm here
                flat = v.view(-1)
                sq = torch.dot(flat, flat).item()
            else:
                sq = torch.linalg.vector_norm(v).item() ** 2
            var = max(sq - total * mean, 0.0) / (n - 1) if n > 1 else math.nan
            if not (math.isfinite(total) and math.isfinite(sq)):
                var = math.nan
        absmax = max(abs(lo), abs(hi)) if not (math.isnan(lo) or math.isnan(hi)) else math.nan
        return (mean, math.sqrt(var) if var == var else var, lo, hi, absmax, nan, inf,
                (n - nonzero) / n)

    def _reduce_on_device(self, v: torch.Tensor, n: int) -> torch.Tensor:
        # On an accelerator every count is taken on the device in float64: no synchronisation.
        f64 = torch.float64
        lo, hi = torch.aminmax(v)
        total = v.sum(dtype=f64)
        if self.exact_std:
            second = torch.var(v.to(f64)) if n > 1 else total * math.nan
        else:
            second = torch.linalg.vector_norm(v, dtype=f64).square()
        return _values_on_device(n, total, second, lo, hi, torch.isnan(v).sum(dtype=f64),
                                 torch.isinf(v).sum(dtype=f64), (v != 0).sum(dtype=f64),
                                 self.exact_std)

    def _reduce_small(self) -> None:
        # Per-row reductions over a [k, n] stack. Measured on the CPU: amin + amax are ~40x
        # faster than aminmax(dim=1), and a centred sum of squares ~20x faster than var_mean.
        for (device, _dtype, _shape), staging in self._small.items():
            slots, m = staging.slots, staging.matrix()
            n = m.shape[1]
            lo, hi = m.amin(dim=1), m.amax(dim=1)
            total = m.sum(dim=1)
            centred = m - (total / n).unsqueeze(1)
            var = (centred * centred).sum(dim=1) / (n - 1) if n > 1 else total * math.nan
            finite = device.type == "cpu" and bool(torch.isfinite(lo).all() & torch.isfinite(hi).all())
            if finite:  # NaN/Inf counts needed only when something is not finite
                nan = inf = torch.zeros_like(lo)
                nonzero = m.sign().abs_().sum(dim=1)
            else:
                nan, inf = torch.isnan(m).sum(dim=1), torch.isinf(m).sum(dim=1)
                nonzero = (m != 0).sum(dim=1)
            table = _values_on_device(n, total, var, lo, hi, nan, inf, nonzero, exact=True)
            if device.type == "cpu":
                self._tables.append((slots, table.to(torch.float64).numpy()))
            else:  # stays on the device until `collect` moves everything at once
                pending_slots, tables = self._on_device.setdefault(device, ([], []))
                pending_slots.extend(slots)
                tables.append(table)
        self._small = {}
        self._small_bytes = 0
