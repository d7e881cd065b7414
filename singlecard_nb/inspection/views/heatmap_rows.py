"""Which rows the heatmap shows, as tables of series × step: per-parameter rows under their own
paths, repeats folded, the modules that changed most (`ranking.py`), and what each cell and
column is (NaN/Inf held, eval mode, the module's type), read from the frame's counts."""

from __future__ import annotations

from typing import Any

from . import ranking

# Rows of one tensor per parameter: drawn per "module.name", not per module
PER_PARAMETER = ("param", "param_grad", "step_grad", "update")
IOS = ("output", "input", "grad", *PER_PARAMETER)
_KIND = {"output": "output", "param": "param", "param_grad": "grad", "step_grad": "grad",
         "update": "param", "input": "input"}



def fold_repeats(table: Any, alike: list | tuple = ()) -> Any:
    """Drop a row equal at every step to an earlier row inside it or beside it (a container
    returning its child's output, an identity layer): one row per distinct series.

    alike: tables of other statistics (same modules and steps) that must be equal as well."""
    import numpy as np

    others = [t.reindex(index=table.index, columns=table.columns).to_numpy(dtype=float)
              for t in alike]
    keep, seen = [], {}
    for i, (module, row) in enumerate(zip(table.index, table.to_numpy(dtype=float))):
        series = np.concatenate([row, *(o[i] for o in others)])
        key = np.nan_to_num(series, nan=-7.77e-300).tobytes()
        earlier = seen.get(key, [])
        if any(inside_or_beside(e, str(module)) for e in earlier):
            continue
        earlier.append(str(module))
        seen[key] = earlier
        keep.append(module)
    return table.loc[keep]


def inside_or_beside(inner: str, outer: str) -> bool:
    if outer == "" or inner.startswith(outer + "."):
        return True
    return inner.rpartition(".")[0] == outer.rpartition(".")[0]


def most_changed(frame: Any, table: Any, io: str, top: int) -> list:
    """The `top` modules of `table` that changed most (the worst of each repeated group
    first), in the table's (execution) order."""
    wanted: list[str] = []
    if io in _KIND:
        rows = [r for r in ranking.rank(ranking.Tracks.from_frame(frame), fold=False)
                if r.kind == _KIND[io]]
        present = set(map(str, table.index))
        for row in rows:
            for member in (row.members or [row]):
                if member.path in present:
                    wanted.append(member.path)
                    break
        for row in ranking.flatten(rows):  # then the groups' other members, by rank
            if row.path in present and row.path not in wanted:
                wanted.append(row.path)
    wanted += [str(m) for m in table.index if str(m) not in wanted]
    chosen = set(wanted[:top])
    return [m for m in table.index if str(m) in chosen]



def eval_columns(frame: Any, steps: list) -> list[int]:
    """Column positions of the steps in which every recorded module was in eval mode."""
    if frame is None or frame.empty or "training" not in frame.columns:
        return []
    trained = frame.groupby("step")["training"].any()
    return [i for i, step in enumerate(steps) if step in trained.index and not trained[step]]


def module_types(frame: Any) -> dict[str, str]:
    if frame is None or frame.empty or "type" not in frame.columns:
        return {}
    return dict(zip(frame["module"], frame["type"]))


def nonfinite_cells(frame: Any, table: Any, io: str) -> Any:
    """Boolean array shaped like `table`: the module's `io` tensors held NaN/Inf in that step."""
    import numpy as np

    if frame is None or frame.empty or not {"nan", "inf"} <= set(frame.columns):
        return np.zeros(table.shape, dtype=bool)
    rows = frame[frame["io"] == io]
    flagged = (rows["nan"].fillna(0) + rows["inf"].fillna(0)).gt(0)
    per_cell = flagged.groupby([rows["module"], rows["step"]]).any().unstack(fill_value=False)
    per_cell = per_cell.reindex(index=table.index, columns=table.columns, fill_value=False)
    return per_cell.fillna(False).to_numpy(dtype=bool)


def per_parameter(frame: Any, io: str) -> Any:
    """`io` rows of each parameter under its own path ("head.weight"), as the ranking says."""
    rows = frame[frame["io"] == io]
    paths = [f"{m}.{i}" if m else str(i) for m, i in zip(rows["module"], rows["index"])]
    return rows.assign(module=paths, index="")


def history(frame: Any, stat: str, io: str) -> Any:
    """A series × step table of `stat` from a frame's `io` rows (first call of each step)."""
    rows = frame[(frame["io"] == io) & (frame["call"] == 0)]
    if rows.empty:
        return None
    table = rows.pivot_table(index="module", columns="step", values=stat, aggfunc="first",
                             dropna=False, sort=False)
    return table.astype(float)
