"""Every recorded series the ranking reads, kept short: outputs, the model's inputs (whole and
per channel), parameters, their gradients and updates, and the optimiser's param groups.

Plain Python (no numpy, no pandas): fed from a store's step records, each read once, or from a
frame. Each series keeps its last `HISTORY` steps whole and, for "since when", a compact trail
of every step (`Trail`: a few floats per step, at most `TRAIL` points): memory stays bounded on a
10 000-step run and an onset is still dated within a few steps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HISTORY = 64  # steps kept whole per series
TRAIL = 512  # points of a series' whole-run trail; past that, neighbours merge pairwise

# Positions in a Track entry: one list per recorded step.
STEP, ABSMAX, STD, MEAN, ZEROS, NAN, INF, MAX = range(8)

# The kinds of series, by the `io` of the rows they come from.
OUTPUT, INPUT, PARAM, GRAD, UPDATE = "output", "input", "param", "grad", "update"
_KIND_OF_IO = {"output": OUTPUT, "input": INPUT, "param": PARAM, "param_grad": GRAD,
               "step_grad": "step_grad", "update": UPDATE}


class Trail:
    """(step, absmax, rms) of every step of a series, in at most `TRAIL` points: when full,
    neighbours merge pairwise (the earlier step, the larger absmax, the later rms), and later
    steps are taken as many at a time, so a point stands for `stride` steps.

    Points are tuples, as Track's entries are: the garbage collector stops tracking a tuple of
    floats, while every list kept would count as long-lived, and 100 000 rows read at once
    brought full collections that doubled the read (Tracks.feed)."""

    __slots__ = ("points", "stride", "_open")

    def __init__(self) -> None:
        self.points: list[tuple] = []
        self.stride = 1
        self._open: list | None = None  # the point being filled, with its count of steps

    def add(self, step: int, absmax: float, rms: float) -> None:
        point = self._open
        if point is None:
            if self.stride == 1:  # a point per step: it is whole at once
                self.points.append((step, absmax, rms))
            else:
                self._open = [step, absmax, rms, 1]
        else:
            point[1], point[2] = nanmax(point[1], absmax), rms
            point[3] += 1
            if point[3] >= self.stride:
                self.points.append(tuple(point[:3]))
                self._open = None
        if len(self.points) >= TRAIL:
            merged = []
            for a, b in zip(self.points[::2], self.points[1::2]):
                merged.append((a[0], nanmax(a[1], b[1]), b[2]))
            if len(self.points) % 2:
                merged.append(self.points[-1])
            self.points, self.stride = merged, self.stride * 2

    def widen(self, absmax: float) -> None:
        """The latest step's absmax widened by a further tensor of that step."""
        if self._open is not None:
            self._open[1] = nanmax(self._open[1], absmax)
        elif self.points:
            step, widest, rms = self.points[-1]
            self.points[-1] = (step, nanmax(widest, absmax), rms)

    def all(self) -> list[tuple]:
        """Every point, oldest first: (step, absmax, rms) (a copy: read it when a rule has
        found something; `first` and `last` are what every ranking reads)."""
        return self.points + ([tuple(self._open[:3])] if self._open is not None else [])

    def first(self) -> tuple | None:
        """The first point, (step, absmax, rms), or None (what the first step was, kept)."""
        if self.points:
            return self.points[0]
        return tuple(self._open[:3]) if self._open is not None else None

    def last(self) -> tuple | None:
        if self._open is not None:
            return tuple(self._open[:3])
        return self.points[-1] if self.points else None


