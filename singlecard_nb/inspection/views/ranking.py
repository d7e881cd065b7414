"""What changed: per-module histories of a few output statistics, ranked, folded and grouped.

The one order the live view, `insp.summary()` and the heatmap share, in plain Python (numpy-free,
no pandas, no IPython): non-finite outputs first, then modules whose absmax or std moved most
against their own recent history (steady growth or a sudden jump), outliers among the modules of
one type, dead modules (zeros near 1), then the rest by how much they moved. Every row says why
it is where it is. Containers whose output is one of their children's (a Block ending in its MLP,
an MLP ending in Dropout, the model ending in its head) are folded into that child's row, and
repeated blocks (`h.0.mlp.c_fc` … `h.11.mlp.c_fc`) collapse into one group row led by its worst
member.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

HISTORY = 64  # steps kept per module: memory stays bounded on a 30-minute run
WINDOW = 10  # "recent steps" that growth is measured over
MOVED = math.log(1.5)  # a statistic that changed by ×1.5 (or ÷1.5) is worth a reason
OUTLIER_RATIO = 8.0  # absmax this many times its type's median, and far out in MADs
DEAD = 0.99  # fraction of exact zeros from which a module counts as dead
GROUP_MIN = 3  # repeated modules collapse from this many on (two Linears are just two rows)

# Tiers, in the order rows are shown.
NONFINITE, WAS_NONFINITE, MOVING, OUTLIER, DEAD_TIER, QUIET = range(6)
_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole numeric path component


# Positions in a Track entry: one list per recorded step.
STEP, ABSMAX, STD, MEAN, ZEROS, NAN, INF = range(7)


@dataclass
class Track:
    """One module's recent output statistics, one entry per recorded step: [step, absmax over
    its output tensors, std, mean and zeros of its first one, NaN and Inf counts of all]."""

    path: str
    type: str
    order: int  # when it first reported: children before their containers
    shape: Any = None
    dtype: str = ""
    entries: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    first: tuple[int, float] | None = None  # (step, absmax) of the first step seen: the trend
    bad_step: int | None = None  # the first step with NaN/Inf in the output

    def add(self, step: int, shape: Any, dtype: str, mean: float, std: float, absmax: float,
            nan: int, inf: int, zeros: float) -> None:
        """One output tensor; a module's further tensors in the same step widen that step."""
        entries = self.entries
        if entries and entries[-1][STEP] == step:
            last = entries[-1]
            last[ABSMAX] = _nanmax(last[ABSMAX], absmax)
            last[NAN] += nan
            last[INF] += inf
        else:
            entries.append([step, absmax, std, mean, zeros, nan, inf])
            self.shape, self.dtype = shape, dtype
            if self.first is None:
                self.first = (step, absmax)
        if (nan or inf) and self.bad_step is None:
            self.bad_step = step

    def series(self, column: int) -> list:
        return [e[column] for e in self.entries]


