"""A tensor's eight statistics, `VALUES`, and `finish`: many RAW rows turned into VALUES at once,
on the host (the RAW row is `reductions.RAW`: min, max, a shift, the sums of the values minus the
shift and of their squares, NaN, Inf and non-zero counts)."""

from __future__ import annotations

import math

import numpy as np

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
