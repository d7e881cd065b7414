"""Matplotlib figures: an Inspector's module × step heatmap (histograms: `histograms.py`), and a
comparison's divergence per module.

Every figure is made by `new_figure`: through pyplot (so the notebook's inline backend knows how
to render it) and closed at once, so it shows exactly once: as the value returned to the cell.
"""

from __future__ import annotations

from typing import Any

from . import ranking

# Statistics that are never negative and often span decades: a log colour scale keeps a layer
# at 1e4 from flattening every other row into one colour.
_LOG_FRIENDLY = {"absmax", "std"}
_BAD_COLOUR = "#e41a1c"  # NaN/Inf cells: red on viridis cannot be mistaken for a value
_EVAL_COLOUR = "#ff7f00"  # markers over steps run in eval mode
# Rows of one tensor per parameter: drawn per "module.name", not per module
PER_PARAMETER = ("param", "param_grad", "step_grad", "update")
IOS = ("output", "input", "grad", *PER_PARAMETER)
_KIND = {"output": "output", "param": "param", "param_grad": "grad", "step_grad": "grad",
         "update": "param", "input": "input"}


def _label(module: str) -> str:
    return module if module else "(root)"


def new_figure(width: float, height: float,
               grid: tuple[int, int] | None = None) -> tuple[Any, Any]:
    """A Figure of `width` × `height` inches with constrained layout, and its axes: one Axes, or
    with `grid=(rows, columns)` a 2-D array of them (also for 1 × 1)."""
    import matplotlib.pyplot as plt

    if grid is None:
        fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    else:
        fig, ax = plt.subplots(*grid, figsize=(width, height), layout="constrained",
                               squeeze=False)
    plt.close(fig)  # returned to the caller, not shown again by the inline backend
    return fig, ax


def message_figure(message: str) -> Any:
    """A small figure that says why there is nothing to draw."""
    fig, ax = new_figure(6, 1.5)
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=10, color="#555")
    return fig


def heatmap(insp: Any, stat: str = "absmax", io: str = "output",
            training: bool | None = None, relative: bool = False, top: int = 40) -> Any:
    """Module × step heatmap of one statistic of the recorded outputs; returns a Figure.

    stat: a statistic column of `insp.frame()` (absmax, std, mean, min, max, zeros, nan, inf).
    Cells whose statistic is NaN or ±Inf are drawn red: that is where non-finite values are.
    Steps run in eval mode (every module's .training False) are marked with an orange ▼.
    training: True or False keeps only rows recorded in that mode.
    relative: each row divided by its own first step (×1 white, growth red, shrinking blue).
    top: at most this many rows, each labelled: the modules that changed most (`ranking.py`,
        one per repeated group), in execution order. Containers whose output is a child's
        (the same values at every step) are folded into that child. A model of repeated blocks
        also gets a block × module-kind panel of the latest step, blocks aligned as rows.
    """
    import matplotlib
    import numpy as np
    from matplotlib import colors, ticker

    if io not in IOS:
        raise ValueError(f"io must be one of {', '.join(IOS)}; got {io!r}")
    frame = insp.frame()
    if training is not None:
        frame = frame[frame["training"] == training]
    if io in PER_PARAMETER:
        frame = _per_parameter(frame, io)
        table = _history(frame, stat, io)
    else:
        table = insp.history(stat, io, training=training)
    if table is None or table.empty:
        needs = {"param": " (inspect with params=True)", "update": " (params=True)",
                 "step_grad": " (params=True)", "param_grad": " (grads=True)",
                 "grad": " (grads=True)"}.get(io, "")
        return message_figure(f"no {io} {stat!r} recorded yet{needs}: run the model while "
                              "inspecting")
    # folded only where mean and std agree too: a ReLU after a Linear often keeps its absmax
    alike = [t for other in ("mean", "std") if other != stat
             and (t := (_history(frame, other, io) if io in PER_PARAMETER
                        else insp.history(other, io, training=training))) is not None]
    table = full = _fold_repeats(table, alike)
    total = len(table)
    if total > top:
        table = table.loc[_most_changed(frame, table, io, top)]
    values = table.to_numpy(dtype=float)
    if relative:
        values = _relative(values)
    finite = np.isfinite(values)
    # A NaN cell is either "the statistic was NaN" (red) or "the module did not run in that
    # step" (blank); only the frame's nan/inf counts can tell them apart.
    bad = np.isinf(table.to_numpy(dtype=float)) | _nonfinite_cells(frame, table, io)
    masked = np.ma.masked_where(~finite, values)

    rows, cols = values.shape
    blocks = _blocks(list(full.index))
    width = min(6 + 0.05 * cols, 10) + (4.5 if blocks else 0)
    height = min(max(1.4 + 0.2 * rows, 2.6), 14)
    if blocks:
        height = min(max(height, 1.4 + 0.13 * len(blocks[1])), 14)
        fig, axes = new_figure(width, height, grid=(1, 2))
        ax, grid_ax = axes[0]
    else:
        fig, ax = new_figure(width, height)
    # blank: a step in which the module did not run
    cmap = matplotlib.colormaps["coolwarm" if relative else "viridis"].with_extremes(bad="white")
    norm = _norm(values[finite], stat, relative)
    image = ax.imshow(masked, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    if bad.any():
        overlay = np.ma.masked_where(~bad, np.ones_like(values))
        ax.imshow(overlay, aspect="auto", interpolation="nearest",
                  cmap=colors.ListedColormap([_BAD_COLOUR]), vmin=0, vmax=1)
    label = f"{stat} ÷ its first step" if relative else stat
    fig.colorbar(image, ax=ax, label=label + (" (log scale)" if norm is not None else ""),
                 fraction=0.04, pad=0.02)

    # Columns are recorded steps (0, N, 2N... with every=N): label positions with step numbers.
    steps = list(table.columns)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=10, integer=True))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(
        lambda x, _: str(steps[int(x)]) if 0 <= int(x) < len(steps) and x == int(x) else ""))
    types = _module_types(frame)
    labels = [_label(str(m)) + (f" · {types[m]}" if m in types else "") for m in table.index]
    ax.set_yticks(range(rows), labels, fontsize=8 if rows <= 40 else 6)  # every row labelled
    ax.set_xlabel("step")
    title = f"{stat} of module {io}s per step" + (" ÷ first step" if relative else "")
    if total > rows:
        title += f"\n{rows} of {total} modules: those that changed most, in execution order"
    eval_columns = _eval_columns(frame, steps)
    if eval_columns and len(eval_columns) < len(steps):
        ax.plot(eval_columns, [1.0] * len(eval_columns), "v", color=_EVAL_COLOUR, markersize=5,
                transform=ax.get_xaxis_transform(), clip_on=False)
        title += "  (▼ eval steps)"
    if bad.any():
        title += "  (red: NaN/Inf)"
    lead = _first_finding(insp)
    if lead:
        title = f"first finding: {lead}\n{title}"
    ax.set_title(title, fontsize=10)
    if blocks:
        _block_panel(grid_ax, fig, full, blocks, stat, relative, frame, io)
    return fig


