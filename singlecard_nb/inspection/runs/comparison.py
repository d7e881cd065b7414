"""Two recorded runs side by side: where do they first compute different things?

    cmp = compare(a, b)        # a, b: Inspector, insp.frame(), or saved records (a path)
    cmp.first                  # first divergence in a's execution order, or None
    compare_ranks(insp)        # the ranks of one job, on what DDP keeps equal on every rank

Rows align on (step, module, call, io, index), and on rank when both sides hold the same ranks.
*Execution order* is run a's: steps by number, and within a step the order a recorded its rows
(forward outputs as modules finish, then gradients in the backward's order, parameters last).
So a gradient that differs because the loss differs is found where the backward starts, and
the step-0 output of a perturbed layer comes before anything later depends on it. Steps are
matched by number: a run recorded with every=2 aligns with the even steps of an every=1 run;
steps, modules or tensors that only one run recorded are listed as structural differences and
never count as the first divergence.

Only the frame's statistic columns and the alignment keys are read, so a column added to the
frame later does not change the comparison. The rows are matched in `alignment`, read here into a
`Comparison` (the first divergence in run a's execution order and its renderings; the
structural differences in words are `structure.py`'s), and drawn in
`compare_plot.divergence_plot`.
"""

from __future__ import annotations

import dataclasses
import html
import os
from typing import Any

from ... import theme
from .alignment import (
    COMPARED,
    ONLY_IN_A,
    ONLY_IN_B,
    SHAPE_DIFFERS,
    Alignment,
    align,
    by_optimizer_steps,
    check_stats,
    ranks_of,
)
from .structure import first_dtype_change, structural_notes

__all__ = ["Comparison", "Divergence", "RankComparison", "STATE_IO", "as_frame", "compare",
           "compare_ranks"]

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
        from ..views import html_table

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


# What DDP keeps identical on every rank: parameters after each optimiser step and the gradients
# the step used (after the all-reduce). Recorded by inspect(model, params=True).
STATE_IO = ("param", "step_grad", "update")  # update: Δw of the step, equal under DDP too


def as_frame(x: Any):
    """A frame of records from an Inspector, a DataFrame, or a path/glob given to `load`."""
    import pandas as pd

    if isinstance(x, pd.DataFrame):
        return x
    if isinstance(x, (str, os.PathLike, list, tuple)):
        from .recorded import load

        return load(x)
    if callable(getattr(x, "frame", None)):
        return x.frame()
    raise TypeError(f"compare() takes an Inspector, a DataFrame of records or a path to saved "
                    f"records; got {type(x).__name__}")


def _last_ranks_run():
    from ...job import LAST_RANKS_RUN

    last = LAST_RANKS_RUN.records
    if last is None:
        raise ValueError("compare_ranks() with no argument compares the ranks of the last "
                         "`%run` under `%singlecard cpu --ranks N`, and none has run in this "
                         "process; give an Inspector, a frame or a path of saved records.")
    if isinstance(last, str):
        raise ValueError(f"compare_ranks(): {last}")
    return last


def _model_of_last_run(x):
    """{model: frame} of the last `%run` of N ranks: the one model's frame, or the model `x`
    names; a frame, path or Inspector as it is."""
    import os

    if isinstance(x, dict):
        if len(x) == 1:
            return next(iter(x.values()))
        raise ValueError(f"compare_ranks(): the last `%run` of ranks recorded {len(x)} models "
                         f"({', '.join(x)}): name one, e.g. compare_ranks({next(iter(x))!r}).")
    if isinstance(x, str) and not os.path.exists(x) and not any(c in x for c in "*?[/"):
        from ...job import LAST_RANKS_RUN

        last = LAST_RANKS_RUN.records
        if isinstance(last, dict) and x in last:
            return last[x]
        if isinstance(last, dict):
            raise ValueError(f"compare_ranks({x!r}): no such file, and the last `%run` of "
                             f"ranks recorded {', '.join(last)}, not {x!r}.")
    return x


def compare(a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3,
            atol: float = 1e-6) -> Comparison:
    """Align two runs tensor by tensor and find where they first differ.

    a, b: an Inspector, a frame from insp.frame() (or scn.load()), or a path / glob of saved
        records. `first` follows a's execution order.
    stats: statistic columns compared. A tensor diverges when, for one of them,
        |a - b| > atol + rtol * max(|a|, |b|) (for the mean, the larger std counts as well).
        NaN on both sides agrees; NaN on one side diverges.
    rtol: where the runs differ in dtype (fp32 against bf16 autocast), at least 4 × the
        coarser dtype's epsilon (bfloat16: 0.03125, float16: 0.0039): rounding at every layer
        is not a divergence. `cmp.rtol` is the one used; `cmp.dtype_change` says where the
        dtypes first differ.
    """
    return compare_frames(as_frame(a), as_frame(b), stats, rtol, atol)