class Tracks:
    """Tracks of every module, fed from a store's step records (incrementally) or a frame."""

    def __init__(self) -> None:
        self.by_path: dict[str, Track] = {}
        self.last_step: int | None = None
        self._fed: dict[int, tuple[Any, int]] = {}  # id(record) -> (record, rows read)

    def add(self, step: int, path: str, type_: str, shape: Any, dtype: str, mean: float,
            std: float, absmax: float, nan: Any, inf: Any, zeros: float) -> None:
        track = self.by_path.get(path)
        if track is None:
            track = self.by_path[path] = Track(path, str(type_), len(self.by_path))
        track.add(int(step), shape, str(dtype), _float(mean), _float(std), _float(absmax),
                  _count(nan), _count(inf), _float(zeros))
        self.last_step = max(int(step), self.last_step if self.last_step is not None else -1)

    def feed(self, records: Iterable[Any]) -> None:
        """Read the output rows of step records (`meta` tuples, `values` rows of stats.VALUES)
        not read before; a record is read once, so each draw costs only the new steps."""
        records = list(records)
        alive = {id(r) for r in records}
        self._fed = {k: v for k, v in self._fed.items() if k in alive}
        for record in records:
            seen = self._fed.get(id(record))
            if seen is not None and seen[0] is record:
                continue
            by_path = self.by_path
            for meta, (mean, std, _, _, absmax, nan, inf, zeros) in zip(
                    record.meta, record.values.tolist()):
                if meta[4] != "output" or meta[3] != 0:  # outputs of the first call
                    continue
                track = by_path.get(meta[1])
                if track is None:
                    track = by_path[meta[1]] = Track(meta[1], str(meta[2]), len(by_path))
                track.add(meta[0], meta[6], meta[7], mean, std, absmax,
                          _count(nan), _count(inf), zeros)
            if record.meta:
                self.last_step = max(record.meta[-1][0], -1 if self.last_step is None
                                     else self.last_step)
            self._fed[id(record)] = (record, len(record.meta))

    @classmethod
    def from_frame(cls, frame: Any) -> Tracks:
        """Tracks of a frame's output rows (first call of each module per step); extra columns
        (memory, anything added later) are ignored."""
        tracks = cls()
        if frame is None or len(frame) == 0:
            return tracks
        rows = frame[(frame["io"] == "output") & (frame["call"] == 0)]
        columns = ["step", "module", "type", "shape", "dtype", "mean", "std", "absmax", "nan",
                   "inf", "zeros"]
        for row in rows[columns].itertuples(index=False):
            tracks.add(*row)
        return tracks


@dataclass
class Row:
    """One module as ranked: its latest statistics, its tier and score, and why it is shown."""

    path: str
    type: str
    shape: Any
    dtype: str
    absmax: float
    std: float
    mean: float
    zeros: float
    nan: int
    inf: int
    tier: int
    score: float
    why: str
    order: int
    history: list[float]  # absmax over the kept steps (the sparkline)
    trend: tuple[float, float] | None  # absmax at the first and the last step seen
    steps: int
    same: list[str] = field(default_factory=list)  # folded modules with this very output
    members: list[Row] = field(default_factory=list)  # a group's members, worst first
    label: str = ""  # a group's pattern, `h.{0-11}.mlp.c_fc`; the path otherwise

    @property
    def name(self) -> str:
        return self.label or self.path or "(root)"

    @property
    def is_group(self) -> bool:
        return bool(self.members)


def rank(tracks: Tracks, fold: bool = True, group: bool = True) -> list[Row]:
    """Rows of every module in the "what changed" order (see the module docstring)."""
    peers = _type_medians(tracks.by_path.values())
    rows = [_assess(t, peers) for t in tracks.by_path.values() if t.entries]
    if fold:
        rows = _fold(rows)
    rows.sort(key=lambda r: (r.tier, -r.score, r.order))
    return _group(rows) if group else rows


def flatten(rows: Sequence[Row]) -> list[Row]:
    """Group rows replaced by their members, in rank order."""
    return [m for r in rows for m in (r.members or [r])]


def search(rows: Sequence[Row], query: str) -> list[Row]:
    """Modules (groups opened) whose path or type matches any comma- or space-separated term of
    `query`, case-insensitive: a glob (`h.9.*`, `*.c_fc`) matches the whole path or type, other
    terms anywhere in it. The browser's search box does the same."""
    terms = [t for t in re.split(r"[\s,]+", query.lower()) if t]

    def hit(row: Row) -> bool:
        fields = ((row.path or "(root)").lower(), row.type.lower())
        return any(fnmatch.fnmatchcase(f, t) if any(c in t for c in "*?[") else t in f
                   for t in terms for f in fields)

    return [r for r in flatten(rows) if hit(r)]


# --- assessing one module -------------------------------------------------------------------