@dataclass
class Track:
    """One series, one entry per recorded step: (step, absmax over its tensors, std, mean,
    zeros of its first one, NaN and Inf counts of all, max), a tuple (see Trail)."""

    path: str  # the inspector's spelling: "h.0.mlp", "head.weight"; "input[0]": a model input
    type: str
    order: int  # when it first reported: children before their containers
    kind: str = OUTPUT
    shape: Any = None
    dtype: str = ""
    entries: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    first: tuple[int, float] | None = None  # (step, absmax) of the first step seen
    bad_step: int | None = None  # the first step with NaN/Inf
    # the largest finite and the smallest positive absmax ever added: a rule on the spread of
    # sizes (exploding gradients) skips a run whose sizes never spread that far, at once
    largest: float = 0.0
    least: float = math.inf
    added: int = 0  # steps ever added (entries keeps the last HISTORY): a parameter's count is
    # its optimiser steps, by which ranks that numbered their steps differently meet
    trail: Trail = field(default_factory=Trail)  # every step, compact: "since when"

    def add(self, step: int, shape: Any, dtype: str, mean: float, std: float, absmax: float,
            nan: int, inf: int, zeros: float, maximum: float = math.nan) -> None:
        """One tensor; a series' further tensors in the same step widen that step."""
        entries = self.entries
        if entries and entries[-1][STEP] == step:
            _, widest, std0, mean0, zeros0, nan0, inf0, maximum0 = entries[-1]
            widest = nanmax(widest, absmax)
            entries[-1] = (step, widest, std0, mean0, zeros0, nan0 + nan, inf0 + inf, maximum0)
            if self.first is not None and self.first[0] == step:  # first → last compares alike
                self.first = (step, widest)
            self.trail.widen(absmax)
        else:
            entries.append((step, absmax, std, mean, zeros, nan, inf, maximum))
            self.trail.add(step, absmax, rms_of(mean, std))
            self.added += 1
            self.shape, self.dtype = shape, dtype
            if self.first is None:
                self.first = (step, absmax)
        if (nan or inf) and self.bad_step is None:
            self.bad_step = step
        if self.largest < absmax < math.inf:
            self.largest = absmax
        if 0 < absmax < self.least:
            self.least = absmax

    def series(self, column: int) -> list:
        return [e[column] for e in self.entries]

    def rms(self, entry: tuple) -> float:
        """Root mean square of an entry's tensor, from its mean and std."""
        return rms_of(entry[MEAN], entry[STD])


@dataclass
class Channels:
    """Per-channel statistics of one model input: (mean, std, absmax) per channel, latest."""

    index: str  # as the inputs' tracks: "input[0]"
    shape: Any
    first_step: int
    step: int
    values: list[tuple[float, float, float]]


# The columns of a frame the series are built from (`Tracks.from_frame`), in `add_row`'s order
FRAME_COLUMNS = ("io", "step", "module", "type", "call", "index", "shape", "dtype", "mean", "std",
                 "absmax", "nan", "inf", "zeros", "max")


