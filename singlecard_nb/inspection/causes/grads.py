"""Rules on parameter gradients (grads=True, or params=True's step_grad): NaN/Inf, gradients
vanishing (orders of magnitude below the median parameter's at the same step, and small) or exploding (at
some step, orders of magnitude above the smaller gradients of that step), and gradients clipped
to a tiny total norm at every step (clip_grad_norm_ on a GradScaler's still-scaled gradients)."""

from __future__ import annotations

import math

from .rows import BACKWARD, MOVING, NONFINITE, OUTLIER, Row, row_of
from .series import ABSMAX, INF, MEAN, NAN, STD, STEP, Track, median, num, times

VANISHED = 1e4  # this many times below the median gradient of the step: vanishing ...
VANISHED_ABOVE = 1e-3  # ... and smaller than this: a gradient of 1e+12 never vanishes
EXPLODED = 1e3  # this many times the lower quartile of the step's gradients ...
LARGE = 10.0  # ... and elements this large: exploding (a deep stack's healthy top is not)
BIG_GRADIENT = 100.0  # a gradient this large, whose step then changed its weights by ...
REPLACED = 0.5  # ... this share of their size: exploding (word_language_model's healthy
# decoder moves by 0.75 of itself at lr 20, with gradients clipped to a norm of 0.25)
CLIPPED_STEPS = 3  # a total norm the same at this many steps in a row ...
CLIPPED_SPREAD = 1e-3  # ... within 0.1 % (clip_grad_norm_ gives max_norm to ~1e-6) ...
CLIPPED_TINY = 1e-3  # ... and this small: every update is (nearly) nothing


def assess(grads: dict[str, Track]) -> list[Row]:
    """A row per parameter whose gradient is non-finite, vanishing or exploding."""
    live = [t for t in grads.values() if t.entries]
    if not live:
        return []
    step = max(t.entries[-1][STEP] for t in live)
    now = [(t, t.entries[-1]) for t in live if t.entries[-1][STEP] == step]
    sizes = [(t, e[ABSMAX]) for t, e in now if 0 < e[ABSMAX] < math.inf and not e[NAN] + e[INF]]
    centre = median([math.log(v) for _, v in sizes]) if len(sizes) >= 3 else None
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
        below = typical / entry[ABSMAX]
        # against the step's median gradient, not its largest (one exploding gradient would
        # make every other one "vanishing"), never of a large gradient, and not of one that
        # was larger before (a layer settling is not a layer that never learned)
        start = t.trail.first()
        first = start[1] if start is not None and 0 < start[1] < math.inf else entry[ABSMAX]
        # of weight matrices only: a bias before a normalisation gets ~0 by design (BatchNorm
        # takes out any constant), which is harmless
        matrix = isinstance(t.shape, (tuple, list)) and len(t.shape) >= 2
        if (matrix and below >= VANISHED and entry[ABSMAX] < VANISHED_ABOVE
                and first <= 10 * entry[ABSMAX]):
            rows.append(row_of(
                t, OUTLIER, math.log(below),
                f"vanishing gradient: absmax {num(entry[ABSMAX])} at step {step}, "
                f"{times(below)} below the median gradient of that step ({num(typical)}; "
                f"largest {largest[0].path} {num(largest[1])}); it barely learns: saturating "
                "activations (sigmoid, tanh) or depth without residual connections or "
                "normalisation", since=_since(t, typical / VANISHED, below=True), phase=BACKWARD))
    return _merged(rows, _exploding(live))