# --- ranks of one job ---------------------------------------------------------------------------


class RankComparison:
    """Every rank of a job against the lowest rank, on what DDP keeps identical.

    first: the earliest `Divergence` (its `rank` says which rank differs), or None. ranks: the
    ranks that differ from the reference rank. pairs: rank -> its `Comparison`. odd: the one
    rank that parts from all the others, by majority (the reference itself when the rest agree
    among themselves), or None: two ranks, where no majority can say which is wrong, or no
    single rank parts from the rest.
    """

    def __init__(self, frame, stats, rtol: float, atol: float, inputs: bool | str):
        if inputs not in (True, False, "auto"):
            raise ValueError(f"inputs must be True, False or 'auto'; got {inputs!r}")
        self.stats = check_stats(stats, rtol, atol, frame)
        if not len(frame):
            raise ValueError("compare_ranks(): these records hold no rows, so no rank has "
                             "anything to compare (record with scn.inspect(model, params=True) "
                             "on every rank, or load every rank's file)")
        self.rtol, self.atol = rtol, atol
        self.all_ranks = ranks_of(frame)
        self.reference = self.all_ranks[0]
        self.pairs: dict[int, Comparison] = {}
        self.notes: list[str] = []
        if "rank" not in frame.columns:
            frame = frame.assign(rank=0)
        frame, renumbered = by_optimizer_steps(frame, self.reference, STATE_IO)
        if renumbered:
            self.notes.append(renumbered)
        reference = frame[frame["rank"] == self.reference]
        if len(self.all_ranks) < 2:
            self.notes.append(f"records of one rank only (rank {self.reference}): nothing to "
                              "compare across ranks. In a job, pass the Inspector on every rank "
                              "or load every rank's file.")
        if len(self.all_ranks) > 1 and not reference["io"].isin(STATE_IO).any():
            self.notes.append("no 'param' / 'step_grad' rows: record with scn.inspect(model, "
                              "params=True) to compare the parameters after each optimiser step "
                              "and the gradients it used")
        for rank in self.all_ranks[1:]:
            other = frame[frame["rank"] == rank]
            ref_rows, other_rows = self._expected_equal(reference, other, rank, inputs)
            self.pairs[rank] = compare_frames(ref_rows, other_rows, self.stats, rtol, atol,
                                              labels=(f"rank {self.reference}", f"rank {rank}"))
        self.ranks = [r for r, c in self.pairs.items() if c.first is not None]
        self.first = None
        if self.ranks:
            rank = min(self.ranks, key=lambda r: (self.pairs[r]._first_order, r))
            self.first = dataclasses.replace(self.pairs[rank].first, rank=rank)
        self.odd = self._odd_one(frame, inputs)

    def _odd_one(self, frame, inputs: bool | str) -> int | None:
        """The one rank that parts from all the others (None: no such one, or two ranks,
        where either could be it). Every rank but the reference differing from it, while those
        agree among themselves, makes the reference the odd one."""
        others = self.all_ranks[1:]
        if len(self.all_ranks) < 3 or not self.ranks:
            return None
        if len(self.ranks) == 1:
            return self.ranks[0]
        if set(self.ranks) != set(others):
            return None
        notes, self.notes = self.notes, []  # said once already, for the reference's pairs
        try:
            second = frame[frame["rank"] == others[0]]
            for rank in others[1:]:
                a, b = self._expected_equal(second, frame[frame["rank"] == rank], rank, inputs)
                if compare_frames(a, b, self.stats, self.rtol, self.atol).first is not None:
                    return None
        finally:
            self.notes = notes
        return self.reference

    def _expected_equal(self, reference, other, rank: int, inputs: bool | str):
        """The rows DDP keeps equal: state rows always; the rest of a step when the model's
        inputs should match (inputs=True) or do match there (inputs="auto")."""
        state_ref = reference["io"].isin(STATE_IO)
        state_other = other["io"].isin(STATE_IO)
        if inputs is False:
            return reference[state_ref], other[state_other]
        if inputs is True:
            return reference, other
        root = compare_frames(_root_inputs(reference), _root_inputs(other), self.stats,
                              self.rtol, self.atol)
        rows = root.frame()
        bad = set(rows.loc[rows["diverged"] | (rows["status"] != COMPARED), "step"])
        same = set(rows["step"]) - bad
        if bad or not len(rows):
            reason = ("no root input rows were recorded (inspect(..., inputs=False))"
                      if not len(rows) else
                      f"the model's inputs differ at {len(bad)} of {len(rows['step'].unique())} "
                      "steps (each rank reads its own data)")
            self.notes.append(f"rank {rank}: {reason}, so only rows DDP keeps equal are compared "
                              "there: parameters after the optimiser step and the gradients it "
                              "used. Pass inputs=True if the inputs should match.")
        return (reference[state_ref | reference["step"].isin(same)],
                other[state_other | other["step"].isin(same)])

    def frame(self):
        """Every compared rank's aligned rows (see Comparison.frame), one after another."""
        import pandas as pd

        frames = [c.frame() for c in self.pairs.values()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def plot(self, stat: str | None = None):
        """The divergence plot of the rank that differs first (else the first pair)."""
        if not self.pairs:
            from ..views import figures

            return figures.message_figure("one rank only: nothing to compare across ranks")
        rank = self.first.rank if self.first is not None else next(iter(self.pairs))
        return self.pairs[rank].plot(stat)

    caveat: str | None = None  # said first: the ranks never formed a process group

    def _headline(self) -> str:
        headline = self._verdict()
        return f"{self.caveat[0].upper()}{self.caveat[1:]} {headline}" if self.caveat else headline

    def _verdict(self) -> str:
        if not self.pairs:
            return "one rank only: nothing to compare"
        if self.first is None and not any(c.counts[COMPARED] for c in self.pairs.values()):
            return (f"nothing compared across the {len(self.all_ranks)} ranks: no row of rank "
                    f"{self.reference} has its counterpart on another rank (record with "
                    "params=True, the rows DDP keeps equal, on every rank)")
        if self.first is None:
            return (f"all {len(self.all_ranks)} ranks agree with rank {self.reference} within "
                    f"rtol={self.rtol:g}, atol={self.atol:g}")
        first = dataclasses.replace(self.first, rank=None)
        if len(self.all_ranks) == 2:
            a, b = self.all_ranks
            return (f"rank {a} and rank {b} differ (two ranks: no majority says which one is "
                    f"wrong); first divergence: {first}")
        if self.odd is not None:
            rest = [r for r in self.all_ranks if r != self.odd]
            return (f"rank {self.odd} is the odd one (ranks {', '.join(map(str, rest))} agree "
                    f"with each other); first divergence, between rank {self.reference} and rank "
                    f"{self.first.rank}: {first}")
        others = ", ".join(str(r) for r in self.ranks)
        who = f"ranks {others} differ" if len(self.ranks) > 1 else f"rank {others} differs"
        return (f"{who} from rank {self.reference} (no one rank parts from all the others); "
                f"first divergence, on rank {self.first.rank}: {first}")

    def _repr_html_(self) -> str:
        parts = [f"<div class='singlecard-compare-ranks {theme.NO_MATH_CLASSES}'><p><b>"
                 f"{html.escape(self._headline())}</b></p>"]
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
                         + "</ul>")
        for rank in self.ranks or list(self.pairs)[:1]:
            parts.append(f"<p>rank {rank} against rank {self.reference}:</p>")
            parts.append(self.pairs[rank]._repr_html_())
        return theme.no_math("".join(parts) + "</div>")

    def __repr__(self) -> str:
        lines = [self._headline()] + [f"- {n}" for n in self.notes]
        for rank in self.ranks:
            lines += [f"rank {rank} against rank {self.reference}:", repr(self.pairs[rank])]
        return "\n".join(lines)