def _assess(t: Track, peers: dict[str, tuple[float, float, int]]) -> Row:
    step, absmax, std, mean, zeros, nan, inf = t.entries[-1]
    moved, why_moved = _movement(t)
    tier, score, why = QUIET, moved, ""
    if nan or inf:
        parts = [f"NaN ×{nan}" if nan else "", f"Inf ×{inf}" if inf else ""]
        tier, score = NONFINITE, float(nan + inf)
        why = " ".join(p for p in parts if p) + f" in output (step {step})"
        if t.bad_step is not None and t.bad_step != step:
            why += f", since step {t.bad_step}"
    elif t.bad_step is not None:
        tier, score, why = WAS_NONFINITE, -t.bad_step, f"NaN/Inf at step {t.bad_step}"
    elif moved >= MOVED:
        tier, why = MOVING, why_moved
    else:
        outlier = _outlier(t, peers)
        if outlier is not None:
            tier, score, why = OUTLIER, outlier[0], outlier[1]
        elif zeros >= DEAD:
            tier, score, why = DEAD_TIER, zeros, f"dead: {zeros:.1%} zeros"
    first = t.first[1] if t.first else math.nan
    return Row(t.path, t.type, t.shape, t.dtype, absmax, std, mean, zeros, nan, inf, tier,
               score, why, t.order, t.series(ABSMAX), (first, absmax), len(t.entries))


def _movement(t: Track) -> tuple[float, str]:
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
        trend, jump = math.log(v1 / v0), math.log(v1 / v_prev)
        if abs(jump) >= MOVED and abs(jump) >= 0.5 * abs(trend) and abs(jump) > best:
            best, why = abs(jump), f"{name} jumped {_ratio(jump)} at step {s1}"
        if abs(trend) > best:
            best, why = abs(trend), f"{name} {_ratio(trend)} in {s1 - s0} steps"
    return best, why


def _ratio(log_ratio: float) -> str:
    r = math.exp(log_ratio)
    return f"×{r:.3g}" if r >= 1 else f"÷{1 / r:.3g}"


def _type_medians(tracks: Iterable[Track]) -> dict[str, tuple[float, float, int]]:
    """Per module type with 4 or more modules: median and MAD of log(absmax), and the count."""
    logs: dict[str, list[float]] = {}
    for t in tracks:
        absmax = t.entries[-1][ABSMAX] if t.entries else math.nan
        if 0 < absmax < math.inf:
            logs.setdefault(t.type, []).append(math.log(absmax))
    out = {}
    for type_, values in logs.items():
        if len(values) >= 4:
            median = _median(values)
            out[type_] = (median, _median([abs(v - median) for v in values]), len(values))
    return out


def _outlier(t: Track, peers: dict[str, tuple[float, float, int]]) -> tuple[float, str] | None:
    absmax = t.entries[-1][ABSMAX]
    if t.type not in peers or not 0 < absmax < math.inf:
        return None
    median, mad, count = peers[t.type]
    off = math.log(absmax) - median
    if abs(off) < math.log(OUTLIER_RATIO) or abs(off) < 4 * 1.4826 * mad:
        return None
    return abs(off), f"absmax {_ratio(off)} the median of {count} {t.type}"


# --- folding and grouping -------------------------------------------------------------------

def _fold(rows: list[Row]) -> list[Row]:
    """Fold a module into the earlier one whose output it returns unchanged (same shape and
    statistics): a container into its child, an identity (Dropout in eval) into its sibling."""
    kept: list[Row] = []
    by_output: dict[tuple, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r.order):
        key = (str(row.shape), row.dtype, repr(row.mean), repr(row.std), repr(row.absmax),
               row.nan, row.inf)
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
            key = (_NUMBER.sub("{}", row.path), row.type, str(row.shape))
            patterns.setdefault(key, []).append(row)
    out, placed = [], set()
    for row in rows:
        key = (_NUMBER.sub("{}", row.path), row.type, str(row.shape))
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


# --- small helpers --------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _count(value: Any) -> int:
    try:
        return 0 if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return 0


def _nanmax(a: float, b: float) -> float:
    """max that lets NaN win: a NaN absmax is exactly what a view must not hide."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
