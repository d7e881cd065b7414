"""Rules on parameters (params=True): NaN/Inf after an optimiser step, growth (and, of
matrices, shrinking towards zero) against their own history, and the update ratio |Δw| / |w| of each step against
the other parameters'."""

from __future__ import annotations

import math

from .rows import AFTER_STEP, MOVING, NONFINITE, OUTLIER, QUIET, Row, row_of
from .series import STEP, Track, median, num, times

# Weight matrices only: a bias or a norm's shift starts at 0, so its first updates multiply
# its size by thousands; only NaN/Inf is said of those. Healthy matrices grow too (an LSTM
# decoder ×9 in 300 steps at word_language_model's lr 20), so growth is a finding from
# EXTREME×, or from GROWN× while each step changes the matrix by LARGE_UPDATE of its size.
EXTREME = 100.0
GROWN = 10.0
SHRUNK = 4.0  # a matrix ÷ this many: shrinking (weight decay takes ~3 % in 300 healthy steps)
LARGE_UPDATE = 0.1  # |Δw|/|w| per step: a tenth of the weights at every step
ONSET = 1.25  # the growth's start: the first step past this many times the first RMS
UPDATE_OUTLIER = 100.0  # |Δw|/|w| this many times the median weight matrix's ...
UPDATE_FLOOR = LARGE_UPDATE  # ... and at least this: smaller steps are small whatever others do


def assess(params: dict[str, Track], updates: dict[str, Track]) -> list[Row]:
    """A row per parameter whose values or updates stand out; quiet ones are left out."""
    ratios = {path: r for path in params if (r := update_ratio(params[path], updates.get(path)))}
    # the median over weight matrices: a bias or norm that starts at 0 has |Δw|/|w| near 1
    # while its size is made by its first updates, the usual thing at the start of training
    logs = [math.log(r[0]) for path, r in ratios.items() if r[0] > 0 and _matrix(params[path])]
    typical = median(logs) if logs else None
    rows = []
    for path, track in params.items():
        if not track.entries:
            continue
        row = _assess(track, ratios.get(path) if _matrix(track) else None, typical, len(logs))
        if row is not None:
            rows.append(row)
    return rows


def _matrix(t: Track) -> bool:
    return isinstance(t.shape, (tuple, list)) and len(t.shape) >= 2


def update_ratio(param: Track, update: Track | None) -> tuple[float, int] | None:
    """(|Δw| / |w| of the latest step, the first step it was recorded) from the `update` rows
    (Δw of each optimiser step) and the parameter's own."""
    if update is None or not update.entries or not param.entries:
        return None
    entry = update.entries[-1]
    base = next((e for e in reversed(param.entries) if e[STEP] == entry[STEP]), None)
    if base is None:
        return None
    size = param.rms(base)
    if not size or not math.isfinite(size):
        return None
    return update.rms(entry) / size, update.entries[0][STEP]


def _assess(t: Track, ratio: tuple[float, int] | None, typical: float | None,
            counted: int) -> Row | None:
    step, _, _, _, _, nan, inf, _ = t.entries[-1]
    if nan or inf:
        what = " and ".join(p for p in (f"NaN ×{nan}" * bool(nan), f"Inf ×{inf}" * bool(inf)) if p)
        why = (f"{what} in the parameter after the optimiser step of step {t.bad_step}: the "
               "update (gradient × learning rate) was non-finite or too large")
        since = t.bad_step
        # it grew first: that is where it began (as growth is judged: of a matrix, or EXTREME)
        grown = _growth(t, before=t.bad_step, least=GROWN if _matrix(t) else EXTREME)
        if grown is not None:
            factor, start, since = grown
            why += f"; before that its RMS grew {times(factor)} from step {since}"
        return row_of(t, NONFINITE, float(nan + inf), why, since=since, phase=AFTER_STEP)
    parts, tier, score, since = [], QUIET, 0.0, None
    # growth and shrinking: of matrices (a bias or a norm's shift starts at 0, so its first
    # steps multiply its size; a LayerNorm's scale moves by ×2 in healthy training), and of
    # any parameter that grows EXTREME×, the way a diverging run does
    matrix = _matrix(t)
    steps_large = ratio is not None and ratio[0] >= LARGE_UPDATE
    grown = _growth(t, least=GROWN if steps_large else EXTREME) if matrix else None
    shrunk = _growth(t, shrinking=True) if grown is None and matrix else None
    if grown is not None:
        factor, start, onset = grown
        parts.append(f"RMS {times(factor)} since step {start} (growing from step {onset})")
        tier, score, since = MOVING, math.log(factor), onset
    elif shrunk is not None:
        factor, start, onset = shrunk
        parts.append(f"RMS {times(factor)} smaller since step {start} (shrinking from step "
                     f"{onset}, now {num(t.rms(t.entries[-1]))})")
        tier, score, since = MOVING, math.log(factor), onset
    if ratio is not None and typical is not None and counted > 1:
        value, first = ratio
        against = math.exp(typical)
        if value >= UPDATE_FLOOR and value >= UPDATE_OUTLIER * against:
            parts.append(f"each step changes it by {num(value)} of its size (|Δw|/|w|), "
                         f"{times(value / against)} the median parameter's {num(against)}")
            score = max(score, math.log(value / against))
            tier = MOVING if tier == MOVING else OUTLIER
            since = first if since is None else min(since, first)
    if not parts:
        return None
    cause = ("its weight decay (lr × weight_decay) pulls it to zero, or its learning rate is too "
             "large for it" if shrunk is not None else
             "its learning rate (or gradient) is too large for it")
    why = "; ".join(parts) + ": " + cause
    return row_of(t, tier, score, why, since=since, phase=AFTER_STEP)


def _growth(t: Track, before: int | None = None, shrinking: bool = False,
            least: float = GROWN) -> tuple[float, int, int] | None:
    """(RMS latest ÷ first, the first step, the step growth began) when grown ×`least` (over the
    steps before `before`, when given); shrinking: (first ÷ latest, ...) when shrunk ÷SHRUNK.
    Read from the whole run's trail: "from step N" is true of a 10 000-step run."""
    ends = t.trail.first(), t.trail.last()
    if before is None and None not in ends and ends[0] is not ends[1] and all(
            0 < e[2] < math.inf for e in ends):  # the usual case, read in O(1): no growth
        ratio = ends[1][2] / ends[0][2]
        if (ratio < least) if not shrinking else (ratio * SHRUNK > 1):
            return None
    sized = [(p[0], p[2]) for p in t.trail.all() if before is None or p[0] < before]
    sized = [(s, r) for s, r in sized if r > 0 and math.isfinite(r)]
    if len(sized) < 2:
        return None
    (start, first), (_, last) = sized[0], sized[-1]
    if shrinking:
        if first < SHRUNK * last:
            return None
        onset = next(s for s, r in sized if r * ONSET <= first)
        return first / last, start, onset
    if last < least * first:
        return None
    onset = next(s for s, r in sized if r >= ONSET * first)
    return last / first, start, onset
