"""Rules on the model's own inputs: NaN/Inf in the data, and per channel (images: dim 1 of
N×C×H×W; tables: the features of N×F) a channel whose std or absmax stands far from the
others' (a normalisation by a near-zero std, an unscaled feature)."""

from __future__ import annotations

import math

from .rows import INPUTS, NONFINITE, OUTLIER, Row, row_of
from .series import Channels, Track, median, num, times

FAR = 8.0  # a channel's absmax or std this many times the other channels' median
MIN_CHANNELS = 2


def assess(inputs: dict[str, Track], channels: dict[str, Channels]) -> list[Row]:
    rows = []
    for index, t in inputs.items():
        if not t.entries:
            continue
        _, absmax, std, mean, zeros, nan, inf, _ = t.entries[-1]
        if nan or inf:
            rows.append(row_of(
                t, NONFINITE, float(nan + inf) + 1e9,
                f"the model's input {index[5:]} holds NaN ×{nan} Inf ×{inf} (step {t.bad_step}): "
                "the data (or its preprocessing) is not finite", since=t.bad_step,
                phase=INPUTS))
            continue
        found = channels.get(index)
        row = _channel_row(t, found) if found is not None else None
        if row is not None:
            rows.append(row)
    return rows


def _channel_row(t: Track, found: Channels) -> Row | None:
    """The channel that stands out most, if one does."""
    values = found.values
    if len(values) < MIN_CHANNELS:
        return None
    best = None
    for c, (mean, std, absmax) in enumerate(values):
        others = [v for j, v in enumerate(values) if j != c]
        for name, column, value in (("absmax", 2, absmax), ("std", 1, std)):
            rest = [o[column] for o in others if o[column] > 0 and math.isfinite(o[column])]
            if not rest or not value > 0 or not math.isfinite(value):
                continue
            base = median(rest)
            off = value / base
            if off >= FAR and (best is None or off > best[0]):
                best = (off, c, name, value, base, mean, std, absmax)
    if best is None:
        return None
    off, c, name, value, base, mean, std, absmax = best
    axis = "channel" if len(found.shape or ()) == 4 else "feature"
    count = len(values) - 1
    against = f"the other {axis}" if count == 1 else f"the median of the other {count} {axis}s"
    why = (f"{axis} {c} of the model's input {t.path[5:]}: {name} {num(value)}, {times(off)} "
           f"{against} ({num(base)}); mean {num(mean)}, std {num(std)}, absmax {num(absmax)} "
           f"at step {found.step}: normalised by a near-zero std, or not normalised; check this "
           f"{axis}'s mean/std in the preprocessing")
    return row_of(t, OUTLIER, math.log(off), why, since=found.first_step, phase=INPUTS)
