"""A tensor's RAW row (min, max, a shift, the sums of the values minus the shift and of their
squares, NaN, Inf and non-zero counts), taken by torch reductions, and `finish`: many RAW rows
turned into the eight statistics, `VALUES`, at once on the host.

Torch's reductions are the fallback for CPU tensors (before the one-pass kernel is ready, or
where it cannot be built), accelerator tensors, and batches of small tensors.

They give what the kernel gives (`stats.py` states the precision, the same on every path):
sums of float32 and half values are taken in float64, in chunks of `_SUM_CHUNK` values (a
bounded temporary, never one as large as the tensor), so neither a long strided view (whose
float32 sums torch takes without pairwise blocking) loses digits, nor squares of values beyond
~1e17 overflow float32; float64's own squares overflow beyond ~1e154, and those rows are
taken exactly by `stats.StepStats` (scaled by a power of two).
"""

from __future__ import annotations

import math

import numpy as np
import torch

RAW = ("min", "max", "shift", "s1", "s2", "nan", "inf", "nonzero")  # s1 = sum(x - shift), s2 of squares
# A second, centred pass when the mean square exceeds the variance this many times: the
# one-pass variance loses about log10(ratio) digits of the float64 sums' precision.
CANCELLATION_LIMIT = 10.0
_AMINMAX_NUMEL = 200_000  # below this one aminmax beats amin + amax (fewer dispatches)
_ZERO_CHUNK = 1 << 18  # zeros are counted in chunks: no tensor-sized temporary
_SUM_CHUNK = 1 << 16  # float64 copies of this many values at a time (512 KiB)
# float64 squares of values beyond this (or below its inverse) overflow (or lose digits to
# underflow): such rows are taken exactly (stats.StepStats._check_range)
FLOAT64_SQUARES_FIT = 1e150

# --- RAW rows to VALUES, on the host ------------------------------------------------------------
VALUES = ("mean", "std", "min", "max", "absmax", "nan", "inf", "zeros")
EMPTY = (math.nan,) * len(VALUES)  # what an empty or unreducible tensor gets


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


