"""Rules on module outputs: NaN/Inf (and the float16 overflow that made it), movement against
the module's own history, outliers among the modules of one type (also in groups of two or
three), dead modules, and the module upstream of a dead one whose output is all below zero."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from ...dtype_limits import EXPLODED, LARGEST_HALF
from .rows import (
    CONFIG,
    DEAD_TIER,
    FORWARD,
    MOVING,
    NONFINITE,
    OUTLIER,
    QUIET,
    WAS_NONFINITE,
    Row,
    row_of,
)
from .series import ABSMAX, INF, MAX, MEAN, NAN, STD, STEP, Track, median, num, ratio_text

WINDOW = 10  # "recent steps" a jump is measured against
EXPLODING = 1e3  # absmax this many times its first step's (or its recent median): exploding
LARGE_ACTIVATION = 1e3  # ... and at least this large (a fresh head's logits grow ×40 healthily)
MOVED = math.log(EXPLODING)  # the least movement that is a finding
OUTLIER_RATIO = 8.0  # absmax this many times its type's median, and far out in MADs
SMALL_GROUP_RATIO = 100.0  # in a group of 2 or 3, this many times the others' median (a
# GAN's generator has Linears ×20 apart, by their fan-in)
DEAD = 0.99  # fraction of exact zeros from which a module counts as dead
# Below this an activation of the first step has not exploded: what comes before the module
# where an explosion began (EXPLODED: past any product a float32 can hold, 2.7e15) stays here
SANE = 1e6


def assess(tracks: dict[str, Track], inputs_largest: float = 0.0) -> list[Row]:
    """A row per module output, and above a dead module the one upstream that killed it.
    inputs_largest: the model inputs' largest absmax at their first step."""
    live = [t for t in tracks.values() if t.entries]
    peers = type_peers(live)
    in_order = sorted(live, key=lambda t: t.order)
    upstream = {t.path: prev for prev, t in zip(in_order, in_order[1:])}
    rows = [_assess(t, peers, upstream.get(t.path)) for t in live]
    rows += depth_growth(live)
    by_path = {r.path: r for r in rows}
    first_step = _first_step(in_order)
    began = _exploded_from_the_start(first_step, inputs_largest)
    if began is not None:
        _began_here(by_path[began.path], began, first_step)
    for row in rows:
        if row.tier == DEAD_TIER:
            cause = upstream.get(row.path)
            if cause is not None and _all_below_zero(cause):
                _blame_upstream(by_path[cause.path], row, cause)
    return rows


def _assess(t: Track, peers: dict, upstream: Track | None) -> Row:
    step, absmax, std, mean, zeros, nan, inf, _ = t.entries[-1]
    moved, why_moved = movement(t)
    if nan or inf:
        parts = [f"NaN ×{nan}" if nan else "", f"Inf ×{inf}" if inf else ""]
        why = " ".join(p for p in parts if p) + f" in output (step {step})"
        if t.bad_step is not None and t.bad_step != step:
            why += f", since step {t.bad_step}"
        why += _overflow(t, upstream)
        return row_of(t, NONFINITE, float(nan + inf), why, since=t.bad_step, phase=FORWARD)
    if t.bad_step is not None:
        return row_of(t, WAS_NONFINITE, -t.bad_step, f"NaN/Inf at step {t.bad_step}",
                      since=t.bad_step, phase=FORWARD)
    if moved >= MOVED:
        return row_of(t, MOVING, moved, why_moved)
    saturated = _saturated(t)
    if saturated is not None:
        return row_of(t, OUTLIER, saturated[0], saturated[1], since=saturated[2])
    outlier = _outlier(t, peers)
    if outlier is not None:
        return row_of(t, OUTLIER, outlier[0], outlier[1])
    if zeros >= DEAD:
        return row_of(t, DEAD_TIER, zeros, f"dead: {zeros:.1%} zeros")
    return row_of(t, QUIET, change(t), "")


