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
frame later does not change the comparison.
"""

from __future__ import annotations

import dataclasses
import html
import math
import os
from typing import Any

KEYS = ("step", "module", "call", "io", "index")
# What DDP keeps identical on every rank: parameters after each optimiser step and the gradients
# the step used (after the all-reduce). Recorded by inspect(model, params=True).
STATE_IO = ("param", "step_grad")
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


def as_frame(x: Any):
    """A frame of records from an Inspector, a DataFrame, or a path/glob given to `load`."""
    import pandas as pd

    if isinstance(x, pd.DataFrame):
        return x
    if isinstance(x, (str, os.PathLike, list, tuple)):
        from .records import load

        return load(x)
    if callable(getattr(x, "frame", None)):
        return x.frame()
    raise TypeError(f"compare() takes an Inspector, a DataFrame of records or a path to saved "
                    f"records; got {type(x).__name__}")


def _check(stats, rtol: float, atol: float, *frames) -> tuple[str, ...]:
    import pandas as pd

    stats = (stats,) if isinstance(stats, str) else tuple(stats)
    if not stats:
        raise ValueError("stats must name at least one statistic column, e.g. ('mean', 'absmax')")
    for frame in frames:
        missing = [k for k in KEYS if k not in frame.columns]
        if missing:
            raise ValueError(f"records without the columns {missing}: give insp.frame(), an "
                             "Inspector or a path to saved records")
        for stat in stats:
            if stat not in frame.columns or not pd.api.types.is_numeric_dtype(frame[stat]):
                numeric = [c for c in frame.columns if c not in KEYS and c != "rank"
                           and pd.api.types.is_numeric_dtype(frame[c])]
                raise ValueError(f"stat {stat!r} is not a statistic column of these records; "
                                 f"accepted: {', '.join(numeric)}")
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"rtol and atol must be non-negative numbers; got rtol={rtol!r}, "
                         f"atol={atol!r}")
    return stats


def _ranks(frame) -> list[int]:
    return sorted(int(r) for r in frame["rank"].unique()) if "rank" in frame.columns else [0]


def _prepared(frame, keys: list[str], columns: list[str]):
    """The columns needed, with each row's place in execution order and occurrence of its key."""
    import numpy as np

    f = frame.reset_index(drop=True)
    rank = f["rank"] if "rank" in f.columns else np.zeros(len(f), dtype=int)
    out = f[[c for c in dict.fromkeys(keys + columns) if c in f.columns]].copy()
    out["_rank"] = np.asarray(rank)
    out["_pos"] = f.groupby([f["step"], out["_rank"]], sort=False).cumcount().to_numpy()
    # the same key twice in one rank (frames joined from two runs): align in order, not crosswise
    out["_occ"] = out.groupby(keys + ["_rank"], sort=False, dropna=False).cumcount().to_numpy()
    return out


