"""The rows of two runs matched tensor by tensor, with their differences: the table `compare` reads.

Rows align on (step, module, call, io, index), and on rank when both sides hold the same ranks;
the same key twice in one rank aligns in order. Each aligned row gets a status (`STATUSES`),
the relative difference per statistic and whether one exceeds tolerance. The table is sorted in
run a's execution order: steps by number, and within a step the order a recorded its rows; rows
only b has come last.
"""

from __future__ import annotations

import dataclasses
from typing import Any

KEYS = ("step", "module", "call", "io", "index")

# The status of an aligned row (the frame's `status` column; the words users filter on)
COMPARED = "compared"  # both runs recorded it: its statistics are compared
SHAPE_DIFFERS = "shape differs"  # both recorded it, with other shapes: not compared
ONLY_IN_A = "only in a"
ONLY_IN_B = "only in b"
# A job against another world size: each rank's param_grad is its own gradient before DDP's
# all-reduce, a part of what the other side computed: not compared
PER_RANK_GRADIENT = "per-rank gradient"
STATUSES = (COMPARED, SHAPE_DIFFERS, ONLY_IN_A, ONLY_IN_B, PER_RANK_GRADIENT)

# The spacing of floating-point numbers near 1 (machine epsilon) by the frame's dtype names.
# Runs in other dtypes (fp32 against bf16 autocast) differ by rounding at every layer: their
# values are compared with rtol at least PRECISION_FACTOR × the coarser dtype's epsilon.
EPSILON = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "tfloat32": 2.0 ** -10,
           "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float8_e4m3fn": 2.0 ** -3,
           "float8_e4m3fnuz": 2.0 ** -3, "float8_e5m2": 2.0 ** -2, "float8_e5m2fnuz": 2.0 ** -2}
PRECISION_FACTOR = 4  # measured: a 12-layer GPT, fp32 vs bf16, stays within 1.1 × eps


@dataclasses.dataclass(frozen=True)
class Alignment:
    """Two runs aligned: `table` (one row per aligned tensor, in a's execution order; see
    `Comparison.frame`, plus `_pos`, the row's place within its step) and how it was made."""

    table: Any  # pandas DataFrame
    stats: tuple[str, ...]
    rtol: float
    atol: float
    ranks_a: list[int]
    ranks_b: list[int]
    by_rank: bool  # both sides hold the same ranks (more than one): rows align rank by rank
    rtol_given: float | None = None  # the rtol asked for, where a coarser dtype raised `rtol`
    coarse_dtype: str | None = None  # the least precise dtype of the rows whose dtypes differ


def check_stats(stats, rtol: float, atol: float, *frames) -> tuple[str, ...]:
    """`stats` as a tuple, once each frame has the alignment keys and those statistic columns."""
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


def ranks_of(frame) -> list[int]:
    """The ranks a frame holds ([0] for a frame without a rank column)."""
    return sorted(int(r) for r in frame["rank"].unique()) if "rank" in frame.columns else [0]


def by_optimizer_steps(frame, reference: int, state_io: tuple[str, ...]):
    """The frame with every rank's steps numbered as the reference rank's, optimiser step by
    optimiser step, where the ranks recorded different steps; and a note saying so (None when
    they recorded the same steps, and the frame is returned as it is).

    Ranks of a DDP job step their optimisers together, but forward passes made outside the
    training step (nanoGPT evaluates on rank 0 only) number the steps differently on each
    rank; matched by number, the k-th training step of one rank met another's (k+5)-th. Steps
    without an optimiser step have no counterpart then, and are left out.
    """
    import pandas as pd

    state = frame[frame["io"].isin(state_io)]
    steps = {int(r): sorted(set(g["step"])) for r, g in state.groupby("rank")}
    ours = steps.get(reference)
    if not ours or len(steps) < 2 or all(s == ours for s in steps.values()):
        return frame, None
    parts, left = [], []
    for rank, rows in frame.groupby("rank"):
        mine = steps.get(int(rank), [])
        number = dict(zip(mine, ours))
        kept = rows[rows["step"].isin(number)]
        parts.append(kept.assign(step=kept["step"].map(number)))
        total = rows["step"].nunique()
        left.append(f"rank {rank}: {len(mine)} of {total}")
    note = ("the ranks recorded different steps (with an optimiser step / in all: "
            + ", ".join(left) + "): forward passes one rank made alone, as an evaluation on "
            f"rank {reference} only. They are compared optimiser step by optimiser step, every "
            f"rank's numbered as rank {reference}'s; steps without one are left out.")
    return pd.concat(parts, ignore_index=True), note


