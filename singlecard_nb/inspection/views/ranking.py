"""What changed, and why: the one ranking of every recorded series (`causes/`), containers
folded into the child whose output they return, repeated blocks grouped, searched.

The live view, `insp.summary()`, the heatmap, `%inspect all` and the terminal's report show this
one order: causes first (a parameter group's learning rate, an input channel, a gradient that
vanishes, a parameter that grows, the first module to produce NaN), then what moved against its
own history, outliers among the modules of one type, dead modules, then the rest. Every row says
why it is where it is. Containers whose output is one of their children's (a Block ending in its
MLP, an MLP ending in Dropout, the model ending in its head) are folded into that child's row,
and repeated blocks (`h.0.mlp.c_fc` … `h.11.mlp.c_fc`) collapse into one group row led by its
worst member.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from ..causes import (  # noqa: F401  (the thresholds, the tiers and a Track's fields, read by the views)
    ABSMAX,
    DEAD,
    DEAD_TIER,
    HISTORY,
    INF,
    MEAN,
    MOVED,
    MOVING,
    NAN,
    NONFINITE,
    OUTLIER,
    OUTLIER_RATIO,
    QUIET,
    STD,
    STEP,
    WAS_NONFINITE,
    WINDOW,
    ZEROS,
    Row,
    Track,
    Tracks,
    assess,
    order,
)

GROUP_MIN = 3  # repeated modules collapse from this many on (two Linears are just two rows)
_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole numeric path component


def rank(tracks: Tracks, fold: bool = True, group: bool = True) -> list[Row]:
    """Rows of every series in the ranking's order (see the module docstring)."""
    rows = assess(tracks)
    if fold:
        rows = _fold(rows)
    rows = order(rows)
    return _group(rows) if group else rows


def findings(tracks: Tracks, top: int | None = None) -> list[Row]:
    """The rows that show something (groups collapsed), causes first; `top`: the first ones."""
    rows = [r for r in rank(tracks) if r.is_finding]
    return rows if top is None else rows[:top]


def flatten(rows: Sequence[Row]) -> list[Row]:
    """Group rows replaced by their members, in rank order."""
    return [m for r in rows for m in (r.members or [r])]


def search(rows: Sequence[Row], query: str) -> list[Row]:
    """Series (groups opened) whose path or type matches any comma- or space-separated term of
    `query`, case-insensitive: a glob (`h.9.*`, `*.c_fc`) matches the whole path or type, other
    terms anywhere in it. The browser's search box does the same."""
    terms = [t for t in re.split(r"[\s,]+", query.lower()) if t]

    def hit(row: Row) -> bool:
        fields = ((row.path or "(root)").lower(), row.type.lower())
        return any(fnmatch.fnmatchcase(f, t) if any(c in t for c in "*?[") else t in f
                   for t in terms for f in fields)

    return [r for r in flatten(rows) if hit(r)]


# --- folding and grouping -------------------------------------------------------------------

def _fold(rows: list[Row]) -> list[Row]:
    """Fold a module into the earlier one whose output it returns unchanged (same shape and
    statistics): a container into its child, an identity (Dropout in eval) into its sibling."""
    kept: list[Row] = [r for r in rows if r.kind != "output"]
    by_output: dict[tuple, list[Row]] = {}
    for row in sorted((r for r in rows if r.kind == "output"), key=lambda r: r.order):
        key = (str(row.shape), row.dtype, repr(row.mean), repr(row.std), repr(row.absmax),
               row.nan, row.inf, row.since)  # NaN statistics alike: not the same output
        target = next((r for r in by_output.get(key, []) if _related(r.path, row.path)), None)
        if target is None or row.tier < target.tier:
            kept.append(row)
            by_output.setdefault(key, []).append(row)
        else:
            target.same.append(row.path or "(root)")
    return kept


def _related(inner: str, outer: str) -> bool:
    """`inner` is inside `outer`, or they are siblings."""
    if outer == "" or inner.startswith(outer + "."):
        return True
    return inner.rpartition(".")[0] == outer.rpartition(".")[0]


def _group(rows: list[Row]) -> list[Row]:
    """Collapse rows whose paths differ only in numeric components (and share type and output
    shape: repeated blocks) into one row per pattern, at the place of its worst member."""
    patterns: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        if _NUMBER.search(row.path):
            key = (_NUMBER.sub("{}", row.path), row.type, str(row.shape), row.kind)
            patterns.setdefault(key, []).append(row)
    out, placed = [], set()
    for row in rows:
        key = (_NUMBER.sub("{}", row.path), row.type, str(row.shape), row.kind)
        members = patterns.get(key, [])
        if len(members) < GROUP_MIN:
            out.append(row)
        elif key not in placed:
            placed.add(key)
            out.append(_group_row(key[0], members))
    return out


def _group_row(pattern: str, members: list[Row]) -> Row:
    worst = members[0]
    numbers = [_NUMBER.findall(m.path) for m in members]
    parts = pattern.split("{}")
    label = parts[0]
    for i, rest in enumerate(parts[1:]):
        values = sorted({int(n[i]) for n in numbers})
        label += (str(values[0]) if len(values) == 1 else "{" + _ranges(values) + "}") + rest
    return Row(**{**worst.__dict__, "members": list(members), "label": label, "same": worst.same})


def _ranges(numbers: list[int]) -> str:
    """0,1,2,3,7 -> "0-3,7"."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
