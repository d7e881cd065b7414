"""Rules on parameter gradients (grads=True, or params=True's step_grad): NaN/Inf, and gradients
vanishing or exploding: orders of magnitude from the other parameters' at the same step."""

from __future__ import annotations

import math

from .rows import BACKWARD, MOVING, NONFINITE, OUTLIER, Row, row_of
from .series import ABSMAX, INF, NAN, STEP, Track, median, num, times

VANISHED = 1e4  # this many times below the largest gradient of the step: vanishing
EXPLODED = 1e3  # this many times the median parameter's gradient ...
LARGE = 10.0  # ... and elements this large: exploding (a deep stack's healthy top is not)


def assess(grads: dict[str, Track]) -> list[Row]:
    """A row per parameter whose gradient is non-finite, vanishing or exploding."""
    live = [t for t in grads.values() if t.entries]
    if not live:
        return []
    step = max(t.entries[-1][STEP] for t in live)
    now = [(t, t.entries[-1]) for t in live if t.entries[-1][STEP] == step]
    sizes = [(t, e[ABSMAX]) for t, e in now if 0 < e[ABSMAX] < math.inf and not e[NAN] + e[INF]]
    centre = median([math.log(v) for _, v in sizes]) if len(sizes) >= 3 else None
    smallest = min(sizes, key=lambda item: item[1]) if sizes else None
    largest = max(sizes, key=lambda item: item[1]) if sizes else None
    rows = []
    for t in live:
        entry = t.entries[-1]
        if entry[NAN] or entry[INF]:
            rows.append(row_of(
                t, NONFINITE, float(entry[NAN] + entry[INF]),
                f"NaN/Inf in its gradient (step {entry[STEP]}, since step {t.bad_step}): the "
                "backward of what uses it produced them (the loss, a log/sqrt/division near 0)",
                since=t.bad_step, phase=BACKWARD))
            continue
        if centre is None or entry[STEP] != step or not 0 < entry[ABSMAX] < math.inf:
            continue
        typical = math.exp(centre)
        off = entry[ABSMAX] / typical
        below = largest[1] / entry[ABSMAX]
        if below >= VANISHED:
            rows.append(row_of(
                t, OUTLIER, math.log(below),
                f"vanishing gradient: absmax {num(entry[ABSMAX])} at step {step}, "
                f"{times(below)} below the largest ({largest[0].path}: {num(largest[1])}; "
                f"median {num(typical)}); it barely learns: saturating activations (sigmoid, "
                "tanh) or depth without residual connections or normalisation",
                since=_since(t, largest[1] / VANISHED, below=True), phase=BACKWARD))
        elif off >= EXPLODED and entry[ABSMAX] >= LARGE:
            rows.append(row_of(
                t, MOVING, math.log(off),
                f"exploding gradient: absmax {num(entry[ABSMAX])}, {times(off)} the median "
                f"parameter's {num(typical)} at step {step} (smallest: {smallest[0].path} "
                f"{num(smallest[1])}); clip gradients or lower the learning rate",
                since=_since(t, typical * EXPLODED, below=False), phase=BACKWARD))
    return rows


def _since(t: Track, limit: float, below: bool) -> int:
    """The first kept step at which this gradient was past `limit` (below or above it)."""
    for e in t.entries:
        v = e[ABSMAX]
        if 0 < v < math.inf and ((v <= limit) if below else (v >= limit)):
            return e[STEP]
    return t.entries[-1][STEP]
