"""On-device statistics of tensors, collected for one step and moved to the host together.

Every tensor gets the same eight values, `VALUES`. Reductions first produce *raw* values (`RAW`:
min, max, a shift, the sum and the sum of squares of the values minus the shift, NaN, Inf and
non-zero counts); `finish` turns many rows of those into VALUES at once, on the host.

How a tensor is read (costs measured on a 2-core CPU, see benchmarks/README.md):

    CPU tensors         one call of the C kernel in `onepass.c` (built in the background by
                        `native.py`), which writes the RAW row itself: min, max, mean, the
                        centred sum of squares and the zero count in a single read, 1.0-2.0x
                        the cost of one `x.sum()` on large tensors and under a microsecond on
                        small ones. It reads a second time, in float64, only where the first
                        read cannot be trusted: NaN/Inf (counted), a variance that cancels,
                        squares out of float32's range (values beyond ~1e18 or below ~1e-18),
                        or `exact_std`. A strided view is copied first. Until the kernel is
                        ready, or where it cannot be built, torch reductions do the same
                        (a few reads per tensor).
    small tensors       on a GPU, and on a CPU before the kernel is ready: tensors of at most
                        SMALL_NUMEL values are copied (an activation is never referenced after
                        its hook), grouped by shape and reduced together when the step is
                        collected, with the two-pass variance.
    GPU tensors         torch reductions on the device, sums in float64, every count taken on
                        the device; all of a step's raw rows reach the host in one transfer.

Exactness: min, max, absmax and the NaN/Inf/zero counts are exact. mean and std are taken in
float32 within blocks of 4096 values and float64 across blocks (float64 throughout on a GPU);
std never comes from a difference that cancels by more than CANCELLATION_LIMIT, so std has a
relative error below 1e-4 at worst, and mean an error below 1e-5 of the values' spread (a float32
block sum of deviations: a mean near zero is not known to 1e-5 of itself), both typically 1e-7. A
constant tensor gets std exactly 0 and its value as mean. `exact_std=True` always takes the
second pass. float64 values beyond about 1e150 (or all below 1e-150), whose squares leave
float64's range, get their mean and std taken exactly on the CPU, scaled by a power of two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from . import native

VALUES = ("mean", "std", "min", "max", "absmax", "nan", "inf", "zeros")
RAW = ("min", "max", "shift", "s1", "s2", "nan", "inf", "nonzero")  # s1 = sum(x - shift), s2 of squares
EMPTY = (math.nan,) * len(VALUES)  # what an empty or unreducible tensor gets
SMALL_NUMEL = 16384  # at or below this, per-op overhead dominates: copy, defer and batch
DEFER_BYTES_LIMIT = 64 << 20  # deferred copies are reduced early beyond this (bounded memory)
# A second, centred pass when the mean square exceeds the variance this many times: the
# one-pass variance loses about log10(ratio) digits of the float32 sums' precision.
CANCELLATION_LIMIT = 10.0
_AMINMAX_NUMEL = 200_000  # below this one aminmax beats amin + amax (fewer dispatches)
_ZERO_CHUNK = 1 << 18  # the torch path counts zeros in chunks: no tensor-sized temporary
_CHUNK_BITS = 10  # the kernel's RAW rows come in chunks of 1024
_CHUNK_MASK = (1 << _CHUNK_BITS) - 1
_ROW_BYTES = 8 * 8  # len(RAW) float64
# Squares of values beyond this (or below its inverse) overflow (or lose digits to underflow)
# in the accumulator's type: such tensors are summed in float64 by torch instead.
_SQUARES_FIT = {torch.float32: 1e18, torch.float64: 1e150}

_REDUCIBLE = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.complex64, torch.complex128,
})


def reducible(t: torch.Tensor) -> bool:
    """Whether statistics can be taken; sparse, quantized, nested and meta tensors cannot."""
    return (t.dtype in _REDUCIBLE and t.layout is torch.strided and not t.is_nested
            and not t.is_meta)


def _wide(device: torch.device) -> torch.dtype:
    """The accumulation type for sums on an accelerator: float64, except on Apple's MPS,
    which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


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


def _one_block(t: torch.Tensor) -> bool:
    """Whether the elements fill one dense block of memory from `data_ptr()`, in any order
    (contiguous, channels_last, transposed views): then a kernel can read them as a vector.
    The kernel only reads memory, so a tensor that requires grad needs no `detach()`."""
    if type(t) is not torch.Tensor or t.is_neg():
        return False  # subclasses (Parameter too) and lazily negated views: torch reads them
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def _is_zerotensor(t: torch.Tensor) -> bool:
    """torch's ZeroTensor (an efficient all-zero gradient) has no storage: data_ptr() is 0."""
    is_zero = getattr(t, "_is_zerotensor", None)
    return is_zero is not None and is_zero()