def movement(t: Track) -> tuple[float, str]:
    """How far absmax exploded (|log ratio|), and said in words: a rise of EXPLODING× since the
    first step to values past LARGE_ACTIVATION, or a jump of as much at the last step. Healthy
    training moves activations a lot (logits of a fresh head grow ×40 as it learns, a layer
    leaves its init scale during warm-up): only an explosion is a finding; its cause is what the
    parameter, gradient and input rules name."""
    first, last = t.trail.first(), t.trail.last()
    if first is None or first is last or not 0 < first[1] < math.inf:
        return 0.0, ""
    (s0, v0), (s1, v1) = first[:2], last[:2]
    if not LARGE_ACTIVATION <= v1 < math.inf:
        return 0.0, ""
    recent = [e[ABSMAX] for e in list(t.entries)[-WINDOW - 1:-1] if 0 < e[ABSMAX] < math.inf]
    # differences of logs: a quotient of float64 extremes overflows (or underflows to 0)
    jump = math.log(v1) - math.log(median(recent)) if recent else 0.0
    trend = math.log(v1) - math.log(v0)
    if jump >= math.log(EXPLODING) and jump >= trend:
        return jump, f"absmax jumped {ratio_text(jump)} at step {s1} (to {num(v1)})"
    if trend >= math.log(EXPLODING):
        onset = next(p[0] for p in t.trail.all() if p[1] >= v0 * EXPLODING ** 0.5)
        return trend, (f"absmax {ratio_text(trend)} since step {s0} (to {num(v1)}, growing "
                       f"from step {onset}): the activations are exploding")
    return 0.0, ""


# A bounded activation's std, from which most of its values sit at the bounds: values within
# ±1 have std ≤ 1, so 0.9 needs 80 % of them near ±1 (sigmoid's within [0, 1]: std ≤ 0.5)
SATURATED_STD = {"Tanh": 0.9, "Hardtanh": 0.9, "Softsign": 0.9, "Sigmoid": 0.45,
                 "Hardsigmoid": 0.45}


def _saturated(t: Track) -> tuple[float, str, int] | None:
    """(score, why, since) of a tanh or sigmoid whose outputs sit at their bounds, where the
    gradient is ~0 (SageMaker Debugger's saturated_activation), read from its std."""
    limit = SATURATED_STD.get(t.type)
    std = t.entries[-1][STD]
    if limit is None or not std >= limit:
        return None
    since = next((e[STEP] for e in t.entries if e[STD] >= limit), t.entries[-1][STEP])
    bound = "±1" if limit > 0.5 else "0 and 1"
    return (std / limit, f"saturated: std {num(std)}, so most outputs sit at {bound} where its "
            "gradient is ~0 and the layers before it barely learn; its inputs are too large "
            "(the weights before it initialised too large, or no normalisation before it)", since)


DEPTH_GROWTH = 3.0  # absmax this many times the previous block's, on average along depth ...
DEPTH_TOTAL = 100.0  # ... and this many times from the first block to the last
_NUMBERED = re.compile(r"(?<![^.])\d+(?![^.])")


def depth_growth(live: list[Track]) -> list[Row]:
    """A row per stack of repeated blocks (`blocks.{i}.fc`, `layers.{i}`) whose outputs grow
    DEPTH_GROWTH× per block within one step: each block adds more than it receives, so the
    activations explode with depth, at the first step already (a residual branch initialised
    too large, weights of std 10). Read from the whole-run trail: the first step is kept."""
    stacks: dict[tuple[str, str], list[tuple[int, Track]]] = {}
    for t in live:
        numbers = _NUMBERED.findall(t.path)
        if numbers:
            key = (_NUMBERED.sub("{}", t.path), t.type)
            stacks.setdefault(key, []).append((int(numbers[-1]), t))
    rows = []
    for (pattern, type_), members in stacks.items():
        if len(members) < 3 or len({n for n, _ in members}) < len(members):
            continue
        members.sort(key=lambda m: m[0])
        firsts = [m[1].trail.first() for m in members]
        if len({p[0] for p in firsts}) != 1:
            continue  # they did not all run at one step: no depth to read
        values = [p[1] for p in firsts]
        if not all(0 < v < math.inf for v in values):
            continue
        log_total = math.log(values[-1]) - math.log(values[0])
        per_block = math.exp(log_total / (len(values) - 1))
        if log_total < math.log(DEPTH_TOTAL) or per_block < DEPTH_GROWTH:
            continue
        (n0, first), (n1, last) = members[0], members[-1]
        step = firsts[0][0]
        why = (f"absmax grows ×{per_block:.3g} per block along depth at step {step}: "
               f"{first.path} {num(values[0])} → {last.path} {num(values[-1])} "
               f"({len(members)} {type_}): each block adds more than it receives, so the "
               "activations explode with depth; initialise each residual branch smaller "
               "(÷√depth, as GPT-2 does), normalise each block's input, or lower the init std")
        row = row_of(last, MOVING, log_total, why, since=step, phase=FORWARD)
        row.path, row.kind = pattern.replace("{}", f"{{{n0}-{n1}}}"), "depth"
        row.type = f"{type_} stack"
        row.history = values
        row.trend = (values[0], values[-1])
        rows.append(row)
    return rows