def _fold_repeats(table: Any, alike: list | tuple = ()) -> Any:
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
        if any(_inside_or_beside(e, str(module)) for e in earlier):
            continue
        earlier.append(str(module))
        seen[key] = earlier
        keep.append(module)
    return table.loc[keep]


def _inside_or_beside(inner: str, outer: str) -> bool:
    if outer == "" or inner.startswith(outer + "."):
        return True
    return inner.rpartition(".")[0] == outer.rpartition(".")[0]


def _most_changed(frame: Any, table: Any, io: str, top: int) -> list:
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


def _relative(values: Any) -> Any:
    """Each row divided by its first finite, non-zero value."""
    import numpy as np

    out = np.full_like(values, np.nan)
    for i, row in enumerate(values):
        base = row[np.isfinite(row) & (row != 0)]
        if base.size:
            out[i] = row / base[0]
    return out


def _norm(shown: Any, stat: str, relative: bool) -> Any:
    from matplotlib import colors

    if relative:
        positive = shown[shown > 0]
        if not positive.size:
            return None
        spread = max(float(positive.max()), 1 / float(positive.min()), 1.01)
        return colors.LogNorm(vmin=1 / spread, vmax=spread)  # ×1 in the middle
    if stat in _LOG_FRIENDLY and shown.size and shown.min() > 0 and shown.max() / shown.min() > 100:
        return colors.LogNorm(vmin=shown.min(), vmax=shown.max())
    return None


def _blocks(paths: list) -> tuple[str, list[int], list[str]] | None:
    """Repeated blocks among module paths: (prefix, block numbers, kinds) for the prefix with
    the most numbered children (`transformer.h`, 12 blocks, ["ln_1", "attn.c_attn", …])."""
    found: dict[str, dict[int, list[str]]] = {}
    for path in map(str, paths):
        parts = path.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                kinds = found.setdefault(".".join(parts[:i]), {}).setdefault(int(part), [])
                kinds.append(".".join(parts[i + 1:]) or "(block)")
                break
    if not found:
        return None
    prefix, members = max(found.items(), key=lambda item: len(item[1]))
    if len(members) < 4:
        return None
    kinds = list(dict.fromkeys(k for ks in members.values() for k in ks))
    return prefix, sorted(members), kinds