def _root_inputs(frame):
    return frame[(frame["module"] == "") & (frame["io"] == "input")]


def compare_ranks(x=None, stats=("mean", "std", "absmax"), rtol: float = 1e-6,
                  atol: float = 0.0, inputs: bool | str = "auto") -> RankComparison:
    """Which ranks of a job differ where DDP keeps them identical?

    x: an Inspector (in a job, a collective: every rank gathers all ranks' rows and gets the
        same answer), a frame with several ranks, or a path / glob of saved records; none: the
        ranks of the last `%run` under `%singlecard cpu --ranks N` (docs/ranks.md), or the
        name of one of its models (`"Generator"`) when it recorded several.
    rtol, atol: tighter than compare()'s. DDP gives every rank the same all-reduced gradient and
        the same arithmetic, so its parameters agree bit for bit; 1e-6 leaves room only for
        nondeterministic GPU kernels, and finds a 0.1% update one rank made on its own.
    Compared: parameters after each optimiser step and the gradients it used (recorded with
    inspect(..., params=True)); with inputs=True, or "auto" where the model's inputs match
    across ranks at a step, everything recorded in that step too (a dropout seed that differs
    shows at the Dropout's output).
    """
    import pandas as pd

    from ...job import LAST_RANKS_RUN

    given = x
    x = _model_of_last_run(_last_ranks_run() if x is None else x)
    caveat = LAST_RANKS_RUN.note if given is None or x is not given else None
    if not isinstance(x, pd.DataFrame) and callable(getattr(x, "frame", None)):
        frame = x.frame(ranks="all")
    else:
        frame = as_frame(x)
    if not len(frame):
        raise ValueError("compare_ranks(): these records hold no rows (no step was recorded), "
                         "so there is nothing to compare across ranks; inspect the model with "
                         "params=True and run a step first.")
    comparison = RankComparison(frame, stats, rtol, atol, inputs)
    comparison.caveat = caveat
    return comparison
