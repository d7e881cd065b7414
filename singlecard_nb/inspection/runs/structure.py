"""What differs in structure between two aligned runs, in words: steps, modules and tensors only
one run has, shapes, training mode and dtypes (the first place each differs, in run a's order).
"""

from __future__ import annotations

from .alignment import (
    COMPARED,
    ONLY_IN_A,
    ONLY_IN_B,
    PER_RANK_GRADIENT,
    PRECISION_FACTOR,
    SHAPE_DIFFERS,
    Alignment,
)

_IO_OPTION = {"grad": "grads=True", "param_grad": "grads=True", "param": "params=True",
              "step_grad": "params=True", "buffer": "params=True"}


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
