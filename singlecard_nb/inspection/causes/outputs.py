"""Rules on module outputs: NaN/Inf (and the float16 overflow that made it), movement against
the module's own history, outliers among the modules of one type (also in groups of two or
three), dead modules, and the module upstream of a dead one whose output is all below zero."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...dtype_limits import EXPLODED, LARGEST_HALF
from .rows import (
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

WINDOW = 10  # "recent steps" that growth is measured over
MOVED = math.log(1.5)  # a statistic that changed by ×1.5 (or ÷1.5) is worth a reason
OUTLIER_RATIO = 8.0  # absmax this many times its type's median, and far out in MADs
SMALL_GROUP_RATIO = 20.0  # in a group of 2 or 3, this many times the others' median
DEAD = 0.99  # fraction of exact zeros from which a module counts as dead


def assess(tracks: dict[str, Track]) -> list[Row]:
    """A row per module output, and above a dead module the one upstream that killed it."""
    live = [t for t in tracks.values() if t.entries]
    peers = type_peers(live)
    in_order = sorted(live, key=lambda t: t.order)
    upstream = {t.path: prev for prev, t in zip(in_order, in_order[1:])}
    rows = [_assess(t, peers, upstream.get(t.path)) for t in live]
    by_path = {r.path: r for r in rows}
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
    outlier = _outlier(t, peers)
    if outlier is not None:
        return row_of(t, OUTLIER, outlier[0], outlier[1])
    if zeros >= DEAD:
        return row_of(t, DEAD_TIER, zeros, f"dead: {zeros:.1%} zeros")
    return row_of(t, QUIET, moved, "")


def movement(t: Track) -> tuple[float, str]:
    """How far absmax or std moved over the recent steps (|log ratio|), and said in words:
    steady growth from the window's start, or a jump at the last step."""
    best, why = 0.0, ""
    recent = list(t.entries)[-WINDOW:]
    if len(recent) < 2:
        return best, why
    for name, column in (("absmax", ABSMAX), ("std", STD)):
        pairs = [(e[STEP], e[column]) for e in recent if 0 < e[column] < math.inf]
        if len(pairs) < 2:
            continue
        (s0, v0), (s1, v1), (_, v_prev) = pairs[0], pairs[-1], pairs[-2]
        # logs of each: 1e308 / 1e-300 overflows and 1e-300 / 1e308 underflows to 0
        trend, jump = math.log(v1) - math.log(v0), math.log(v1) - math.log(v_prev)
        if abs(jump) >= MOVED and abs(jump) >= 0.5 * abs(trend) and abs(jump) > best:
            best, why = abs(jump), f"{name} jumped {ratio_text(jump)} at step {s1}"
        if abs(trend) > best:
            best, why = abs(trend), f"{name} {ratio_text(trend)} in {s1 - s0} steps"
    return best, why


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
    limit = LARGEST_HALF.get(t.dtype)
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
                 ": a bias or normalisation pushes all values below zero; check its bias and "
                 "initialisation")
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