def _block_panel(ax: Any, fig: Any, table: Any, blocks: tuple, stat: str, relative: bool,
                 frame: Any, io: str) -> None:
    """Blocks as rows, module kinds as columns: the latest step's `stat` (or latest ÷ first)."""
    import matplotlib
    import numpy as np
    from matplotlib import colors

    prefix, numbers, kinds = blocks
    last = table.iloc[:, -1]
    first = table.apply(lambda r: next((v for v in r if v == v and v != 0), np.nan), axis=1)
    grid = np.full((len(numbers), len(kinds)), np.nan)
    red = np.zeros_like(grid, dtype=bool)
    step = table.columns[-1]
    flagged = set()
    if frame is not None and not frame.empty:
        rows = frame[(frame["io"] == io) & (frame["step"] == step)]
        flagged = set(rows.loc[(rows["nan"].fillna(0) + rows["inf"].fillna(0)).gt(0), "module"])
    for i, n in enumerate(numbers):
        for j, kind in enumerate(kinds):
            path = f"{prefix}.{n}" if prefix else str(n)
            path = path if kind == "(block)" else f"{path}.{kind}"
            if path in last.index:
                grid[i, j] = last[path] / first[path] if relative else last[path]
                # a module that did not run in that step stays blank, not red
                red[i, j] = path in flagged or bool(np.isinf(last[path]))
    finite = np.isfinite(grid)
    cmap = matplotlib.colormaps["coolwarm" if relative else "viridis"].with_extremes(bad="white")
    norm = _norm(grid[finite], stat, relative)
    image = ax.imshow(np.ma.masked_where(~finite, grid), aspect="auto", interpolation="nearest",
                      cmap=cmap, norm=norm)
    if red.any():
        ax.imshow(np.ma.masked_where(~red, np.ones_like(grid)), aspect="auto",
                  interpolation="nearest", cmap=colors.ListedColormap([_BAD_COLOUR]), vmin=0,
                  vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    ax.set_yticks(range(len(numbers)), [f"{prefix}.{n}" if prefix else str(n) for n in numbers],
                  fontsize=8 if len(numbers) <= 40 else 5)
    ax.set_xticks(range(len(kinds)), kinds, rotation=60, ha="right", fontsize=7)
    what = f"{stat} ÷ first step" if relative else stat
    ax.set_title(f"{what} at step {step}, block × module", fontsize=10)


def _eval_columns(frame: Any, steps: list) -> list[int]:
    """Column positions of the steps in which every recorded module was in eval mode."""
    if frame is None or frame.empty or "training" not in frame.columns:
        return []
    trained = frame.groupby("step")["training"].any()
    return [i for i, step in enumerate(steps) if step in trained.index and not trained[step]]


def _module_types(frame: Any) -> dict[str, str]:
    if frame is None or frame.empty or "type" not in frame.columns:
        return {}
    return dict(zip(frame["module"], frame["type"]))


def _nonfinite_cells(frame: Any, table: Any, io: str) -> Any:
    """Boolean array shaped like `table`: the module's `io` tensors held NaN/Inf in that step."""
    import numpy as np

    if frame is None or frame.empty or not {"nan", "inf"} <= set(frame.columns):
        return np.zeros(table.shape, dtype=bool)
    rows = frame[frame["io"] == io]
    flagged = (rows["nan"].fillna(0) + rows["inf"].fillna(0)).gt(0)
    per_cell = flagged.groupby([rows["module"], rows["step"]]).any().unstack(fill_value=False)
    per_cell = per_cell.reindex(index=table.index, columns=table.columns, fill_value=False)
    return per_cell.fillna(False).to_numpy(dtype=bool)


def _per_parameter(frame: Any, io: str) -> Any:
    """`io` rows of each parameter under its own path ("head.weight"), as the ranking says."""
    rows = frame[frame["io"] == io]
    paths = [f"{m}.{i}" if m else str(i) for m, i in zip(rows["module"], rows["index"])]
    return rows.assign(module=paths, index="")


def _history(frame: Any, stat: str, io: str) -> Any:
    """A series × step table of `stat` from a frame's `io` rows (first call of each step)."""
    rows = frame[(frame["io"] == io) & (frame["call"] == 0)]
    if rows.empty:
        return None
    table = rows.pivot_table(index="module", columns="step", values=stat, aggfunc="first",
                             dropna=False, sort=False)
    return table.astype(float)


def _first_finding(insp: Any) -> str:
    """The ranking's first row in a few words, for the title (all views lead with it)."""
    try:
        rows = insp.findings(1)
    except AttributeError:
        return ""
    if not rows:
        return ""
    text = rows[0].text()
    return text if len(text) <= 110 else text[:109] + "…"
