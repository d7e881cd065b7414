"""`insp.plot()`: an Inspector's module × step heatmap of one statistic, and, for a model of
repeated blocks, its block × module-kind panel of the latest step. The rows are chosen in
`heatmap_rows.py`; every figure is made by `figures.new_figure`."""

from __future__ import annotations

from typing import Any

from . import figures  # figures.new_figure, looked up at each call: the one figure helper
from . import heatmap_rows as rows_of
from .heatmap_rows import IOS, PER_PARAMETER

# Statistics that are never negative and often span decades: a log colour scale keeps a layer
# at 1e4 from flattening every other row into one colour.
_LOG_FRIENDLY = {"absmax", "std"}
_EVAL_COLOUR = "#ff7f00"  # markers over steps run in eval mode


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
        frame = rows_of.per_parameter(frame, io)
        table = rows_of.history(frame, stat, io)
    else:
        table = insp.history(stat, io, training=training)
    if table is None or table.empty:
        needs = {"param": " (inspect with params=True)", "update": " (params=True)",
                 "step_grad": " (params=True)", "param_grad": " (grads=True)",
                 "grad": " (grads=True)"}.get(io, "")
        return figures.message_figure(f"no {io} {stat!r} recorded yet{needs}: run the model "
                                      "while inspecting")
    # folded only where mean and std agree too: a ReLU after a Linear often keeps its absmax
    alike = [t for other in ("mean", "std") if other != stat
             and (t := (rows_of.history(frame, other, io) if io in PER_PARAMETER
                        else insp.history(other, io, training=training))) is not None]
    table = full = rows_of.fold_repeats(table, alike)
    total = len(table)
    if total > top:
        table = table.loc[rows_of.most_changed(frame, table, io, top)]
    values = table.to_numpy(dtype=float)
    if relative:
        values = _relative(values)
    finite = np.isfinite(values)
    # A NaN cell is either "the statistic was NaN" (red) or "the module did not run in that
    # step" (blank); only the frame's nan/inf counts can tell them apart.
    bad = np.isinf(table.to_numpy(dtype=float)) | rows_of.nonfinite_cells(frame, table, io)
    values, scaled = _plottable(values, stat, relative)
    finite = np.isfinite(values)
    masked = np.ma.masked_where(~finite, values)

    rows, cols = values.shape
    blocks = _blocks(list(full.index))
    width = min(6 + 0.05 * cols, 10) + (4.5 if blocks else 0)
    height = min(max(1.4 + 0.2 * rows, 2.6), 14)
    if blocks:
        height = min(max(height, 1.4 + 0.13 * len(blocks[1])), 14)
        fig, axes = figures.new_figure(width, height, grid=(1, 2))
        ax, grid_ax = axes[0]
    else:
        fig, ax = figures.new_figure(width, height)
    # blank: a step in which the module did not run
    cmap = matplotlib.colormaps["coolwarm" if relative else "viridis"].with_extremes(bad="white")
    norm = None if scaled else _norm(values[finite], stat, relative)
    image = ax.imshow(masked, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    if bad.any():
        overlay = np.ma.masked_where(~bad, np.ones_like(values))
        ax.imshow(overlay, aspect="auto", interpolation="nearest",
                  cmap=colors.ListedColormap([figures.BAD_COLOUR]), vmin=0, vmax=1)
    label = f"{stat} ÷ its first step" if relative else stat
    label = scaled.format(label) if scaled else label
    fig.colorbar(image, ax=ax, label=label + (" (log scale)" if norm is not None else ""),
                 fraction=0.04, pad=0.02)

    # Columns are recorded steps (0, N, 2N... with every=N): label positions with step numbers.
    steps = list(table.columns)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=10, integer=True))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(
        lambda x, _: str(steps[int(x)]) if 0 <= int(x) < len(steps) and x == int(x) else ""))
    types = rows_of.module_types(frame)
    labels = [figures.label(str(m)) + (f" · {types[m]}" if m in types else "")
              for m in table.index]
    ax.set_yticks(range(rows), labels, fontsize=8 if rows <= 40 else 6)  # every row labelled
    ax.set_xlabel("step")
    title = f"{stat} of module {io}s per step" + (" ÷ first step" if relative else "")
    if total > rows:
        title += f"\n{rows} of {total} modules: those that changed most, in execution order"
    eval_columns = rows_of.eval_columns(frame, steps)
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



def _relative(values: Any) -> Any:
    """Each row divided by its first finite, non-zero value (a quotient past float64's range,
    1e308 ÷ 1e-300, is kept at float64's largest: drawn at the scale's end, not blank)."""
    import numpy as np

    out = np.full_like(values, np.nan)
    for i, row in enumerate(values):
        base = row[np.isfinite(row) & (row != 0)]
        if base.size:
            with np.errstate(over="ignore"):
                out[i] = row / base[0]
    largest = np.finfo(np.float64).max
    return np.where(np.isfinite(values) & np.isinf(out), np.copysign(largest, out), out)


# matplotlib's colour scales and colour bars overflow (or find no ticks) for values past
# 1e±300, which a float64 run at its ends reaches
_PLOTTABLE = 1e300


def _plottable(values: Any, stat: str, relative: bool) -> tuple[Any, str]:
    """`values` as matplotlib can draw them, and how the colour bar names them ("" when
    drawn as they are): past 1e±300, non-negative statistics as their log10, signed ones in
    units of a power of ten."""
    import numpy as np

    finite = values[np.isfinite(values)]
    if not finite.size:
        return values, ""
    big = float(np.abs(finite).max())
    nonzero = np.abs(finite[finite != 0])
    small = float(nonzero.min()) if nonzero.size else 1.0
    if big <= _PLOTTABLE and small >= 1 / _PLOTTABLE:
        return values, ""
    if (relative or stat in _LOG_FRIENDLY) and finite.min() >= 0:
        with np.errstate(divide="ignore"):
            return np.log10(values), "log10 of {} (past the range a colour scale draws)"
    power = int(np.floor(np.log10(big)))
    return values / 10.0 ** power, f"{{}} in units of 1e{power}"


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
                with np.errstate(over="ignore"):
                    grid[i, j] = last[path] / first[path] if relative else last[path]
                # a module that did not run in that step stays blank, not red
                red[i, j] = path in flagged or bool(np.isinf(last[path]))
    grid, scaled = _plottable(grid, stat, relative)
    finite = np.isfinite(grid)
    cmap = matplotlib.colormaps["coolwarm" if relative else "viridis"].with_extremes(bad="white")
    norm = None if scaled else _norm(grid[finite], stat, relative)
    image = ax.imshow(np.ma.masked_where(~finite, grid), aspect="auto", interpolation="nearest",
                      cmap=cmap, norm=norm)
    if red.any():
        ax.imshow(np.ma.masked_where(~red, np.ones_like(grid)), aspect="auto",
                  interpolation="nearest", cmap=colors.ListedColormap([figures.BAD_COLOUR]),
                  vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, label=scaled.format(stat) if scaled
                 else None)
    ax.set_yticks(range(len(numbers)), [f"{prefix}.{n}" if prefix else str(n) for n in numbers],
                  fontsize=8 if len(numbers) <= 40 else 5)
    ax.set_xticks(range(len(kinds)), kinds, rotation=60, ha="right", fontsize=7)
    what = f"{stat} ÷ first step" if relative else stat
    ax.set_title(f"{what} at step {step}, block × module", fontsize=10)



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