def against_weights(grads: dict[str, Track], params: dict[str, Track],
                    updates: dict[str, Track], shown: set[str]) -> list[Row]:
    """One row for the first weight matrix whose gradient, at some step, was at least
    BIG_GRADIENT and whose optimiser step then changed it by REPLACED or more of its size: the
    update (lr × gradient) dwarfed the weights (a recurrent weight initialised too large, no
    clipping). Every gradient can be that large at once, when none stands out against the
    others (`_exploding`'s rule). `shown`: paths that already have a gradient row."""
    rows = []
    for path, grad in grads.items():
        param, update = params.get(path), updates.get(path)
        if grad.largest < BIG_GRADIENT:  # the usual case, at once
            continue
        if path in shown or param is None or update is None or not isinstance(
                param.shape, (tuple, list)) or len(param.shape) < 2:
            continue
        sizes = {p[0]: p[2] for p in param.trail.all()}
        moved = {p[0]: p[2] for p in update.trail.all()}
        # a parameter that starts at 0 (minGPT's and ViT's position embeddings) is its first
        # update, all of its size: its values after its first step are exactly that step's Δw
        made_by_first = param.first is not None and param.first == update.first
        for step, absmax, _ in grad.trail.all():
            weights, delta = sizes.get(step), moved.get(step)
            if not weights or delta is None or not BIG_GRADIENT <= absmax < math.inf:
                continue
            if made_by_first and step == param.first[0]:
                continue
            if delta >= REPLACED * weights:
                rows.append(row_of(
                    grad, MOVING, math.log(absmax),
                    f"exploding gradient at step {step}: absmax {num(absmax)}, and the "
                    f"optimiser step then changed the weights by {delta / weights:.0%} of their "
                    "size (|Δw|/|w|): the update (lr × gradient) dwarfed them; clip gradients "
                    "(clip_grad_norm_), or initialise the weights smaller (a recurrent weight: "
                    "orthogonal, or std 1/√hidden)", since=step, phase=BACKWARD))
                break
    if rows:  # one row: the first to explode, the largest of that step
        rows = [min(rows, key=lambda r: (r.since, -r.score))]
    return rows


def _merged(rows: list[Row], exploded: list[Row]) -> list[Row]:
    """One row per gradient: an earlier explosion joins its NaN or vanishing row (the worse
    tier kept, from the earlier step, both said)."""
    by_path = {r.path: r for r in rows}
    for row in exploded:
        other = by_path.get(row.path)
        if other is None:
            rows.append(row)
            continue
        first, second = (other, row) if other.tier <= row.tier else (row, other)
        first.why += f"; {'before that' if second is row else 'now'}: {second.why}"
        first.since = min(s for s in (first.since, second.since) if s is not None)
        if first is row:
            rows[rows.index(other)] = row
    return rows