def align(a, b, stats=("mean", "std", "absmax"), rtol: float = 1e-3,
          atol: float = 1e-6) -> Alignment:
    """Match the rows of frames `a` and `b` and measure each pair's differences."""
    import numpy as np
    import pandas as pd

    stats = check_stats(stats, rtol, atol, a, b)
    ranks_a, ranks_b = ranks_of(a), ranks_of(b)
    keys = list(KEYS)
    by_rank = ranks_a == ranks_b and len(ranks_a) > 1
    if by_rank:
        keys.append("rank")
    scale_by_std = "mean" in stats and "std" in a.columns and "std" in b.columns
    values = list(dict.fromkeys(stats + (("std",) if scale_by_std else ())))
    described = [c for c in ("type", "shape", "dtype", "training")
                 if c in a.columns and c in b.columns]
    left = _prepared(a, keys, values + described)
    right = _prepared(b, keys, values + described)
    merged = left.merge(right, on=keys + ["_occ"], how="outer", suffixes=("_a", "_b"),
                        indicator=True, sort=False)
    both = (merged["_merge"] == "both").to_numpy()
    status = np.where(both, COMPARED,
                      np.where(merged["_merge"] == "left_only", ONLY_IN_A, ONLY_IN_B))
    if "shape" in described:
        reshaped = both & np.array([sa != sb for sa, sb in
                                    zip(merged["shape_a"], merged["shape_b"])], dtype=bool)
        status = np.where(reshaped, SHAPE_DIFFERS, status)
    if not by_rank and max(len(ranks_a), len(ranks_b)) > 1:
        partial = (status == COMPARED) & (merged["io"] == "param_grad").to_numpy()
        status = np.where(partial, PER_RANK_GRADIENT, status)
    compared = status == COMPARED
    rtol_given, coarse = rtol, _coarse_dtype(merged, compared) if "dtype" in described else None
    if coarse is not None:
        rtol = max(rtol, PRECISION_FACTOR * EPSILON[coarse])
    rel, over = _differences(merged, stats, rtol, atol, scale_by_std)

    out = merged[keys].copy()
    if not by_rank and ranks_a != ranks_b:  # which rank met which
        out["rank_a"] = merged["_rank_a"].astype("Int64")
        out["rank_b"] = merged["_rank_b"].astype("Int64")
    if "type" in described:
        out["type"] = merged["type_a"].where(merged["type_a"].notna(), merged["type_b"])
    out["status"] = status
    table = np.column_stack([rel[s] for s in stats])
    table[~compared] = np.nan
    exceeded = np.column_stack([over[s] for s in stats]) & compared[:, None]
    out["diverged"] = exceeded.any(axis=1)
    # the statistic reported: the worst one that exceeds tolerance, else the worst overall
    ranked = np.where(exceeded, table, -1.0)
    ranked = np.where(exceeded.any(axis=1)[:, None], ranked, np.nan_to_num(table, nan=-2.0))
    worst = ranked.argmax(axis=1)
    out["stat"] = np.where(compared, np.asarray(stats, dtype=object)[worst], None)
    out["rel"] = np.where(compared, table[np.arange(len(out)), worst], np.nan)
    for i, stat in enumerate(stats):
        out[f"{stat}_a"] = _values(merged[f"{stat}_a"])
        out[f"{stat}_b"] = _values(merged[f"{stat}_b"])
        out[f"{stat}_rel"] = table[:, i]
    for column in ("shape", "dtype", "training"):
        if column in described:
            out[f"{column}_a"], out[f"{column}_b"] = merged[f"{column}_a"], merged[f"{column}_b"]
    out["note"] = _row_notes(merged, both, described)
    # a's execution order first (step, place within the step, rank); b's extra rows after
    in_a = merged["_merge"] != "right_only"
    out["_pos"] = np.where(in_a, merged["_pos_a"], merged["_pos_b"]).astype(int)
    order = pd.DataFrame({
        "side": np.where(in_a, 0, 1), "step": out["step"].to_numpy(), "pos": out["_pos"],
        "rank": np.where(in_a, merged["_rank_a"], merged["_rank_b"]).astype(int)})
    out = out.iloc[order.sort_values(["side", "step", "pos", "rank"], kind="stable").index]
    return Alignment(out.reset_index(drop=True), stats, rtol, atol, ranks_a, ranks_b, by_rank,
                     rtol_given if rtol != rtol_given else None, coarse)


def _coarse_dtype(merged, compared) -> str | None:
    """The least precise floating dtype on either side of the compared rows whose dtypes differ
    (None when the runs agree on every dtype, or the coarser one is no float we know)."""
    differ = compared & (merged["dtype_a"] != merged["dtype_b"]).fillna(False).to_numpy(dtype=bool)
    if not differ.any():
        return None
    names = set(merged["dtype_a"][differ]) | set(merged["dtype_b"][differ])
    known = [n for n in names if n in EPSILON]
    return max(known, key=EPSILON.__getitem__) if known else None


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


def _row_notes(merged, both, described: list[str]) -> list[str]:
    """Per row: the type and dtype the two sides disagree on, in words ("" when none)."""
    import numpy as np

    notes: list[list[str]] = [[] for _ in range(len(merged))]
    for column in ("type", "dtype", "training"):
        if column in described:
            for i in np.flatnonzero(both & (merged[f"{column}_a"] != merged[f"{column}_b"])
                                    .fillna(False).to_numpy(dtype=bool)):
                notes[i].append(f"{column} {merged[f'{column}_a'].iloc[i]} vs "
                                f"{merged[f'{column}_b'].iloc[i]}")
    return ["; ".join(n) for n in notes]
