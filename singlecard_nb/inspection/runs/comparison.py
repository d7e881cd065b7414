"""Two runs aligned tensor by tensor (`Comparison`) and their first divergence (`Divergence`).

The table comes from `alignment.align`; this module reads it: the first divergence in run a's
execution order, the structural differences in words, and the renderings.
"""

from __future__ import annotations

import dataclasses
import html

from ... import theme
from .alignment import (
    COMPARED,
    ONLY_IN_A,
    ONLY_IN_B,
    PER_RANK_GRADIENT,
    PRECISION_FACTOR,
    SHAPE_DIFFERS,
    Alignment,
    align,
)

_IO_OPTION = {"grad": "grads=True", "param_grad": "grads=True", "param": "params=True",
              "step_grad": "params=True", "buffer": "params=True"}
_TABLE_ROWS = 12


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first aligned tensor whose statistic `stat` differs beyond tolerance."""

    step: int
    module: str
    call: int
    io: str
    index: str
    stat: str
    a: float
    b: float
    rel: float
    type: str | None = None
    rank: int | None = None  # compare_ranks: the rank that differs from the reference rank

    def where(self) -> str:
        module = repr(self.module) if self.module else "the model itself ('')"
        kind = f" ({self.type})" if self.type else ""
        tensor = self.io + (f" {self.index}" if self.index else "")
        call = f", call {self.call}" if self.call else ""
        rank = f"rank {self.rank}: " if self.rank is not None else ""
        return f"{rank}step {self.step}, {module}{kind} {tensor}{call}"

    def __str__(self) -> str:
        return (f"{self.where()}: {self.stat} {_num(self.a)} vs {_num(self.b)} "
                f"(relative difference {_num(self.rel)})")


def _num(value: float) -> str:
    return "nan" if value != value else f"{value:.4g}"


class Comparison:
    """Two runs aligned tensor by tensor; renders with the first divergence on top.

    first: the first `Divergence` in run a's execution order, or None when every aligned tensor
    agrees within tolerance. notes: structural differences in words (steps, modules, tensors only
    one run has; shape and dtype differences).
    """

    def __init__(self, aligned: Alignment, notes: list[str], labels: tuple[str, str] = ("a", "b")):
        self.stats, self.rtol, self.atol = aligned.stats, aligned.rtol, aligned.atol
        self.ranks_a, self.ranks_b, self.by_rank = aligned.ranks_a, aligned.ranks_b, aligned.by_rank
        self.labels = labels
        self._frame = aligned.table
        self.notes = notes
        diverged = self._frame[self._frame["diverged"]]
        self.first = self._divergence(diverged.iloc[0]) if len(diverged) else None
        self._first_order = (None if self.first is None else
                             (int(diverged["step"].iloc[0]), int(diverged["_pos"].iloc[0])))
        # what differs in kind at the first divergence (training mode, dtype), said beside it
        self._first_note = str(diverged["note"].iloc[0]) if len(diverged) else ""
        self.dtype_change = first_dtype_change(self._frame)

    def _divergence(self, row) -> Divergence:
        stat = row["stat"]
        rank = None
        if self.by_rank:
            rank = int(row["rank"])
        elif len(self.ranks_a) > 1:  # a job against one run: which of its ranks
            rank = int(row["rank_a"])
        return Divergence(int(row["step"]), row["module"], int(row["call"]), row["io"],
                          row["index"], stat, float(row[f"{stat}_a"]), float(row[f"{stat}_b"]),
                          float(row["rel"]), row.get("type"), rank)

    # --- results ------------------------------------------------------------------------------
    def frame(self):
        """One row per aligned tensor (and per tensor only one side has), in execution order:
        both sides' statistics (`<stat>_a`, `<stat>_b`), relative differences (`<stat>_rel`;
        `rel` and `stat`: the worst), `diverged`, and `status`: compared, shape differs, only in
        a, only in b, per-rank gradient (`alignment.STATUSES`)."""
        return self._frame.drop(columns=["_pos"])

    @property
    def counts(self) -> dict[str, int]:
        status = self._frame["status"]
        return {COMPARED: int((status == COMPARED).sum()),
                "diverged": int(self._frame["diverged"].sum()),
                ONLY_IN_A: int((status == ONLY_IN_A).sum()),
                ONLY_IN_B: int((status == ONLY_IN_B).sum()),
                SHAPE_DIFFERS: int((status == SHAPE_DIFFERS).sum())}

    def plot(self, stat: str | None = None):
        """Largest relative difference per module, modules in execution order (a Figure)."""
        if stat is not None and stat not in self.stats:
            raise ValueError(f"stat must be one of {', '.join(self.stats)}; got {stat!r}")
        from .compare_plot import divergence_plot

        return divergence_plot(self._frame, stat, self.rtol, self.first, self.labels)

    def _headline(self) -> str:
        la, lb = self.labels
        counts = self.counts
        if counts[COMPARED] == 0:
            return f"nothing to compare: {la} and {lb} have no tensor in common"
        if self.first is None:
            return (f"{la} and {lb} agree within rtol={self.rtol:g}, atol={self.atol:g} on all "
                    f"{counts[COMPARED]} aligned tensors ({', '.join(self.stats)})")
        cause = ""
        if self._first_note:
            cause = f" ({self._first_note})"
        return f"first divergence: {self.first}{cause}"

    def _summary(self) -> str:
        c = self.counts
        return (f"{c[COMPARED]} tensors compared on {', '.join(self.stats)} (rtol={self.rtol:g}, "
                f"atol={self.atol:g}), {c['diverged']} diverged")

    def _diverged_rows(self):
        rows = self._frame[self._frame["diverged"]].head(_TABLE_ROWS)
        columns = [c for c in ("rank", "rank_a", "rank_b") if c in rows.columns
                   and (c == "rank" or len(self.ranks_a) > 1 or len(self.ranks_b) > 1)]
        rows = rows.rename(columns={"rel": "relative"})
        rows["a"] = [row[f"{row['stat']}_a"] for _, row in rows.iterrows()]
        rows["b"] = [row[f"{row['stat']}_b"] for _, row in rows.iterrows()]
        shown = ["step", *columns, "module", "type", "call", "io", "index", "stat", "a", "b",
                 "relative", "note"]
        return rows[[c for c in shown if c in rows.columns]]

    def _repr_html_(self) -> str:
        from ..views.summary import html_table

        parts = [f"<div class='singlecard-compare {theme.NO_MATH_CLASSES}'><p><b>"
                 f"{html.escape(self._headline())}</b></p>",
                 f"<p>{html.escape(self._summary())}</p>"]
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
                         + "</ul>")
        rows = self._diverged_rows()
        if len(rows):
            more = self.counts["diverged"] - len(rows)
            highlight = rows.index == rows.index[0]
            import pandas as pd

            # the shared table's highlight, as a tint the dark theme's light text reads on
            parts.append(html_table(rows, bad=pd.Series(highlight)).replace(
                'style="background:#fdd"', f'style="background:{theme.BAD_ROW}"'))
            if more > 0:
                parts.append(f"<p>… {more} more diverged tensors in cmp.frame()</p>")
        return theme.no_math("".join(parts) + "</div>")

    def __repr__(self) -> str:
        lines = [self._headline(), self._summary()] + [f"- {n}" for n in self.notes]
        rows = self._diverged_rows()
        if len(rows):
            lines.append(rows.to_string(index=False))
        return "\n".join(lines)


def structural_notes(aligned: Alignment, a, b, labels: tuple[str, str]) -> list[str]:
    """What only one run has, and what has another shape or dtype, in words."""
    la, lb = labels
    notes = []
    if not aligned.by_rank and (len(aligned.ranks_a) > 1 or len(aligned.ranks_b) > 1):
        notes.append(f"{la} holds ranks {aligned.ranks_a} and {lb} {aligned.ranks_b}: every rank "
                     f"of one is compared with every rank of the other")
    steps = {side: set(f["step"].unique()) for side, f in ((la, a), (lb, b))}
    for side, other in ((la, lb), (lb, la)):
        only = sorted(steps[side] - steps[other])
        if only:
            notes.append(f"steps only in {side}: {_ranges(only)} ({len(only)} of "
                         f"{len(steps[side])}; {other} recorded {len(steps[other])})")
    modules = {la: set(a["module"].unique()), lb: set(b["module"].unique())}
    for side, other in ((la, lb), (lb, la)):
        only = sorted(modules[side] - modules[other])
        if only:
            notes.append(f"modules only in {side}: {_names(only)} (include/exclude, or "
                         "another model)")
    kinds = {la: set(a["io"].unique()), lb: set(b["io"].unique())}
    for side, other in ((la, lb), (lb, la)):
        only = sorted(kinds[side] - kinds[other])
        if only:
            options = sorted({_IO_OPTION[k] for k in only if k in _IO_OPTION})
            hint = f" (recorded with {' / '.join(options)})" if options else ""
            notes.append(f"io {', '.join(map(repr, only))} only in {side}{hint}")
    frame = aligned.table
    common = (frame["step"].isin(steps[la] & steps[lb])
              & frame["module"].isin(modules[la] & modules[lb])
              & frame["io"].isin(kinds[la] & kinds[lb]))
    for status, side in ((ONLY_IN_A, la), (ONLY_IN_B, lb)):
        rows = frame[common & (frame["status"] == status)]
        if len(rows):
            notes.append(f"{len(rows)} more tensors only in {side} (first: "
                         f"{_where(rows.iloc[0])}): another call count or output structure")
    partial = frame[frame["status"] == PER_RANK_GRADIENT]
    if len(partial):
        notes.append(f"{len(partial)} param_grad tensors not compared: in a job they are each "
                     "rank's gradient before DDP's all-reduce. The gradient the optimiser "
                     "used is in the step_grad rows (inspect(..., params=True)).")
    reshaped = frame[frame["status"] == SHAPE_DIFFERS]
    if len(reshaped):
        row = reshaped.iloc[0]
        notes.append(f"shape differs in {len(reshaped)} tensors, not compared (first: "
                     f"{_where(row)}: {row['shape_a']} vs {row['shape_b']})")
    if "training_a" in frame.columns:
        moded = frame[_differs(frame, "training")]
        if len(moded):
            row = moded.iloc[0]
            users = moded[moded["type"].fillna("").str.contains(_MODE_TYPES)] \
                if "type" in moded.columns else moded.iloc[:0]
            first_user = (f"; the first that computes differently in training: "
                          f"{_where(users.iloc[0])} ({users.iloc[0]['type']})" if len(users) else "")
            notes.append(
                f"training mode differs in {len(moded)} tensors (first: {_where(row)}: {la} "
                f"{_mode(row['training_a'])}, {lb} {_mode(row['training_b'])}{first_user}): "
                "Dropout and BatchNorm compute differently in training mode, so these values "
                "differ by design; call model.eval() (or .train()) the same way in both runs")
    change = first_dtype_change(frame)
    if change is not None:
        retyped = int(_differs(frame, "dtype").sum())
        tolerance = (f"; values compared with rtol={aligned.rtol:g}, {PRECISION_FACTOR} × "
                     f"{aligned.coarse_dtype}'s precision (rtol={aligned.rtol_given:g} given)"
                     if aligned.rtol_given is not None else "; values compared")
        notes.append(f"dtype first differs at {change} ({retyped} tensors differ in dtype"
                     f"{tolerance})")
    return notes


_MODE_TYPES = r"Dropout|BatchNorm|SyncBatchNorm|InstanceNorm|RReLU"


def _mode(training) -> str:
    return "in training mode" if bool(training) else "in eval mode"


def _differs(frame, column: str):
    """Compared rows whose two sides disagree on `column` (a boolean Series)."""
    return ((frame["status"] == COMPARED)
            & (frame[f"{column}_a"] != frame[f"{column}_b"]).fillna(False).astype(bool))


def first_dtype_change(frame) -> str | None:
    """Where the two runs' dtypes first differ, in run a's execution order, preferring module
    outputs (the layer autocast runs in bfloat16, not a later input that only inherits it):
    "step 0, 'h.0.attn.c_attn' (Linear) output: float32 vs bfloat16"; None where none differs."""
    if "dtype_a" not in frame.columns:
        return None
    retyped = frame[_differs(frame, "dtype")]
    if not len(retyped):
        return None
    outputs = retyped[retyped["io"] == "output"]
    row = (outputs if len(outputs) else retyped).iloc[0]
    kind = f" ({row['type']})" if isinstance(row.get("type"), str) else ""
    module = repr(row["module"]) if row["module"] else "''"
    index = f" {row['index']}" if row["index"] else ""
    return (f"step {row['step']}, {module}{kind} {row['io']}{index}: {row['dtype_a']} vs "
            f"{row['dtype_b']}")


def _where(row) -> str:
    module = repr(row["module"]) if row["module"] else "''"
    index = f" {row['index']}" if row["index"] else ""
    return f"step {row['step']}, {module} {row['io']}{index}"


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0–2, 5, 7–8'."""
    spans, start = [], steps[0]
    for previous, current in zip(steps, steps[1:] + [None]):
        if current is None or current != previous + 1:
            spans.append(str(start) if start == previous else f"{start}–{previous}")
            start = current
    return ", ".join(spans[:10]) + (" …" if len(spans) > 10 else "")


def compare_frames(a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3, atol: float = 1e-6,
                   labels: tuple[str, str] = ("a", "b")) -> Comparison:
    """The `Comparison` of two frames of records: aligned, then described."""
    aligned = align(a, b, stats, rtol, atol)
    return Comparison(aligned, structural_notes(aligned, a, b, labels), labels)