def _exploding(live: list[Track]) -> list[Row]:
    """A row per parameter whose gradient, at some kept step, was EXPLODED times the lower
    quartile of that step's gradients and at least LARGE, from the first such step: one
    exploding step wrecks the weights, and the gradients after it may look tame (or vanish)."""
    top, bottom = max(t.largest for t in live), min(t.least for t in live)
    if top < LARGE or top < EXPLODED * bottom:
        return []  # the usual case (no step can hold one), at the cost of a look per gradient
    # columns of (step, absmax); a NaN/Inf absmax (a step with NaN/Inf) or 0 is no size
    columns = [(t, [e[STEP] for e in t.entries], [e[ABSMAX] for e in t.entries]) for t in live]
    by_step: dict[int, list[float]] = {}
    first = columns[0][1]
    if all(steps == first for _, steps, _ in columns):  # the usual case: every step, every one
        for step, column in zip(first, zip(*(values for _, _, values in columns))):
            by_step[step] = [v for v in column if 0 < v < math.inf]
    else:
        for _, steps, values in columns:
            for step, value in zip(steps, values):
                if 0 < value < math.inf:
                    by_step.setdefault(step, []).append(value)
    lows = {}  # step -> the lower quartile of its gradients: the tamer layers
    for step, values in by_step.items():
        if len(values) >= 3:
            values.sort()
            lows[step] = values[(len(values) - 1) // 4]
    smallests: dict[int, tuple[str, float]] = {}

    def smallest(step: int) -> tuple[str, float]:
        """(path, absmax) of the smallest gradient of `step`, found once per step."""
        if step not in smallests:
            smallests[step] = min(((t.path, v) for t, steps, values in columns
                                   for s, v in zip(steps, values) if s == step and 0 < v < math.inf),
                                  key=lambda item: item[1])
        return smallests[step]

    found: dict[str, Row] = {}
    for t, steps, values in columns:
        hits = [(step, value) for step, value in zip(steps, values)
                if LARGE <= value < math.inf and value >= EXPLODED * lows.get(step, math.inf)]
        if hits:
            step, value = hits[0]
            found[t.path] = _exploded_row(t, step, value, lows[step], by_step[step],
                                          smallest(step))
    return list(found.values())


def _exploded_row(t: Track, step: int, value: float, low: float, values: list[float],
                  least: tuple[str, float]) -> Row:
    latest = t.entries[-1]
    now = "" if latest[STEP] == step else \
        f"; at step {latest[STEP]}, the latest, absmax {num(latest[ABSMAX])}"
    return row_of(
        t, MOVING, math.log(value / low),
        f"exploding gradient at step {step}: absmax {num(value)}, {times(value / low)} the "
        f"smaller gradients of that step (lower quartile {num(low)}; smallest {least[0]} "
        f"{num(least[1])}; median {num(median(values))}){now}; clip gradients "
        "(clip_grad_norm_), lower the learning rate, or initialise the weights (a recurrent "
        "weight, a deep stack without normalisation) smaller", since=step, phase=BACKWARD)


def clipped(step_grads: dict[str, Track], backward: dict[str, Track],
            scaled: bool = False) -> list[Row]:
    """One row when the gradients the optimiser stepped with (step_grad) have the same tiny
    total norm at every recent step: clipped to a max_norm that leaves the updates nothing,
    most often clip_grad_norm_ on gradients a GradScaler still scales (before unscale_)."""
    latest = total_norms(step_grads, last_only=True)  # the usual case: one pass, not tiny
    if not latest or not 0 < latest[-1][1] <= CLIPPED_TINY:
        return []
    norms = total_norms(step_grads)
    if len(norms) < CLIPPED_STEPS:
        return []
    step, norm = norms[-1]
    if not 0 < norm <= CLIPPED_TINY:
        return []
    run = 0  # steps, from the latest back, whose norm is the latest's within CLIPPED_SPREAD
    while run < len(norms) and abs(norms[-1 - run][1] - norm) <= CLIPPED_SPREAD * norm:
        run += 1
    if run < CLIPPED_STEPS:
        return []
    since = norms[-run][0]
    why = (f"the gradients the optimiser stepped with have the same total norm {num(norm)} at "
           f"every step since step {since} ({run} steps)")
    scaled = dict(total_norms(backward)).get(step)
    if scaled and scaled < 2 * norm:
        return []  # nothing shrank them between backward and the step: not clipped there
    power = round(-math.log2(norm))
    scale = 2 ** power if 8 <= power <= 24 and abs(norm * 2 ** power - 1) <= 0.01 else None
    if scale is not None:
        why += f": 1/2^{power}, a max_norm of 1 divided by a loss scale of {scale}"
    if scaled:
        why += (f"; backward's were {times(scaled / norm)} larger (total norm {num(scaled)} at "
                f"step {step})")
    much = f"about {scale}×" if scale is not None else "far"
    if scaled:  # a GradScaler stepped this optimiser: said only when one did
        why += (": clip_grad_norm_ clipped the gradients while the GradScaler still scaled "
                f"them, so every update is {much} too small; call scaler.unscale_(optimizer) "
                "before clipping")
    else:
        why += (": the gradients are clipped to a max_norm so small that every update is "
                "(nearly) nothing; raise clip_grad_norm_'s max_norm")
    history = [n for _, n in norms]
    return [Row(path="(all parameters)", type="gradient norm", shape=(len(step_grads),),
                dtype="", absmax=norm, std=math.nan, mean=math.nan, zeros=math.nan, nan=0, inf=0,
                tier=MOVING, score=math.log(CLIPPED_TINY / norm), why=why, order=-1,
                history=history, trend=(history[0], norm), steps=len(norms), kind="optimizer",
                since=since, phase=BACKWARD)]


def total_norms(grads: dict[str, Track], last_only: bool = False) -> list[tuple[int, float]]:
    """(step, total 2-norm over the parameters) per kept step, oldest first, from each
    gradient's mean, std and number of elements; steps with NaN/Inf are left out.
    last_only: of each gradient's latest step only."""
    norms: dict[int, list[float]] = {}  # step -> each gradient's 2-norm
    bad: set[int] = set()
    for t in grads.values():
        size = math.prod(t.shape) if isinstance(t.shape, (tuple, list)) else None
        if not size or not t.entries:
            continue
        for e in (t.entries[-1],) if last_only else t.entries:
            if e[NAN] or e[INF]:
                bad.add(e[STEP])
                continue
            # √Σx² from the mean and the unbiased std (a single value has no std: NaN), by
            # hypot: no square of a float64 beyond 1.3e154 overflows (a norm beyond float64's
            # range is inf)
            spread = math.sqrt(size - 1) * e[STD] if size > 1 else 0.0
            norm = math.hypot(math.sqrt(size) * e[MEAN], spread)
            if norm == norm:
                norms.setdefault(e[STEP], []).append(norm)
    return [(s, math.hypot(*v)) for s, v in sorted(norms.items()) if s not in bad]


def _since(t: Track, limit: float, below: bool) -> int:
    """The first kept step at which this gradient was past `limit` (below or above it)."""
    for e in t.entries:
        v = e[ABSMAX]
        if 0 < v < math.inf and ((v <= limit) if below else (v >= limit)):
            return e[STEP]
    return t.entries[-1][STEP]