def _values(series):
    import numpy as np
    import pandas as pd

    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _differences(merged, stats, rtol: float, atol: float, scale_by_std: bool):
    """Per stat: relative difference and whether it exceeds atol + rtol * scale.

    The scale of a statistic is the larger magnitude of the two sides. A mean is also measured
    against the tensors' spread (std): a mean of 1e-4 over values of size 1 moving to 2e-4 is
    rounding, not a divergence.
    """
    import numpy as np

    rel, over = {}, {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in stats:
            a, b = _values(merged[f"{stat}_a"]), _values(merged[f"{stat}_b"])
            scale = np.fmax(np.abs(a), np.abs(b))
            if stat == "mean" and scale_by_std:
                spread = np.fmax(_values(merged["std_a"]), _values(merged["std_b"]))
                scale = np.fmax(scale, np.nan_to_num(spread, nan=0.0, posinf=0.0))
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            diff = np.abs(a - b)
            rel[stat] = np.where(same, 0.0, np.where(np.isfinite(diff), diff / scale, np.inf))
            over[stat] = ~same & ~(diff <= atol + rtol * scale)
    return rel, over


class Comparison:
    """Two runs aligned tensor by tensor; renders with the first divergence on top.

    first: the first `Divergence` in run a's execution order, or None when every aligned tensor
    agrees within tolerance. notes: structural differences in words (steps, modules, tensors only
    one run has; shape and dtype differences).
    """

    def __init__(self, a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3,
                 atol: float = 1e-6, labels: tuple[str, str] = ("a", "b")):
        self.stats = _check(stats, rtol, atol, a, b)
        self.rtol, self.atol, self.labels = rtol, atol, labels
        self.ranks_a, self.ranks_b = _ranks(a), _ranks(b)
        self._frame = self._align(a, b)
        self.notes = self._notes(a, b)
        diverged = self._frame[self._frame["diverged"]]
        self.first = self._divergence(diverged.iloc[0]) if len(diverged) else None
        self._first_order = (None if self.first is None else
                             (int(diverged["step"].iloc[0]), int(diverged["_pos"].iloc[0])))

    # --- building -----------------------------------------------------------------------------
    def _align(self, a, b):
        import numpy as np
        import pandas as pd

        keys = list(KEYS)
        self.by_rank = self.ranks_a == self.ranks_b and len(self.ranks_a) > 1
        if self.by_rank:
            keys.append("rank")
        scale_by_std = "mean" in self.stats and "std" in a.columns and "std" in b.columns
        values = list(dict.fromkeys(self.stats + (("std",) if scale_by_std else ())))
        described = [c for c in ("type", "shape", "dtype") if c in a.columns and c in b.columns]
        left = _prepared(a, keys, values + described)
        right = _prepared(b, keys, values + described)
        merged = left.merge(right, on=keys + ["_occ"], how="outer", suffixes=("_a", "_b"),
                            indicator=True, sort=False)
        both = (merged["_merge"] == "both").to_numpy()
        status = np.where(both, "compared",
                          np.where(merged["_merge"] == "left_only", "only in a", "only in b"))
        if "shape" in described:
            reshaped = both & np.array([sa != sb for sa, sb in
                                        zip(merged["shape_a"], merged["shape_b"])], dtype=bool)
            status = np.where(reshaped, "shape differs", status)
        if not self.by_rank and max(len(self.ranks_a), len(self.ranks_b)) > 1:
            # a job against another world size: each rank's param_grad is its own gradient
            # before DDP's all-reduce, a part of what the other side computed
            partial = (status == "compared") & (merged["io"] == "param_grad").to_numpy()
            status = np.where(partial, "per-rank gradient", status)
        compared = status == "compared"
        rel, over = _differences(merged, self.stats, self.rtol, self.atol, scale_by_std)

        out = merged[keys].copy()
        if not self.by_rank and self.ranks_a != self.ranks_b:  # which rank met which
            out["rank_a"] = merged["_rank_a"].astype("Int64")
            out["rank_b"] = merged["_rank_b"].astype("Int64")
        if "type" in described:
            out["type"] = merged["type_a"].where(merged["type_a"].notna(), merged["type_b"])
        out["status"] = status
        table = np.column_stack([rel[s] for s in self.stats])
        table[~compared] = np.nan
        exceeded = np.column_stack([over[s] for s in self.stats]) & compared[:, None]
        out["diverged"] = exceeded.any(axis=1)
        # the statistic reported: the worst one that exceeds tolerance, else the worst overall
        ranked = np.where(exceeded, table, -1.0)
        ranked = np.where(exceeded.any(axis=1)[:, None], ranked, np.nan_to_num(table, nan=-2.0))
        worst = ranked.argmax(axis=1)
        out["stat"] = np.where(compared, np.asarray(self.stats, dtype=object)[worst], None)
        out["rel"] = np.where(compared, table[np.arange(len(out)), worst], np.nan)
        for i, stat in enumerate(self.stats):
            out[f"{stat}_a"] = _values(merged[f"{stat}_a"])
            out[f"{stat}_b"] = _values(merged[f"{stat}_b"])
            out[f"{stat}_rel"] = table[:, i]
        for column in ("shape", "dtype"):
            if column in described:
                out[f"{column}_a"], out[f"{column}_b"] = merged[f"{column}_a"], merged[f"{column}_b"]
        notes = [[] for _ in range(len(out))]
        for column in ("type", "dtype"):
            if column in described:
                for i in np.flatnonzero(both & (merged[f"{column}_a"] != merged[f"{column}_b"])
                                        .fillna(False).to_numpy(dtype=bool)):
                    notes[i].append(f"{column} {merged[f'{column}_a'].iloc[i]} vs "
                                    f"{merged[f'{column}_b'].iloc[i]}")
        out["note"] = ["; ".join(n) for n in notes]
        # a's execution order first (step, place within the step, rank); b's extra rows after
        in_a = merged["_merge"] != "right_only"
        out["_pos"] = np.where(in_a, merged["_pos_a"], merged["_pos_b"]).astype(int)
        order = pd.DataFrame({
            "side": np.where(in_a, 0, 1), "step": out["step"].to_numpy(), "pos": out["_pos"],
            "rank": np.where(in_a, merged["_rank_a"], merged["_rank_b"]).astype(int)})
        out = out.iloc[order.sort_values(["side", "step", "pos", "rank"], kind="stable").index]
        return out.reset_index(drop=True)

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

    def _notes(self, a, b) -> list[str]:
        """What only one run has, and what has another shape or dtype, in words."""
        la, lb = self.labels
        notes = []
        if not self.by_rank and (len(self.ranks_a) > 1 or len(self.ranks_b) > 1):
            notes.append(f"{la} holds ranks {self.ranks_a} and {lb} {self.ranks_b}: every rank "
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
        frame = self._frame
        common = (frame["step"].isin(steps[la] & steps[lb])
                  & frame["module"].isin(modules[la] & modules[lb])
                  & frame["io"].isin(kinds[la] & kinds[lb]))
        for status, side in (("only in a", la), ("only in b", lb)):
            rows = frame[common & (frame["status"] == status)]
            if len(rows):
                notes.append(f"{len(rows)} more tensors only in {side} (first: "
                             f"{_where(rows.iloc[0])}): another call count or output structure")
        partial = frame[frame["status"] == "per-rank gradient"]
        if len(partial):
            notes.append(f"{len(partial)} param_grad tensors not compared: in a job they are each "
                         "rank's gradient before DDP's all-reduce. The gradient the optimiser "
                         "used is in the step_grad rows (inspect(..., params=True)).")
        reshaped = frame[frame["status"] == "shape differs"]
        if len(reshaped):
            row = reshaped.iloc[0]
            notes.append(f"shape differs in {len(reshaped)} tensors, not compared (first: "
                         f"{_where(row)}: {row['shape_a']} vs {row['shape_b']})")
        if "dtype_a" in frame.columns:
            retyped = frame[(frame["status"] == "compared")
                            & (frame["dtype_a"] != frame["dtype_b"])]
            if len(retyped):
                row = retyped.iloc[0]
                notes.append(f"dtype differs in {len(retyped)} tensors, values compared (first: "
                             f"{_where(row)}: {row['dtype_a']} vs {row['dtype_b']})")
        return notes

    # --- results ------------------------------------------------------------------------------
    def frame(self):
        """One row per aligned tensor (and per tensor only one side has), in execution order:
        both sides' statistics (`<stat>_a`, `<stat>_b`), relative differences (`<stat>_rel`;
        `rel` and `stat`: the worst), `diverged`, and `status`: compared, shape differs, only in
        a, only in b."""
        return self._frame.drop(columns=["_pos"])

    @property
    def counts(self) -> dict[str, int]:
        status = self._frame["status"]
        return {"compared": int((status == "compared").sum()),
                "diverged": int(self._frame["diverged"].sum()),
                "only in a": int((status == "only in a").sum()),
                "only in b": int((status == "only in b").sum()),
                "shape differs": int((status == "shape differs").sum())}

    def plot(self, stat: str | None = None):
        """Largest relative difference per module, modules in execution order (a Figure)."""
        if stat is not None and stat not in self.stats:
            raise ValueError(f"stat must be one of {', '.join(self.stats)}; got {stat!r}")
        return _divergence_plot(self._frame, stat, self.rtol, self.first, self.labels)

    def _headline(self) -> str:
        la, lb = self.labels
        counts = self.counts
        if counts["compared"] == 0:
            return f"nothing to compare: {la} and {lb} have no tensor in common"
        if self.first is None:
            return (f"{la} and {lb} agree within rtol={self.rtol:g}, atol={self.atol:g} on all "
                    f"{counts['compared']} aligned tensors ({', '.join(self.stats)})")
        return f"first divergence: {self.first}"

    def _summary(self) -> str:
        c = self.counts
        return (f"{c['compared']} tensors compared on {', '.join(self.stats)} (rtol={self.rtol:g}, "
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
        from .summary import html_table

        parts = [f"<div class='singlecard-compare'><p><b>{html.escape(self._headline())}</b></p>",
                 f"<p>{html.escape(self._summary())}</p>"]
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
                         + "</ul>")
        rows = self._diverged_rows()
        if len(rows):
            more = self.counts["diverged"] - len(rows)
            highlight = rows.index == rows.index[0]
            import pandas as pd

            parts.append(html_table(rows, bad=pd.Series(highlight)))
            if more > 0:
                parts.append(f"<p>… {more} more diverged tensors in cmp.frame()</p>")
        return "".join(parts) + "</div>"

    def __repr__(self) -> str:
        lines = [self._headline(), self._summary()] + [f"- {n}" for n in self.notes]
        rows = self._diverged_rows()
        if len(rows):
            lines.append(rows.to_string(index=False))
        return "\n".join(lines)


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


def compare(a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3,
            atol: float = 1e-6) -> Comparison:
    """Align two runs tensor by tensor and find where they first differ.

    a, b: an Inspector, a frame from insp.frame() (or scn.load()), or a path / glob of saved
        records. `first` follows a's execution order.
    stats: statistic columns compared. A tensor diverges when, for one of them,
        |a - b| > atol + rtol * max(|a|, |b|) (for the mean, the larger std counts as well).
        NaN on both sides agrees; NaN on one side diverges.
    """
    fa, fb = as_frame(a), as_frame(b)
    return Comparison(fa, fb, stats, rtol, atol)


# --- ranks of one job ---------------------------------------------------------------------------
class RankComparison:
    """Every rank of a job against the lowest rank, on what DDP keeps identical.

    first: the earliest `Divergence` (its `rank` says which rank differs), or None. ranks: the
    ranks that differ from the reference rank. pairs: rank -> its `Comparison`.
    """

    def __init__(self, frame, stats, rtol: float, atol: float, inputs: bool | str):
        if inputs not in (True, False, "auto"):
            raise ValueError(f"inputs must be True, False or 'auto'; got {inputs!r}")
        self.stats = _check(stats, rtol, atol, frame)
        self.rtol, self.atol = rtol, atol
        self.all_ranks = _ranks(frame)
        self.reference = self.all_ranks[0]
        self.pairs: dict[int, Comparison] = {}
        self.notes: list[str] = []
        if "rank" not in frame.columns:
            frame = frame.assign(rank=0)
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
            self.pairs[rank] = Comparison(ref_rows, other_rows, self.stats, rtol, atol,
                                          labels=(f"rank {self.reference}", f"rank {rank}"))
        self.ranks = [r for r, c in self.pairs.items() if c.first is not None]
        self.first = None
        if self.ranks:
            rank = min(self.ranks, key=lambda r: (self.pairs[r]._first_order, r))
            self.first = dataclasses.replace(self.pairs[rank].first, rank=rank)

    def _expected_equal(self, reference, other, rank: int, inputs: bool | str):
        """The rows DDP keeps equal: state rows always; the rest of a step when the model's
        inputs should match (inputs=True) or do match there (inputs="auto")."""
        state_ref = reference["io"].isin(STATE_IO)
        state_other = other["io"].isin(STATE_IO)
        if inputs is False:
            return reference[state_ref], other[state_other]
        if inputs is True:
            return reference, other
        root = Comparison(_root_inputs(reference), _root_inputs(other), self.stats, self.rtol,
                          self.atol)
        rows = root.frame()
        bad = set(rows.loc[rows["diverged"] | (rows["status"] != "compared"), "step"])
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
            return _message_figure("one rank only: nothing to compare across ranks")
        rank = self.first.rank if self.first is not None else next(iter(self.pairs))
        return self.pairs[rank].plot(stat)

    def _headline(self) -> str:
        if not self.pairs:
            return "one rank only: nothing to compare"
        if self.first is None:
            return (f"all {len(self.all_ranks)} ranks agree with rank {self.reference} within "
                    f"rtol={self.rtol:g}, atol={self.atol:g}")
        others = ", ".join(str(r) for r in self.ranks)
        who = f"ranks {others} differ" if len(self.ranks) > 1 else f"rank {others} differs"
        first = dataclasses.replace(self.first, rank=None)
        return (f"{who} from rank {self.reference}; first divergence, on rank "
                f"{self.first.rank}: {first}")

    def _repr_html_(self) -> str:
        parts = [f"<div class='singlecard-compare-ranks'><p><b>{html.escape(self._headline())}"
                 "</b></p>"]
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
                         + "</ul>")
        for rank in self.ranks or list(self.pairs)[:1]:
            parts.append(f"<p>rank {rank} against rank {self.reference}:</p>")
            parts.append(self.pairs[rank]._repr_html_())
        return "".join(parts) + "</div>"

    def __repr__(self) -> str:
        lines = [self._headline()] + [f"- {n}" for n in self.notes]
        for rank in self.ranks:
            lines += [f"rank {rank} against rank {self.reference}:", repr(self.pairs[rank])]
        return "\n".join(lines)


def _root_inputs(frame):
    return frame[(frame["module"] == "") & (frame["io"] == "input")]


def compare_ranks(x, stats=("mean", "std", "absmax"), rtol: float = 1e-6, atol: float = 0.0,
                  inputs: bool | str = "auto") -> RankComparison:
    """Which ranks of a job differ where DDP keeps them identical?

    x: an Inspector (in a job, a collective: every rank gathers all ranks' rows and gets the
        same answer), a frame with several ranks, or a path / glob of saved records.
    rtol, atol: tighter than compare()'s. DDP gives every rank the same all-reduced gradient and
        the same arithmetic, so its parameters agree bit for bit; 1e-6 leaves room only for
        nondeterministic GPU kernels, and finds a 0.1% update one rank made on its own.
    Compared: parameters after each optimiser step and the gradients it used (recorded with
    inspect(..., params=True)); with inputs=True, or "auto" where the model's inputs match
    across ranks at a step, everything recorded in that step too (a dropout seed that differs
    shows at the Dropout's output).
    """
    import pandas as pd

    if not isinstance(x, pd.DataFrame) and callable(getattr(x, "frame", None)):
        frame = x.frame(ranks="all")
    else:
        frame = as_frame(x)
    return RankComparison(frame, stats, rtol, atol, inputs)


# --- the picture ------------------------------------------------------------------------------
_IO_STYLE = {"output": ("#1f77b4", "o"), "input": ("#7f7f7f", "s"), "grad": ("#ff7f0e", "v"),
             "param_grad": ("#2ca02c", "^"), "param": ("#9467bd", "D"),
             "step_grad": ("#8c564b", "P"), "buffer": ("#e377c2", "X")}


def _figure(width: float, height: float):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    plt.close(fig)  # returned to the caller and shown once, as the cell's value
    return fig, ax


def _message_figure(message: str):
    fig, ax = _figure(6, 1.5)
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=10, color="#555")
    return fig