def change(t: Track) -> float:
    """How much absmax or std moved over the recent steps (the largest |log ratio| of the last
    to the first of them): the order of the quiet rows, most changed first, with no claim."""
    recent = list(t.entries)[-WINDOW:]
    best = 0.0
    for column in (ABSMAX, STD):
        values = [e[column] for e in recent if 0 < e[column] < math.inf]
        if len(values) >= 2:
            best = max(best, abs(math.log(values[-1]) - math.log(values[0])))
    return best


def _overflow(t: Track, upstream: Track | None) -> str:
    """Where NaN/Inf first appeared in this output from a finite input (the module before it
    in the step): born here. In half precision that is an overflow, said with the dtype's
    largest value."""
    if t.bad_step is None:
        return ""
    first = next(e for e in t.entries if e[STEP] >= t.bad_step)
    fed = ""
    if upstream is not None and upstream.entries:
        last = next((e for e in reversed(upstream.entries) if e[STEP] == t.bad_step), None)
        if last is None or last[NAN] + last[INF]:
            return ""  # NaN/Inf came in (or nothing is known): not born here
        fed = f" from a finite input ({upstream.path or '(root)'}: absmax {num(last[ABSMAX])})"
    counted = " ".join(p for p in (f"NaN ×{first[NAN]}" * bool(first[NAN]),
                                   f"Inf ×{first[INF]}" * bool(first[INF])) if p)
    now = t.entries[-1][STEP]
    born = f"; first {counted} at step {t.bad_step}{fed}" if t.bad_step != now else \
        f"; born here{fed}"
    limit = LARGEST_HALF.get(t.dtype)  # float16's (bfloat16's overflow is said as float32's)
    if limit is not None:
        before = [e[ABSMAX] for e in t.entries if e[STEP] < t.bad_step]
        seen = f" (absmax {num(max(before))} before)" if before else ""
        return (f"{born}: {t.dtype} overflow, values beyond {t.dtype}'s largest {limit}"
                f"{seen}; compute this op in float32 (or bfloat16), or scale its inputs down")
    if not fed:
        return born
    if last[ABSMAX] >= EXPLODED.get(t.dtype, math.inf):
        return (born + ": values that had exploded before it, beyond what its products can "
                f"hold in {t.dtype}; find where they began to grow")
    return (born + ": an operation in its forward made them (log or sqrt of 0 or a negative "
            "number, a division by 0, exp overflow)")


def _first_step(in_order: list[Track]) -> list[Track]:
    """The modules of the first recorded step, in the order they reported."""
    seen = [t for t in in_order if t.first is not None]
    start = min((t.first[0] for t in seen), default=None)
    return [t for t in seen if t.first[0] == start]


def _exploded_from_the_start(first_step: list[Track], inputs_largest: float) -> Track | None:
    """Where the trouble of the first recorded step began: when some module's output of that
    step (`first_step`) had exploded (past EXPLODED for its dtype) or turned NaN/Inf, the first
    module of the step whose output left SANE while every module before it, and the model's
    inputs, stayed below it. None when nothing went wrong at the first step, or when NaN/Inf or
    large inputs came first (then the NaN/Inf rules, or the inputs' scale, say where to look)."""
    if not first_step or not inputs_largest < SANE:
        return None
    start = first_step[0].first[0]
    if not any(t.bad_step == start or EXPLODED.get(t.dtype, math.inf) <= t.first[1]
               for t in first_step):
        return None
    for t in first_step:
        if t.bad_step == start:  # NaN or Inf first
            return None
        if t.first[1] >= SANE:
            return t
    return None