class Tracks:
    """Series of every kind, fed from a store's step records (incrementally) or a frame.

    by_path: outputs (module path -> Track); inputs: the model's inputs by index; params,
    grads (param_grad, else the optimiser's step_grad), updates: by "module.name";
    channels: per-channel statistics of the model's inputs; optimizer: the latest param
    groups seen stepping ({"optimizer", "group", "lr", "weight_decay", "params", "step"}).
    """

    def __init__(self) -> None:
        self.by_path: dict[str, Track] = {}
        self.inputs: dict[str, Track] = {}
        self.params: dict[str, Track] = {}
        self.grads: dict[str, Track] = {}
        self.step_grads: dict[str, Track] = {}
        self.updates: dict[str, Track] = {}
        self.channels: dict[str, Channels] = {}
        self.optimizer: list[dict] = []
        self.optimizer_first_step: int | None = None
        self.optimizer_steps = 0  # steps with param groups seen (an optimiser stepped)
        self.eval_steps: list[int] = []  # of those, steps taken with the model in eval mode
        self.carried_steps: list[int] = []  # ... and those whose gradients were not zeroed
        self.scaled = False  # an optimiser step ran inside GradScaler.step
        # (optimizer, group) -> [(step, lr)], every step's, halved when long (bounded)
        self.lr_history: dict[tuple[str, int], list[tuple[int, float]]] = {}
        # what loss.backward() was called on: [(step, value)], every step's, halved when long
        self.losses: list[tuple[int, float]] = []
        self.loss_ops: list[str] = []  # its last autograd operations, from the loss back
        self.loss_shared = False  # a loss another inspected model took too (a GAN's)
        self.losses_per_step = 0  # the most backward() calls of one step
        self.last_step: int | None = None
        self._fed: dict[int, tuple[Any, int]] = {}  # id(record) -> (record, rows read)
        self._routes: dict[tuple, Track | None] = {}  # (io, module, index) -> its series: feed
        self._count = 0

    def _table(self, io: str, path: str) -> dict[str, Track] | None:
        kind = _KIND_OF_IO.get(io)
        if kind == OUTPUT:
            return self.by_path
        if kind == INPUT:
            return self.inputs if path == "" else None  # the model's own inputs
        return {PARAM: self.params, GRAD: self.grads, "step_grad": self.step_grads,
                UPDATE: self.updates}.get(kind)

    def add_row(self, io: str, step: int, path: str, type_: str, call: int, index: str,
                shape: Any, dtype: str, mean: float, std: float, absmax: float, nan: Any,
                inf: Any, zeros: float, maximum: float = math.nan) -> None:
        """One row of a record or frame (rows of other io, and later calls, are skipped)."""
        if call != 0 and io in ("output", "input"):
            return
        track = self._track(io, path, type_, index)
        if track is None:
            return
        track.add(int(step), shape, str(dtype), to_float(mean), to_float(std),
                  to_float(absmax), to_count(nan), to_count(inf), to_float(zeros),
                  to_float(maximum))
        self.last_step = max(int(step), -1 if self.last_step is None else self.last_step)

    def _track(self, io: str, path: str, type_: str, index: str) -> Track | None:
        """The series a row of `io` goes to (made when first seen), or None: no series keeps
        such rows."""
        table = self._table(io, path)
        if table is None:
            return None
        if io == "output":
            key = path
        elif io == "input":
            key = "input" + (index or "[0]")
        else:
            key = f"{path}.{index}" if path and index else path or str(index)
        track = table.get(key)
        if track is None:
            track = table[key] = Track(key, str(type_), self._count,
                                       _KIND_OF_IO[io] if io != "step_grad" else GRAD)
            self._count += 1
        return track

    def add(self, step: int, path: str, type_: str, shape: Any, dtype: str, mean: float,
            std: float, absmax: float, nan: Any, inf: Any, zeros: float,
            maximum: float = math.nan) -> None:
        """One output row of a module (the first call's)."""
        self.add_row("output", step, path, type_, 0, "", shape, dtype, mean, std, absmax, nan,
                     inf, zeros, maximum)

    def feed(self, records: Iterable[Any]) -> None:
        """Read the rows of step records (`meta` tuples, `values` rows of kernel.reductions.VALUES) not
        read before; a record is read once, so each draw costs only the new steps.

        `add_row` for our own records, in fewer steps: the terminal form reads up to max_rows
        rows this way when a script ends (100 000 rows took 0.5 s, one 0.75 ms an iteration
        of a GPT script recorded with --grads --params, benchmarks/real_scripts.py). Their
        values are floats already (`tolist()`), their metadata the recorder's ints and
        strings, and each (io, module, index) finds its series once."""
        records = list(records)
        alive = {id(r) for r in records}
        self._fed = {k: v for k, v in self._fed.items() if k in alive}
        routes = self._routes
        last = -1 if self.last_step is None else self.last_step
        for record in records:
            seen = self._fed.get(id(record))
            if seen is not None and seen[0] is record:
                continue
            for meta, (mean, std, _, maximum, absmax, nan, inf, zeros) in zip(
                    record.meta, record.values.tolist()):
                step, path, type_, call, io, index, shape, dtype = meta[:8]
                if call and (io == "output" or io == "input"):
                    continue  # a later call of a module: the series are of the first
                route = (io, path, index)
                track = routes.get(route, routes)  # (routes itself: never seen)
                if track is routes:
                    track = routes[route] = self._track(io, path, type_, index)
                if track is None:
                    continue
                # counts are NaN in an empty tensor's row
                track.add(step, shape, dtype, mean, std, absmax, int(nan) if nan == nan else 0,
                          int(inf) if inf == inf else 0, zeros, maximum)
                if step > last:
                    last = step
            self.last_step = None if last < 0 else last
            self.add_extras(getattr(record, "extras", None))
            self._fed[id(record)] = (record, len(record.meta))

    def add_extras(self, extras: dict | None) -> None:
        """What a step record holds beside its rows: channels and optimiser groups, by name."""
        if not extras:
            return
        if "history" in extras:  # a condensed frame's: replaces what its two items added
            self._restore_history(extras["history"])
            return
        step = extras.get("step", self.last_step or 0)
        for index, item in extras.get("channels", {}).items():
            index = "input" + index
            known = self.channels.get(index)
            self.channels[index] = Channels(index, item["shape"],
                                            known.first_step if known else step, step,
                                            [tuple(c) for c in item["values"]])
        loss = extras.get("loss")
        if loss:
            values = [to_float(v) for v in loss.get("values", ())]
            self.losses += [(step, v) for v in values]
            if len(self.losses) >= 2 * TRAIL:
                self.losses[:] = self.losses[::2]
            self.loss_ops = self.loss_ops or list(loss.get("ops", ()))
            self.loss_shared = self.loss_shared or loss.get("shared", 1) > 1
            self.losses_per_step = max(self.losses_per_step, len(values))
        groups = extras.get("optimizer")
        if groups:
            self.optimizer = [dict(g, step=step) for g in groups]
            if self.optimizer_first_step is None:
                self.optimizer_first_step = step
            self.optimizer_steps += 1
            self.scaled = self.scaled or any(g.get("scaled") for g in groups)
            sizes = [(g.get("eval", 0), len(g.get("params", ()))) for g in groups]
            if sum(e for e, _ in sizes) * 2 > sum(n for _, n in sizes):
                self.eval_steps.append(step)
            if sum(g.get("carried", 0) for g in groups) * 2 > sum(n for _, n in sizes):
                self.carried_steps.append(step)
            for g in groups:
                if isinstance(g.get("lr"), (int, float)):
                    history = self.lr_history.setdefault((g.get("optimizer", ""), g.get("group", 0)), [])
                    history.append((step, float(g["lr"])))
                    if len(history) >= TRAIL:
                        history[:] = history[::2]

    _HISTORY_FIELDS = ("optimizer_steps", "eval_steps", "carried_steps", "scaled", "losses",
                       "loss_ops", "loss_shared", "losses_per_step")

    def history(self) -> dict:
        """What the extras of every step added up to, by name: the counts, steps and loss
        series the rules read, and each group's lr history (a loaded frame keeps this)."""
        out = {name: getattr(self, name) for name in self._HISTORY_FIELDS}
        out["lr_history"] = [[opt, group, steps] for (opt, group), steps
                             in self.lr_history.items()]
        return out

    def _restore_history(self, history: dict) -> None:
        for name in self._HISTORY_FIELDS:
            if name in history:
                value = history[name]
                setattr(self, name, [tuple(v) if isinstance(v, list) else v for v in value]
                        if name == "losses" else value)
        self.lr_history = {(opt, group): [tuple(p) for p in steps]
                           for opt, group, steps in history.get("lr_history", ())}

    @classmethod
    def from_frame(cls, frame: Any, extras: Iterable[dict] | None = None) -> Tracks:
        """Tracks of a frame's rows; extra columns (memory, anything added later) are ignored.
        extras: what the records held beside their rows (channels, optimiser groups); by
        default those a loaded frame carries (`extras_of`)."""
        tracks = cls()
        if extras is None:
            extras = extras_of(frame)
        if frame is not None and len(frame):
            rows = frame[frame["io"].isin(list(_KIND_OF_IO))]
            for row in rows[list(FRAME_COLUMNS)].itertuples(index=False):
                tracks.add_row(*row)
        for item in extras:
            tracks.add_extras(item)
        return tracks


