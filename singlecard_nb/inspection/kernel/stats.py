"""On-device statistics of tensors, collected for one step and moved to the host together.

Every tensor gets the same eight values, `VALUES`. Reductions first produce *raw* values (`RAW`:
min, max, a shift, the sum and the sum of squares of the values minus the shift, NaN, Inf and
non-zero counts); `finish` turns many rows of those into VALUES at once, on the host.

How a tensor is read (costs measured on a 2-core CPU, see benchmarks/README.md):

    CPU tensors         one call of the C kernel in `onepass.c` (built in the background by
                        `native.py`), which writes the RAW row itself: min, max, mean, the
                        centred sum of squares and the zero count in a single read, ~3x
                        the cost of one float32 `x.sum()` on large tensors in cache (its sums
                        are in double) and under a microsecond on small ones. It reads a second time, in float64, only where the first
                        read cannot be trusted: NaN/Inf (counted), a variance that cancels,
                        squares out of float64's range (values beyond ~1e150 or below
                        ~1e-150), or `exact_std`. A strided view is copied first. Until the kernel is
                        ready, or where it cannot be built, torch reductions do the same
                        (`reductions.py`: a few reads per tensor, sums in float64).
    small tensors       on a GPU, and on a CPU before the kernel is ready: tensors of at most
                        SMALL_NUMEL values are copied (an activation is never referenced after
                        its hook), grouped by shape and reduced together when the step is
                        collected, with the two-pass variance.
    GPU tensors         torch reductions on the device (8 operations, `DeviceRows`), sums in
                        float64, every count taken on the device; a step's rows are made on the
                        device at its end, together, and reach the host in one transfer.

Which tensors can be read, and how (a subclass's data, one dense block), is `readable.py`; the
RAW rows become VALUES in `values.py`.

Exactness (the same on every path): min, max, absmax and the NaN/Inf/zero counts are exact.
mean and std are summed in float64 on every path, whatever the dtype (float32 only on MPS, which
has none), so the kernel and torch's reductions give a tensor the same statistics to ~1e-12 of
its spread: ranks of a job that read equal tensors on different paths compare equal
(compare_ranks' rtol is 1e-6). std never comes from a difference that cancels by more than
CANCELLATION_LIMIT. A constant tensor gets std exactly 0 and its value as mean.
`exact_std=True` always takes the second pass. float64 values beyond about 1e150 (or all below
1e-150), whose squares leave float64's range, get their mean and std taken exactly on the CPU,
scaled by a power of two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from . import native
from .readable import as_real, is_zerotensor, one_block, real_dtype
from .reductions import (
    EMPTY,
    FLOAT64_SQUARES_FIT,
    RAW,
    DeviceRows,
    finish,
    reduce_cpu,
    reduce_rows,
    wide,
)
from .staging import Staging

SMALL_NUMEL = 16384  # at or below this, per-op overhead dominates: copy, defer and batch
DEFER_BYTES_LIMIT = 64 << 20  # deferred copies are reduced early beyond this (bounded memory)
_CHUNK_BITS = 10  # the kernel's RAW rows come in chunks of 1024
_CHUNK_MASK = (1 << _CHUNK_BITS) - 1
_ROW_BYTES = 8 * 8  # len(RAW) float64
# CPU tensors read as an accelerator's are (torch reductions left where they are, small tensors
# staged, the step's rows made at its end, one transfer): set by tests, with the kernels off,
# so that the path a GPU takes runs where there is none (tests/test_accelerator_path.py)
CPU_AS_ACCELERATOR = False


def finish_rows(raw: np.ndarray, numel: np.ndarray, exact: Sequence) -> np.ndarray:
    """`finish`, with the rows taken exactly ([(row, VALUES)], `StepStats.raw_rows`) put in."""
    values = finish(raw, numel)
    for row, taken in exact:
        values[row] = taken
    return values


class StepStats:
    """Statistics of the tensors seen in one step: `add` gives a slot, `table` the VALUES.

    exact_std: always take the centred second pass for the variance (slower).
    kernels: the one-pass kernels by dtype to use (default: `native.kernels()`, empty until
        they are built); `{}` takes every statistic with torch.
    rows: a chunk of RAW rows to write first, all NaN (an earlier step's `spare_rows()`).
    """

    def __init__(self, exact_std: bool = False,
                 kernels: dict[torch.dtype, native.Kernel] | None = None, *,
                 rows: tuple[np.ndarray, int] | None = None):
        self.exact_std = exact_std
        self._count = 0
        self._raw: dict[int, tuple] = {}  # slot -> RAW already on the host
        self._numel: dict[int, int] = {}  # slot -> number of elements, for `finish`
        self._tables: list[tuple[list[int], np.ndarray]] = []  # many slots' RAW at once
        self._small: dict[tuple, Staging] = {}  # (device, dtype, shape) -> deferred copies
        self._small_bytes = 0
        # RAW rows on an accelerator until `collect`, by device
        self._on_device: dict[torch.device, DeviceRows] = {}
        self._zero: dict[torch.device, torch.Tensor] = {}  # DeviceRows' zero, by device
        self._kernels = native.kernels() if kernels is None else kernels  # {} until built
        self.kernels = self._kernels  # read by the recorder's path for plain CPU tensors
        # and the difference kernels, for a parameter's update (injected kernels have none)
        self.differences = native.differences() if kernels is None else {}
        self._build = kernels is None  # the first CPU tensor starts building the kernels
        # RAW rows the kernel writes, by slot: (rows, address) chunks that never move, so the
        # address a kernel writes to stays valid even while another thread adds a chunk
        self._chunks: list[tuple[np.ndarray, int]] = [] if rows is None else [rows]
        self._exact: dict[int, tuple] = {}  # slot -> VALUES of float64 beyond 1e+-150

    def add(self, t: torch.Tensor, shape: tuple, *, immediate: bool = False) -> int:
        """Take statistics of `t`; `immediate` forbids deferring (the NaN trap reads at once)."""
        slot = self._count
        self._count += 1
        n = t.numel()
        if n == 0:
            return slot  # an empty tensor has a shape but no statistics (NaN row)
        self._numel[slot] = n
        on_cpu = t.is_cpu and not CPU_AS_ACCELERATOR
        if on_cpu:  # one call of the kernel: ~1.5 us for a small tensor, one read for a large one
            kernel = self._kernels.get(t.dtype)
            if kernel is not None and not is_zerotensor(t):  # a ZeroTensor has no memory
                try:  # a strided or negated view is copied first: still fewer reads than torch's
                    block = t if one_block(t) else t.resolve_neg().contiguous()  # alive in the call
                    address = block.data_ptr() if type(block) is torch.Tensor else 0
                    if address:  # 0: a subclass' shell without memory (reading it: a segfault)
                        kernel(address, n, self.exact_std, self._row_address(slot))
                        if t.dtype is torch.float64:
                            self._check_range(slot, block)
                        return slot
                except RuntimeError:  # no storage to read (functorch wrappers): torch reads it
                    pass
            if not self._kernels and self._build and not native.started():
                native.start()  # in the background: this step and the next go on with torch
        x = t.detach()
        # float64 on the CPU is read at once: its range is checked (below) while it is here;
        # with the kernel built, so is every CPU tensor (integers, bool, complex: a converted
        # copy, as large ones): staging costs a few torch reductions per step and shape
        if n <= SMALL_NUMEL and not immediate and not (
                on_cpu and (x.dtype is torch.float64 or self._kernels)):
            self._stage(x, shape, slot)
            return slot
        real = as_real(x)
        v = x if real is None else real
        if on_cpu:
            kernel = self._kernels.get(v.dtype) if real is not None else None
            if kernel is not None:  # a converted copy (integers, complex magnitudes)
                kernel(v.data_ptr(), n, self.exact_std, self._row_address(slot))
            else:
                self._raw[slot] = reduce_cpu(v, n, self.exact_std)
            if v.dtype is torch.float64 and (real is None or x.is_complex()):
                # integers made float64 (token ids: one a step) lie within 1 and 9.3e18 or are
                # 0, where squares never leave float64's range: no range to check
                self._check_range(slot, v)
        elif immediate:  # the trap reads at once: this synchronises, as documented
            rows = DeviceRows(self.exact_std, self._zero_on(v.device))
            rows.add(v, n, slot)
            self._raw[slot] = tuple(rows.table()[1][0].tolist())
        else:
            self._rows_on(v.device).add(v, n, slot)
        return slot

    def add_dense(self, t: torch.Tensor, n: int, kernel: native.Kernel) -> int:
        """`add` for the common tensor, in one call: plain, contiguous, not negated, on the CPU,
        with n > 0 values of a dtype that has a kernel other than float64 (whose range `add`
        checks). The same kernel call as `add` makes, so the same statistics to the bit."""
        slot = self._count
        self._count = slot + 1
        self._numel[slot] = n
        chunks = self._chunks
        chunk = slot >> _CHUNK_BITS
        if chunk < len(chunks):  # _row_address inlined: this runs once per module call
            address = chunks[chunk][1] + (slot & _CHUNK_MASK) * _ROW_BYTES
        else:
            address = self._row_address(slot)
        kernel(t.data_ptr(), n, self.exact_std, address)
        return slot

    def add_difference(self, a: torch.Tensor, b_address: int, n: int,
                       difference: native.Difference) -> int | None:
        """`add_dense` of a - b without making it (a parameter's update since its copy): a as
        `add_dense` takes it, b the address of as many values of the difference's dtype. None
        when the kernel could not (no memory to subtract into): nothing added."""
        slot = self._count
        if not difference(a.data_ptr(), b_address, n, self.exact_std, self._row_address(slot)):
            return None
        self._count = slot + 1
        self._numel[slot] = n
        return slot

    def _check_range(self, slot: int, v: torch.Tensor) -> None:
        """float64 values beyond about 1e150 (or all below 1e-150) have squares that leave
        float64's range, and a variance (1e400) that no RAW row can hold: their VALUES are
        taken exactly here, scaled by a power of two, and stand in for the row's."""
        raw = self._raw.get(slot)
        if raw is None:
            raw = self._chunks[slot >> _CHUNK_BITS][0][slot & _CHUNK_MASK]
        lo, hi = float(raw[0]), float(raw[1])
        largest = max(abs(lo), abs(hi))
        if (lo == hi or not math.isfinite(largest)
                or 1 / FLOAT64_SQUARES_FIT < largest < FLOAT64_SQUARES_FIT):
            return
        # exact (only the exponent changes), and never beyond float64: log2 of its largest
        # value rounds to 1024, 2.0 ** 1024 raised OverflowError and the step's rows were lost
        scale = math.ldexp(1.0, math.frexp(largest)[1] - 1)
        y = v.reshape(-1) / scale
        mean, std = (y.mean() * scale).item(), (y.std() * scale).item()
        zeros = 1.0 - float(raw[7]) / v.numel()
        self._exact[slot] = (mean, std, lo, hi, largest, 0.0, 0.0, zeros)

    def value(self, slot: int) -> Sequence[float]:
        """The VALUES of one slot taken with `immediate=True` (or an empty tensor's NaNs)."""
        if slot in self._exact:
            return self._exact[slot]
        raw = self._raw.get(slot)
        if raw is None and slot >> _CHUNK_BITS < len(self._chunks):
            raw = self._chunks[slot >> _CHUNK_BITS][0][slot & _CHUNK_MASK]
        if raw is None or slot not in self._numel:
            return EMPTY
        return finish(np.array([raw], dtype=np.float64), np.array([self._numel[slot]]))[0]

    def table(self, row_slots: Sequence[int | None]) -> np.ndarray:
        """VALUES for each row ([rows, 8] float64, NaN where none), after one collection."""
        raw, numel, exact = self.raw_rows(row_slots)
        return finish_rows(raw, numel, exact)

    def raw_rows(self, row_slots: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray, tuple]:
        """What `table` finishes, after one collection: the RAW row of each row ([rows, 8], NaN
        where none), its element count ([rows]) and the rare rows taken exactly, [(row, VALUES)].
        `finish_rows` of them is `table`: the store finishes many steps' rows at once, when
        they are read (`finish` is row by row, so the values are the same to the bit)."""
        if self._small or self._on_device:  # else nothing is deferred: no collection to make
            self.collect()
        count = self._count
        index = [count if s is None else s for s in row_slots]  # count: the "no statistics" row
        get = self._numel.get
        numel = np.array([get(s, 1) for s in index], dtype=np.float64)
        chunks = self._chunks
        if not self._raw and not self._tables and len(chunks) == 1 and count < 1 << _CHUNK_BITS:
            # most steps: the kernel's rows only (row `count`: NaN); most often each row has
            # its own slot, in order, and a slice's copy is the same rows without an index
            in_order = len(index) == count and index == [*range(count)]
            raw = chunks[0][0][:count].copy() if in_order else chunks[0][0][index]
        else:
            raw = np.full((count + 1, len(RAW)), np.nan)  # last row: "no statistics"
            if chunks:  # rows the kernel wrote (NaN elsewhere)
                written = np.concatenate([rows for rows, _ in chunks])[:count]
                raw[: len(written)] = written
            if self._raw:
                raw[list(self._raw)] = list(self._raw.values())
            for slots, table in self._tables:
                raw[slots] = table
            raw = raw[index]
        exact = tuple((row, self._exact[s]) for row, s in enumerate(index) if s in self._exact
                      ) if self._exact else ()  # the rare rows taken exactly (_check_range)
        return raw, numel, exact

    def spare_rows(self) -> tuple[np.ndarray, int] | None:
        """The first chunk of RAW rows (and its address), all NaN again, for a later step's
        StepStats to write (`rows=`): a new chunk is 64 KiB to allocate and fill, each step.
        Only once this step's rows were taken (`raw_rows` copies them) and no tensor is added
        any more. None when the kernel wrote none."""
        if not self._chunks:
            return None
        chunk = self._chunks[0]
        chunk[0][: min(self._count, 1 << _CHUNK_BITS)] = np.nan  # the rows written, at most
        return chunk

    def collect(self) -> None:
        """Reduce deferred tensors and move results to the host: one transfer per device."""
        self._reduce_small()
        for rows in self._on_device.values():
            slots, table = rows.table()
            self._tables.append((slots, table.to("cpu").numpy()))
        self._on_device = {}

    # --- reductions -----------------------------------------------------------------------
    def _row_address(self, slot: int) -> int:
        """Where the kernel writes the RAW row of `slot`."""
        chunk = slot >> _CHUNK_BITS
        while chunk >= len(self._chunks):
            rows = np.full((1 << _CHUNK_BITS, len(RAW)), np.nan)
            self._chunks.append((rows, rows.ctypes.data))  # one append: pairs stay together
        return self._chunks[chunk][1] + (slot & _CHUNK_MASK) * _ROW_BYTES

    def _rows_on(self, device: torch.device) -> DeviceRows:
        rows = self._on_device.get(device)
        if rows is None:
            rows = self._on_device[device] = DeviceRows(self.exact_std, self._zero_on(device))
        return rows

    def _zero_on(self, device: torch.device) -> torch.Tensor:
        zero = self._zero.get(device)
        if zero is None:
            zero = self._zero[device] = torch.zeros((), dtype=wide(device), device=device)
        return zero

    def _stage(self, x: torch.Tensor, shape: tuple, slot: int) -> None:
        dtype = x.dtype
        if dtype.is_complex:
            x = x.abs()  # magnitudes
            dtype = x.dtype
        staged_dtype = real_dtype(dtype)  # the staging copy converts
        key = (x.device, staged_dtype, shape)
        staging = self._small.get(key)
        if staging is None:
            staging = self._small[key] = Staging(shape, staged_dtype, x.device)
        self._small_bytes += staging.add(x, slot)  # a copy, never the activation itself
        if self._small_bytes > DEFER_BYTES_LIMIT:
            self._reduce_small()

    def _reduce_small(self) -> None:
        for (device, _dtype, _shape), staging in self._small.items():
            on_cpu = device.type == "cpu" and not CPU_AS_ACCELERATOR
            table = reduce_rows(staging.matrix(), on_device=not on_cpu)
            if on_cpu:
                self._tables.append((staging.slots, table.numpy()))
            else:  # stays on the device until `collect` moves everything at once
                self._rows_on(device).tables.append((staging.slots, table))
        self._small = {}
        self._small_bytes = 0