def _began_here(row: Row, t: Track, step_tracks: list[Track]) -> None:
    """The row of the module where the first step's trouble began (see above) says so and
    ranks from that step, first of it."""
    step, absmax = t.first
    if any(other.bad_step == step for other in step_tracks):
        went_on = ", and the step's went on to NaN/Inf"
    else:
        largest = max(other.first[1] for other in step_tracks)
        went_on = f", and the step's went on to {num(largest)}" if largest > absmax else ""
    words = (f"the first module whose output left the healthy range: absmax {num(absmax)} at "
             f"step {step}, the first recorded, while every module before it stayed below "
             f"{num(SANE)}{went_on}; its weights held such values from the start (never "
             "initialised? a model made on the meta device and moved with to_empty() keeps "
             "whatever memory it got until an init reaches each of its modules), or an "
             "operation before it in the forward made them")
    if row.tier <= WAS_NONFINITE:
        row.why += f"; {words}"
    else:
        row.tier, row.score, row.why = MOVING, math.log(absmax), words
    # the weights it held before the step began: first of its step, before the NaN/Inf it led
    # to (in the forward phase)
    row.since, row.phase = step, CONFIG


def _all_below_zero(t: Track) -> bool:
    entry = t.entries[-1]
    return entry[MAX] == entry[MAX] and entry[MAX] <= 0 and entry[NAN] + entry[INF] == 0


def _blame_upstream(cause: Row, dead: Row, track: Track) -> None:
    """The module before a dead one outputs only values ≤ 0: that is why it is dead."""
    entry = track.entries[-1]
    since = next((e[STEP] for e in track.entries if e[MAX] == e[MAX] and e[MAX] <= 0),
                 entry[STEP])
    cause.tier, cause.score, cause.since, cause.phase = DEAD_TIER, 2.0, since, FORWARD
    cause.why = (f"every output ≤ 0 (max {num(entry[MAX])}, mean {num(entry[MEAN])}) since step "
                 f"{since}, so {dead.path or '(root)'} ({dead.type}) after it outputs only zeros"
                 ": its weights, inputs, bias or a normalisation push all values below zero")
    dead.why += f", because {cause.path or '(root)'} before it outputs only values ≤ 0"


def type_peers(tracks: Iterable[Track]) -> dict[str, list[tuple[str, float]]]:
    """Per module type: (path, log absmax) of every module of that type with a finite absmax."""
    logs: dict[str, list[tuple[str, float]]] = {}
    for t in tracks:
        absmax = t.entries[-1][ABSMAX] if t.entries else math.nan
        if 0 < absmax < math.inf:
            logs.setdefault(t.type, []).append((t.path, math.log(absmax)))
    return logs


def _outlier(t: Track, peers: dict[str, list[tuple[str, float]]]) -> tuple[float, str] | None:
    """Far above the median of its type: by MADs in groups of 4 and more; in groups of 2 or 3
    against the median of the others, by a wider margin (two Linears are allowed to differ).
    Far below is the usual thing, never a finding: residual projections initialised small
    (nanoGPT's c_proj, ÷24 its peers) or at zero; a module that outputs nothing is `dead`."""
    absmax = t.entries[-1][ABSMAX]
    group = peers.get(t.type, [])
    if len(group) < 2 or not 0 < absmax < math.inf:
        return None
    value = math.log(absmax)
    if len(group) >= 4:
        values = [v for _, v in group]
        centre = median(values)
        mad = median([abs(v - centre) for v in values])
        off = value - centre
        if off < math.log(OUTLIER_RATIO) or off < 4 * 1.4826 * mad:
            return None
        return abs(off), f"absmax {ratio_text(off)} the median of {len(group)} {t.type}"
    others = [v for path, v in group if path != t.path]
    off = value - median(others)
    if abs(off) < math.log(SMALL_GROUP_RATIO) or off < 0:  # the small one is the usual one
        return None
    other = "the other" if len(others) == 1 else f"the median of the other {len(others)}"
    return abs(off), f"absmax {ratio_text(off)} {other} {t.type}"