def _squares_fit(dtype: torch.dtype, lo: float, hi: float) -> bool:
    """Whether squares of values in [lo, hi] are safe to sum in `dtype`'s accumulators
    (float32 for half types); a constant tensor needs no squares."""
    bound = _SQUARES_FIT.get(dtype, 1e18)
    largest = max(abs(lo), abs(hi))
    return lo == hi or 1 / bound < largest < bound


def _cancels(s2: float, spread: float) -> bool:
    """Whether a variance `spread` (centred sum of squares) taken as s2 - (sum)^2 / n from a
    sum of squares `s2` has lost too many digits."""
    return spread <= 0 or s2 > CANCELLATION_LIMIT * spread


def finish(raw: np.ndarray, n: np.ndarray) -> np.ndarray:
    """VALUES ([k, 8] float64) from RAW rows ([k, 8]) of tensors of `n` ([k]) elements."""
    lo, hi, shift, s1, s2, nan, inf, nonzero = raw.T
    with np.errstate(all="ignore"):
        mean = np.where(np.isfinite(shift), shift + s1 / n, shift)  # an Inf mean stays Inf
        var = np.maximum(s2 - s1 * s1 / n, 0.0) / (n - 1)  # unbiased, like torch.std
        var[(n <= 1) | ~np.isfinite(s1) | ~np.isfinite(s2)] = np.nan
        constant = (lo == hi) & np.isfinite(lo)  # exact: no rounding in the mean or std
        mean = np.where(constant, lo, mean)
        var = np.where(constant & (n > 1), 0.0, var)
        absmax = np.maximum(np.abs(lo), np.abs(hi))  # NaN stays NaN
        zeros = (n - nonzero) / n
    return np.stack([mean, np.sqrt(var), lo, hi, absmax, nan, inf, zeros], axis=1)


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
            # A normal tensor even under inference_mode: a step can mix inference_mode calls
            # with normal ones, and an inference tensor cannot be written outside it.
            with torch.inference_mode(False):
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

    exact_std: always take the centred second pass for the variance (slower).
    kernels: the one-pass kernels by dtype to use (default: `native.kernels()`, empty until
        they are built); `{}` takes every statistic with torch.
    """

    def __init__(self, exact_std: bool = False,
                 kernels: dict[torch.dtype, native.Kernel] | None = None):
        self.exact_std = exact_std
        self._count = 0
        self._raw: dict[int, tuple] = {}  # slot -> RAW already on the host
        self._numel: dict[int, int] = {}  # slot -> number of elements, for `finish`
        self._tables: list[tuple[list[int], np.ndarray]] = []  # many slots' RAW at once
        self._small: dict[tuple, _Staging] = {}  # (device, dtype, shape) -> deferred copies
        self._small_bytes = 0
        # RAW on an accelerator: device -> (slots, [RAW] vectors or [k, RAW] tables)
        self._on_device: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}
        self._zero: dict[torch.device, torch.Tensor] = {}
        self._kernels = native.kernels() if kernels is None else kernels  # {} until built
        self._build = kernels is None  # the first CPU tensor starts building the kernels
        # RAW rows the kernel writes, by slot: (rows, address) chunks that never move, so the
        # address a kernel writes to stays valid even while another thread adds a chunk
        self._chunks: list[tuple[np.ndarray, int]] = []
        self._exact: dict[int, tuple] = {}  # slot -> VALUES of float64 beyond 1e+-150

    def add(self, t: torch.Tensor, shape: tuple, *, immediate: bool = False) -> int:
        """Take statistics of `t`; `immediate` forbids deferring (the NaN trap reads at once)."""
        slot = self._count
        self._count += 1
        n = t.numel()
        if n == 0:
            return slot  # an empty tensor has a shape but no statistics (NaN row)
        self._numel[slot] = n
        on_cpu = t.is_cpu
        if on_cpu:  # one call of the kernel: ~1.5 us for a small tensor, one read for a large one
            kernel = self._kernels.get(t.dtype)
            if kernel is not None and not _is_zerotensor(t):  # a ZeroTensor has no memory
                try:  # a strided or negated view is copied first: still fewer reads than torch's
                    block = t if _one_block(t) else t.resolve_neg().contiguous()  # alive in the call
                    kernel(block.data_ptr(), n, self.exact_std, self._row_address(slot))
                    if t.dtype is torch.float64:
                        self._check_range(slot, block)
                    return slot
                except RuntimeError:  # no storage to read (functorch wrappers): torch reads it
                    pass
            if not self._kernels and self._build and not native.started():
                native.start()  # in the background: this step and the next go on with torch
        x = t.detach()
        # float64 on the CPU is read at once: its range is checked (below) while it is here
        if n <= SMALL_NUMEL and not immediate and not (on_cpu and x.dtype is torch.float64):
            self._stage(x, shape, slot)
            return slot
        real = _as_real(x)
        v = x if real is None else real
        if on_cpu:
            kernel = self._kernels.get(v.dtype) if real is not None else None
            if kernel is not None:  # a converted copy (integers, complex magnitudes)
                kernel(v.data_ptr(), n, self.exact_std, self._row_address(slot))
            else:
                self._raw[slot] = self._reduce_cpu(v, n)
            if v.dtype is torch.float64:
                self._check_range(slot, v)
        elif immediate:  # the trap reads at once: this synchronises, as documented
            self._raw[slot] = tuple(self._reduce_on_device(v, n).tolist())
        else:
            slots, vectors = self._on_device.setdefault(v.device, ([], []))
            slots.append(slot)
            vectors.append(self._reduce_on_device(v, n))
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
        if lo == hi or not math.isfinite(largest) or 1e-150 < largest < 1e150:
            return
        scale = 2.0 ** math.floor(math.log2(largest))  # exact: only the exponent changes
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
        self.collect()
        raw = np.full((self._count + 1, len(RAW)), np.nan)  # last row: "no statistics"
        if self._chunks:  # rows the kernel wrote (NaN elsewhere)
            written = np.concatenate([rows for rows, _ in self._chunks])[: self._count]
            raw[: len(written)] = written
        if self._raw:
            raw[list(self._raw)] = list(self._raw.values())
        for slots, table in self._tables:
            raw[slots] = table
        numel = np.ones(self._count + 1)
        if self._numel:
            numel[list(self._numel)] = list(self._numel.values())
        index = np.fromiter((self._count if s is None else s for s in row_slots), np.intp,
                            count=len(row_slots))
        values = finish(raw[index], numel[index])
        for slot, exact in self._exact.items():  # the rare rows taken exactly (_check_range)
            values[index == slot] = exact
        return values

    def collect(self) -> None:
        """Reduce deferred tensors and move results to the host: one transfer per device."""
        self._reduce_small()
        for slots, tables in self._on_device.values():
            rows = torch.cat([table.view(-1, len(RAW)) for table in tables])
            self._tables.append((slots, rows.to("cpu").numpy()))
        self._on_device = {}

    # --- reductions -----------------------------------------------------------------------
    def _row_address(self, slot: int) -> int:
        """Where the kernel writes the RAW row of `slot`."""
        chunk = slot >> _CHUNK_BITS
        while chunk >= len(self._chunks):
            rows = np.full((1 << _CHUNK_BITS, len(RAW)), np.nan)
            self._chunks.append((rows, rows.ctypes.data))  # one append: pairs stay together
        return self._chunks[chunk][1] + (slot & _CHUNK_MASK) * _ROW_BYTES

    def _stage(self, x: torch.Tensor, shape: tuple, slot: int) -> None:
        dtype = x.dtype
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

    def _reduce_cpu(self, v: torch.Tensor, n: int) -> tuple:
        """Torch reductions of a float32/float64 CPU tensor: before the kernel is ready, or
        where it cannot be built. Same RAW as the kernel's (onepass.c), the same way."""
        if n <= _AMINMAX_NUMEL:
            lo_t, hi_t = torch.aminmax(v)
        else:  # amin + amax: ~1.4x faster than aminmax on large CPU tensors
            lo_t, hi_t = v.amin(), v.amax()
        lo, hi = lo_t.item(), hi_t.item()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            nan, inf = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
            return (lo, hi, 0.0, v.sum().item(), math.nan, nan, inf,
                    n - int((v == 0).sum()))
        nonzero = n if lo > 0 or hi < 0 else _count_nonzero(v)
        s1 = v.sum().item()
        if v.is_contiguous():  # a BLAS dot is ~1.7x faster than vector_norm here
            flat = v.view(-1)
            s2 = torch.dot(flat, flat).item()
        else:
            s2 = torch.linalg.vector_norm(v).item() ** 2
        shift = 0.0
        if lo != hi and (self.exact_std or not (math.isfinite(s1) and math.isfinite(s2))
                         or not _squares_fit(v.dtype, lo, hi) or _cancels(s2, s2 - s1 * s1 / n)):
            exact = v.double()  # the rare exact path: centred, in float64
            shift = exact.mean().item()
            centred = (exact - shift).reshape(-1)
            s1, s2 = centred.sum().item(), torch.dot(centred, centred).item()
        return lo, hi, shift, s1, s2, 0, 0, nonzero

    def _reduce_on_device(self, v: torch.Tensor, n: int) -> torch.Tensor:
        """RAW of an accelerator tensor as a float64 vector on its device: nothing is read,
        so all counts are taken (no synchronisation) and sums accumulate in float64."""
        f64 = _wide(v.device)
        lo, hi = torch.aminmax(v)
        counts = torch.stack([torch.isnan(v).sum(), torch.isinf(v).sum(), torch.count_nonzero(v)])
        if self.exact_std:
            shift = v.sum(dtype=f64) / n
            centred = v.to(f64) - shift
            sums = torch.stack([shift, centred.sum(), torch.linalg.vector_norm(centred).square()])
        else:
            zero = self._zero.get(v.device)
            if zero is None:
                zero = self._zero[v.device] = torch.zeros((), dtype=f64, device=v.device)
            sums = torch.stack([zero, v.sum(dtype=f64),
                                torch.linalg.vector_norm(v, dtype=f64).square()])
        return torch.cat([torch.stack([lo, hi]).to(f64), sums, counts.to(f64)])

    def _reduce_small(self) -> None:
        # Per-row reductions over a [k, n] stack. Measured on the CPU: amin + amax are ~40x
        # faster than aminmax(dim=1), and a centred norm ~20x faster than var_mean.
        for (device, _dtype, _shape), staging in self._small.items():
            slots, m = staging.slots, staging.matrix()
            n = m.shape[1]
            on_cpu = device.type == "cpu"
            lo, hi = m.amin(dim=1), m.amax(dim=1)
            # float64 sums on a GPU (as for large tensors: nothing is read to decide), and on a
            # CPU for values whose float32 squares could overflow or underflow
            if m.dtype != torch.float64:
                bound = _SQUARES_FIT[torch.float32]
                largest = torch.maximum(lo.abs(), hi.abs())
                if not on_cpu or bool(((largest >= bound)
                                       | ((largest <= 1 / bound) & (lo != hi))).any()):
                    m = m.to(_wide(device))
            shift = m.sum(dim=1) / n
            centred = m - shift.unsqueeze(1)
            norm = torch.linalg.vector_norm(centred, dim=1)
            finite = on_cpu and bool(torch.isfinite(lo).all() & torch.isfinite(hi).all())
            if finite:  # NaN/Inf counts needed only when something is not finite
                nan = inf = torch.zeros_like(lo)
                nonzero = m.sign().abs_().sum(dim=1)
            else:
                nan, inf = torch.isnan(m).sum(dim=1), torch.isinf(m).sum(dim=1)
                nonzero = torch.count_nonzero(m, dim=1)
            f64 = _wide(device)
            table = torch.stack([lo.to(f64), hi.to(f64), shift.to(f64), centred.sum(dim=1).to(f64),
                                 norm.to(f64).square(), nan.to(f64), inf.to(f64),
                                 nonzero.to(f64)], dim=1)
            if on_cpu:
                self._tables.append((slots, table.numpy()))
            else:  # stays on the device until `collect` moves everything at once
                pending_slots, tables = self._on_device.setdefault(device, ([], []))
                pending_slots.extend(slots)
                tables.append(table)
        self._small = {}
        self._small_bytes = 0


def _count_nonzero(v: torch.Tensor) -> int:
    """Non-zeros of a finite CPU tensor: dot(sign, sign) is several times faster than
    count_nonzero there; taken in chunks, so no temporary as large as the tensor is made."""
    if not v.is_contiguous():
        return int(torch.count_nonzero(v))
    flat = v.view(-1)
    if flat.numel() <= _ZERO_CHUNK:
        signs = flat.sign()
        return round(torch.dot(signs, signs).item())
    buffer = torch.empty(_ZERO_CHUNK, dtype=flat.dtype)
    total = 0
    for chunk in flat.split(_ZERO_CHUNK):
        signs = torch.sign(chunk, out=buffer[: chunk.numel()])
        total += round(torch.dot(signs, signs).item())  # exact: at most 2**18 ones
    return total
