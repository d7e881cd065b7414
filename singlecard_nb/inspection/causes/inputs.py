"""Rules on the model's own inputs: NaN/Inf in the data, a float input far from unit scale
(absolute: unnormalised pixels in every channel), and per channel (images: dim 1 of
N×C×H×W; tables: the features of N×F) a channel whose std or absmax stands far from the
others' (a normalisation by a near-zero std, an unscaled feature)."""

from __future__ import annotations

import bisect
import math

from .rows import INPUTS, NONFINITE, OUTLIER, Row, row_of
from .series import STEP, Channels, Track, num, times

FAR = 8.0  # a channel's absmax or std this many times the other channels' median
FAR_FROM_UNIT = 50.0  # a float input whose |mean| or std is this large is not normalised
# (pixels 0-255: mean ~120, std ~70; a normalised image stays within ±3)
MIN_CHANNELS = 2


def assess(inputs: dict[str, Track], channels: dict[str, Channels]) -> list[Row]:
    rows = []
    for index, t in inputs.items():
        if not t.entries:
            continue
        _, absmax, std, mean, zeros, nan, inf, _ = t.entries[-1]
        if t.bad_step is not None:  # at any step: one bad batch is where a NaN run begins
            bad = next((e for e in t.entries if e[STEP] == t.bad_step), None)
            counts = (f"NaN ×{bad[5]} Inf ×{bad[6]}" if bad is not None else "NaN/Inf")
            now = "" if nan or inf else f" (finite again at step {t.entries[-1][STEP]})"
            rows.append(row_of(
                t, NONFINITE, float(nan + inf) + 1e9,
                f"the model's input {index[5:]} held {counts} at step {t.bad_step}{now}: the "
                "data (or its preprocessing) is not finite", since=t.bad_step,
                phase=INPUTS))
            continue
        found = channels.get(index)
        row = (_channel_row(t, found) if found is not None else None) or _scale_row(t, found)
        if row is not None:
            rows.append(row)
    return rows


def _channel_row(t: Track, found: Channels) -> Row | None:
    """The channel that stands out most, if one does: each channel against the median of the
    others, from one sorted copy per statistic (n log n in channels: a 100 000-feature table
    ranks in milliseconds)."""
    values = found.values
    if len(values) < MIN_CHANNELS:
        return None
    best = None
    for name, column in (("absmax", 2), ("std", 1)):
        usable = sorted(v[column] for v in values if v[column] > 0 and math.isfinite(v[column]))
        if len(usable) < MIN_CHANNELS:
            continue
        for c, channel in enumerate(values):
            value = channel[column]
            if not value > 0 or not math.isfinite(value):
                continue
            off = value / median_without(usable, value)
            if off >= FAR and (best is None or off > best[0]):
                best = (off, c, name, value, median_without(usable, value), *channel)
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


def median_without(ordered: list[float], value: float) -> float:
    """The median of sorted `ordered` with one element equal to `value` left out."""
    n = len(ordered) - 1
    at = bisect.bisect_left(ordered, value)

    def nth(i: int) -> float:  # the i-th of the list without position `at`
        return ordered[i + (i >= at)]

    if n <= 0:
        return math.nan
    mid = n // 2
    return nth(mid) if n % 2 else (nth(mid - 1) + nth(mid)) / 2


def _scale_row(t: Track, found: Channels | None) -> Row | None:
    """A floating-point input far from unit scale in every channel at once (pixels 0-255): the
    per-channel rule cannot see it, the first layer's pre-activations are that many times too
    large. With channels known, their median channel must be far too (one odd channel is the
    channel rule's).

    Only a batch of features or images (two dimensions or more) can be such data: a single
    number or one per sample (transformers' Trainer passes `num_items_in_batch`, a diffusion
    model its timesteps 0-1000, a model sequence lengths) is a count or a condition that the
    model reads as it is, and one value has no spread to judge a scale by.

    And data is far from unit scale from its first batch: an input that was not at its first
    step (its largest value below the line) grew so during the run. It is something the model
    made and was handed back (word_language_model's LSTM state, zeros at step 0, detached and
    passed in again each batch), not the preprocessing of the data."""
    if not t.dtype.startswith(("float", "bfloat")) or not t.entries:
        return None
    if not isinstance(t.shape, (tuple, list)) or len(t.shape) < 2:
        return None
    if t.first is None or not t.first[1] >= FAR_FROM_UNIT:
        return None
    _, absmax, std, mean, _, _, _, _ = t.entries[-1]
    scale = max(abs(mean), std if math.isfinite(std) else 0.0)
    if found is not None and len(found.values) >= MIN_CHANNELS:
        typical = sorted(max(abs(m), s) for m, s, _ in found.values)[len(found.values) // 2]
        scale = min(scale, typical)
    if not scale >= FAR_FROM_UNIT or not math.isfinite(scale):
        return None
    why = (f"the model's input {t.path[5:]} is far from unit scale: mean {num(mean)}, std "
           f"{num(std)}, absmax {num(absmax)} at step {t.entries[-1][STEP]}: it is not "
           "normalised; scale it to about unit size (pixels: ÷255, then (x - mean) / std per "
           "channel; features: standardise each)")
    since = next((p[0] for p in t.trail.all() if p[2] >= FAR_FROM_UNIT), t.entries[-1][STEP])
    return row_of(t, OUTLIER, math.log(scale), why, since=since, phase=INPUTS)
