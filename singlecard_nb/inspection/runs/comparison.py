"""Two runs aligned tensor by tensor (`Comparison`) and their first divergence (`Divergence`).

The table comes from `alignment.align`; this module reads it: the first divergence in run a's
execution order and the renderings. The structural differences in words are `structure.py`'s.
"""

from __future__ import annotations

import dataclasses
import html

from ... import theme
from .alignment import (
    COMPARED,
    ONLY_IN_A,
    ONLY_IN_B,
    SHAPE_DIFFERS,
    Alignment,
    align,
)
from .structure import first_dtype_change, structural_notes

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


def compare_frames(a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3, atol: float = 1e-6,
                   labels: tuple[str, str] = ("a", "b")) -> Comparison:
    """The `Comparison` of two frames of records: aligned, then described."""
    aligned = align(a, b, stats, rtol, atol)
    return Comparison(aligned, structural_notes(aligned, a, b, labels), labels)