# A frame read back from a record file (`scn.load`) carries its records' extras here, in
# `frame.attrs[ATTRS]["extras"]`: condensed (see `condensed`), each with the rank it is of.
ATTRS = "singlecard_nb"


def extras_of(frame: Any) -> list[dict]:
    """The extras a loaded frame carries, of the ranks whose rows it holds (a frame cut down
    to one rank ranks with that rank's channels and param groups)."""
    attrs = getattr(frame, "attrs", None)
    found = (attrs or {}).get(ATTRS, {}).get("extras") or []
    if not found or frame is None or "rank" not in getattr(frame, "columns", ()):
        return list(found)
    ranks = set(frame["rank"].unique().tolist())
    return [e for e in found if e.get("rank") in ranks]


def condensed(extras: Iterable[dict]) -> list[dict]:
    """The few extras that build the same Tracks as all of `extras` (steps in order): each
    input's channels and the param groups at their first step and their latest. A frame keeps
    these, not every step's (pandas deep-copies a frame's attrs on every operation), and last
    one "history" item: what the steps add up to (`Tracks.history`), bounded."""
    channels: dict[str, list] = {}  # index -> [first step, latest step, latest item]
    groups: list = []  # [first step, latest step, latest groups]
    scratch = Tracks()  # what every step's extras add up to: counts, lr and loss histories
    for item in extras:
        scratch.add_extras(item)
        scratch.last_step = max(item.get("step", 0), scratch.last_step or 0)
        step = item.get("step", 0)
        for index, found in (item.get("channels") or {}).items():
            known = channels.setdefault(index, [step, step, found])
            known[1:] = [step, found]
        if item.get("optimizer"):
            groups = [groups[0] if groups else step, step, item["optimizer"]]
    out = []
    for index, (first, last, found) in channels.items():
        out += [{"step": s, "channels": {index: found}} for s in dict.fromkeys((first, last))]
    if groups:
        out += [{"step": s, "optimizer": groups[2]} for s in dict.fromkeys(groups[:2])]
    out.sort(key=lambda e: e["step"])
    if scratch.optimizer_steps or scratch.losses:  # what the steps added up to, applied last
        out.append({"step": scratch.last_step or 0, "history": scratch.history()})
    return out