def _divergence_plot(frame, stat: str | None, rtol: float, first: Divergence | None,
                     labels: tuple[str, str]):
    """Largest relative difference per module and io kind over all steps, modules on the x axis
    in the order they first ran in run a; the tolerance as a line, the first divergence marked."""
    import numpy as np

    compared = frame[frame["status"] == "compared"]
    if compared.empty:
        return _message_figure("no tensor recorded by both runs: nothing to plot")
    column = "rel" if stat is None else f"{stat}_rel"
    modules = list(dict.fromkeys(frame["module"]))
    place = {m: i for i, m in enumerate(modules)}
    finite = compared[column].replace(np.inf, np.nan)
    floor = max(min(float(finite[finite > 0].min()) if (finite > 0).any() else rtol, rtol) / 10,
                1e-12)
    ceiling = max(float(finite.max()) if finite.notna().any() else rtol, rtol) * 10
    fig, ax = _figure(min(4 + 0.3 * len(modules), 14), 3.6)
    for io, rows in compared.groupby("io", sort=False):
        worst = rows.groupby("module", sort=False)[column].max()
        x = [place[m] for m in worst.index]
        y = np.clip(np.nan_to_num(worst.to_numpy(dtype=float), nan=0.0, posinf=ceiling),
                    floor, ceiling)
        colour, marker = _IO_STYLE.get(io, ("#17becf", "x"))
        ax.plot(x, y, linestyle="none", marker=marker, color=colour, label=io, alpha=0.85)
    ax.axhline(rtol, color="#d62728", linestyle="--", linewidth=1, label=f"rtol {rtol:g}")
    ax.axhline(floor, color="#bbbbbb", linewidth=0.8)
    ax.annotate("equal", (1, floor), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                textcoords="offset points", ha="right", fontsize=7, color="#888888")
    if first is not None and first.module in place and (stat is None or stat == first.stat):
        value = min(max(first.rel if math.isfinite(first.rel) else ceiling, floor), ceiling)
        ax.annotate(f"first: step {first.step} {first.io}", (place[first.module], value),
                    xytext=(8, 8), textcoords="offset points", fontsize=8, color="#d62728",
                    arrowprops={"arrowstyle": "->", "color": "#d62728"})
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, ceiling)  # equal values sit on the floor, fully visible
    step = max(1, len(modules) // 40)
    ax.set_xticks(range(0, len(modules), step))
    ax.set_xticklabels([m or "(root)" for m in modules[::step]], rotation=60, ha="right",
                       fontsize=7)
    ax.set_xlabel("module, in execution order")
    ax.set_ylabel(f"largest relative difference ({stat or 'worst statistic'})")
    ax.set_title(f"{labels[0]} vs {labels[1]}: divergence per module", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # never over a point
    return fig