def wide(device: torch.device) -> torch.dtype:
    """The accumulation type for sums on an accelerator: float64, except on Apple's MPS,
    which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


def cancels(s2: float, spread: float) -> bool:
    """Whether a variance `spread` (centred sum of squares) taken as s2 - (sum)^2 / n from a
    sum of squares `s2` has lost too many digits."""
    return spread <= 0 or s2 > CANCELLATION_LIMIT * spread


def _float64_sums(flat: torch.Tensor, shift: float = 0.0) -> tuple[float, float]:
    """sum(x - shift) and sum((x - shift)^2) of a contiguous vector, in float64, in chunks."""
    if flat.dtype is torch.float64 and not shift:
        return flat.sum().item(), torch.dot(flat, flat).item()  # pairwise sum, BLAS dot
    s1 = s2 = 0.0
    buffer = torch.empty(min(flat.numel(), _SUM_CHUNK), dtype=torch.float64)
    for chunk in flat.split(_SUM_CHUNK):
        wide_chunk = buffer[: chunk.numel()]
        wide_chunk.copy_(chunk)
        if shift:
            wide_chunk.sub_(shift)
        s1 += wide_chunk.sum().item()
        s2 += torch.dot(wide_chunk, wide_chunk).item()
    return s1, s2


def reduce_cpu(v: torch.Tensor, n: int, exact_std: bool) -> tuple:
    """RAW of a float32/float64 CPU tensor with torch: the kernel's row (onepass.c), the same
    way: one pass of float64 sums, and a centred second one where the first cancels."""
    if n <= _AMINMAX_NUMEL:
        lo_t, hi_t = torch.aminmax(v)
    else:  # amin + amax: ~1.4x faster than aminmax on large CPU tensors
        lo_t, hi_t = v.amin(), v.amax()
    lo, hi = lo_t.item(), hi_t.item()
    if not (math.isfinite(lo) and math.isfinite(hi)):
        nan, inf = int(torch.isnan(v).sum()), int(torch.isinf(v).sum())
        return (lo, hi, 0.0, v.sum(dtype=torch.float64).item(), math.nan, nan, inf,
                n - int((v == 0).sum()))
    nonzero = n if lo > 0 or hi < 0 else count_nonzero(v)
    flat = v.reshape(-1) if v.is_contiguous() else v.contiguous().view(-1)  # strided: one copy
    s1, s2 = _float64_sums(flat)
    shift = 0.0
    if lo != hi and (exact_std or not math.isfinite(s2) or cancels(s2, s2 - s1 * s1 / n)):
        shift = s1 / n if math.isfinite(s1) else flat.double().mean().item()
        s1, s2 = _float64_sums(flat, shift)  # the rare exact path: centred
    return lo, hi, shift, s1, s2, 0, 0, nonzero


class DeviceRows:
    """RAW rows of one step's accelerator tensors, left on their device until the step is
    collected, where they become one [k, 8] float64 table (one transfer to the host).

    A tensor is read by 8 torch operations (`add`); its row is not made there but with every
    other tensor's at `table`, a few operations a step. Each operation is a kernel launch that
    costs the CPU a few microseconds whatever the tensor's size, so this is the cost of a module
    call with a large output on a GPU: 15 a tensor when each made its own row (stacks,
    conversions, a square, a concatenation), 8 now, with the same rows to the bit.
    Nothing is read, so nothing synchronises, and every count is taken; sums are float64.

    zero: a 0-dim zero of `wide(device)` on the device, the shift of every row whose sums are
        not centred (the caller keeps one per device: making it is a launch too).
    """

    __slots__ = ("exact_std", "zero", "read", "tables")

    def __init__(self, exact_std: bool, zero: torch.Tensor):
        self.exact_std, self.zero = exact_std, zero
        # (slot, min, max, shift, s1, norm, NaN, Inf, non-zero) of each tensor read by `add`, in
        # order: 0-dim tensors on the device (min and max in the tensor's dtype, the sums in
        # float64, the norm being s2's root, the counts int64)
        self.read: list[tuple] = []
        self.tables: list[tuple[list[int], torch.Tensor]] = []  # small tensors' [k, 8] rows

    def add(self, v: torch.Tensor, n: int, slot: int) -> None:
        """Read `v` (a real floating tensor of `n` > 0 elements) as the row of `slot`."""
        f64 = self.zero.dtype
        lo, hi = torch.aminmax(v)
        nan, inf, nonzero = torch.isnan(v).sum(), torch.isinf(v).sum(), torch.count_nonzero(v)
        if self.exact_std:
            shift = v.sum(dtype=f64) / n
            centred = v.to(f64) - shift
            s1, norm = centred.sum(), torch.linalg.vector_norm(centred)
        else:
            shift, s1, norm = self.zero, v.sum(dtype=f64), torch.linalg.vector_norm(v, dtype=f64)
        # one append: a Ctrl-C leaves the row whole or absent, never its parts out of step
        self.read.append((slot, lo, hi, shift, s1, norm, nan, inf, nonzero))

    def table(self) -> tuple[list[int], torch.Tensor]:
        """(slots, their RAW rows as one [k, 8] tensor on the device) of everything added."""
        slots, parts = [], []
        if self.read:
            read_slots, lo, hi, shift, s1, norm, nan, inf, nonzero = zip(*self.read)
            k, f64 = len(read_slots), shift[0].dtype
            sums = torch.stack([*shift, *s1, *norm]).view(3, k)
            sums[2].square_()  # norms to sums of squares
            parts.append(torch.cat([torch.stack([*lo, *hi]).to(f64).view(2, k).T, sums.T,
                                    torch.stack([*nan, *inf, *nonzero]).to(f64).view(3, k).T],
                                   dim=1))
            slots += read_slots
        for table_slots, table in self.tables:
            parts.append(table)
            slots += table_slots
        return slots, torch.cat(parts) if len(parts) > 1 else parts[0]


def reduce_rows(m: torch.Tensor, on_device: bool = False) -> torch.Tensor:
    """RAW of each row of a [k, n] matrix of small tensors' copies ([k, 8] float64).

    Off the CPU, or `on_device`, every count is taken and nothing is read back to decide (no
    synchronisation); a CPU matrix skips the NaN and Inf counts when its extremes are finite.

    Measured on the CPU: amin + amax are ~40x faster than aminmax(dim=1), and a centred norm
    ~20x faster than var_mean. Sums are float64 (float32 only on MPS, which has no float64), as
    on every other path: a tensor gets the same statistics whichever path read it.
    """
    device = m.device
    n = m.shape[1]
    on_cpu = device.type == "cpu" and not on_device
    f64 = wide(device)
    lo, hi = m.amin(dim=1), m.amax(dim=1)
    m = m.to(f64)  # sums in float64, as the kernel's and every other path's
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
    return torch.stack([lo.to(f64), hi.to(f64), shift.to(f64), centred.sum(dim=1).to(f64),
                        norm.to(f64).square(), nan.to(f64), inf.to(f64), nonzero.to(f64)], dim=1)


def count_nonzero(v: torch.Tensor) -> int:
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