# --- small helpers --------------------------------------------------------------------------

def rms_of(mean: float, std: float) -> float:
    """√(mean² + std²) without overflow (float64 statistics may be near its maximum)."""
    return math.hypot(mean, std)


def median(values: list[float]) -> float:
    """The median; NaN of nothing."""
    if not values:
        return math.nan
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def to_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def to_count(value: Any) -> int:
    try:
        return 0 if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return 0


def nanmax(a: float, b: float) -> float:
    """max that lets NaN win: a NaN absmax is exactly what a view must not hide."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def ratio_text(log_ratio: float) -> str:
    """×1.5 or ÷20 of a log ratio; past float64's range (a float64 run at both its ends) in
    powers of ten, never an OverflowError of exp."""
    if log_ratio != log_ratio:
        return "×(an unknown ratio: NaN)"
    sign = "×" if log_ratio > 0 else "÷"
    if log_ratio in (math.inf, -math.inf):
        return f"{sign}(beyond float64's range)"
    if abs(log_ratio) > _LOG_LARGEST:
        return f"{sign}10^{round(abs(log_ratio) / math.log(10))}"
    r = math.exp(log_ratio)
    return f"×{r:.3g}" if r >= 1 else f"÷{1 / r:.3g}"


_LOG_LARGEST = math.log(1e300)  # ratios past this are said in powers of ten


def times(ratio: float) -> str:
    """100× or 1e+06×: how many times, in words a person reads at once (a ratio that
    overflowed float64, two values at its ends: "beyond 10^308×")."""
    if ratio == math.inf:
        return "beyond 10^308×"
    if ratio != ratio:
        return "an unknown number of times (NaN)"
    if ratio >= 1e4:
        return f"10^{round(math.log10(ratio))}×"
    return f"{ratio:.3g}×"


def num(value: float) -> str:
    if value != value:
        return "nan"
    if abs(value) >= 1e4 or (value and abs(value) < 1e-3):
        return f"{value:.2g}"
    return f"{value:.3g}"
