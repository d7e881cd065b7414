"""The picture of a comparison: the largest relative difference per module, in run a's order.

Drawn for real sizes: at 1 000 modules the markers shrink to dots (nothing piles into a bar of
overlapping symbols), only as many module names are written as fit under the axis (always the
first divergence's, in red), and the first divergence is marked by a line and a label above the
axes, where it covers no point.
"""

from __future__ import annotations

import math
from typing import Any

from ..views import figures  # figures.new_figure, looked up at each call: the one figure helper
from .alignment import COMPARED

_IO_STYLE = {"output": ("#1f77b4", "o"), "input": ("#7f7f7f", "s"), "grad": ("#ff7f0e", "v"),
             "param_grad": ("#2ca02c", "^"), "param": ("#9467bd", "D"),
             "step_grad": ("#8c564b", "P"), "buffer": ("#e377c2", "X")}
_FIRST_COLOUR = "#d62728"
_MAX_LABELS = 40  # module names under the axis: more would overlap at 7 pt on a 14 in figure
_WIDTH = 14.0  # inches, at most


def _label(module: str) -> str:
    return module if module else "(root)"


def _marker_size(modules: int, width: float) -> float:
    """Points: 6 while a marker fits its slot on the axis, down to 1.5 (a dot) at 1 000."""
    slot = width * 72 * 0.8 / max(modules, 1)  # points of axis per module
    return max(1.5, min(6.0, 0.8 * slot))


def _ticks(count: int, keep: int | None) -> list[int]:
    """At most _MAX_LABELS positions, evenly spread, always holding `keep` (the first
    divergence): its neighbours closer than one spacing give way to it."""
    step = max(1, math.ceil(count / _MAX_LABELS))
    ticks = list(range(0, count, step))
    if keep is not None:
        ticks = [t for t in ticks if abs(t - keep) >= step or t == keep]
        ticks = sorted(set(ticks) | {keep})
    return ticks


def divergence_plot(frame: Any, stat: str | None, rtol: float, first: Any,
                    labels: tuple[str, str]) -> Any:
    """Largest relative difference per module and io kind over all steps, modules on the x axis
    in the order they first ran in run a; the tolerance as a line, the first divergence marked.

    frame: a comparison's aligned rows (`Comparison.frame()`); first: its first `Divergence`.
    """
    import numpy as np

    compared = frame[frame["status"] == COMPARED]
    if compared.empty:
        return figures.message_figure("no tensor recorded by both runs: nothing to plot")
    column = "rel" if stat is None else f"{stat}_rel"
    modules = list(dict.fromkeys(frame["module"]))
    place = {m: i for i, m in enumerate(modules)}
    finite = compared[column].replace(np.inf, np.nan)
    floor = max(min(float(finite[finite > 0].min()) if (finite > 0).any() else rtol, rtol) / 10,
                1e-12)
    ceiling = max(float(finite.max()) if finite.notna().any() else rtol, rtol) * 10
    width = min(4 + 0.3 * len(modules), _WIDTH)
    fig, ax = figures.new_figure(width, 3.8)
    size = _marker_size(len(modules), width)
    for io, rows in compared.groupby("io", sort=False):
        worst = rows.groupby("module", sort=False)[column].max()
        x = [place[m] for m in worst.index]
        y = np.clip(np.nan_to_num(worst.to_numpy(dtype=float), nan=0.0, posinf=ceiling),
                    floor, ceiling)
        colour, marker = _IO_STYLE.get(io, ("#17becf", "x"))
        ax.plot(x, y, linestyle="none", marker=marker if size > 2 else "o", markersize=size,
                markeredgewidth=0 if size <= 2 else 1, color=colour, label=io, alpha=0.85)
    ax.axhline(rtol, color=_FIRST_COLOUR, linestyle="--", linewidth=1, label=f"rtol {rtol:g}")
    ax.axhline(floor, color="#bbbbbb", linewidth=0.8)
    ax.annotate("equal", (1, floor), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                textcoords="offset points", ha="right", fontsize=7, color="#888888")
    keep = None
    if first is not None and first.module in place and (stat is None or stat == first.stat):
        keep = place[first.module]
        # a line through the module and the words above the axes: they cover no marker
        ax.axvline(keep, color=_FIRST_COLOUR, linewidth=0.8, alpha=0.6, zorder=0)
        right = keep > 0.6 * max(len(modules) - 1, 1)
        ax.annotate(f"first: step {first.step} {first.io} of {_label(first.module)}",
                    (keep, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 3),
                    textcoords="offset points", ha="right" if right else "left", va="bottom",
                    fontsize=8, color=_FIRST_COLOUR, annotation_clip=False)
    ax.set_yscale("log")
    ax.set_ylim(floor / 3, ceiling)  # equal values sit on the floor, fully visible
    ax.set_xlim(-0.5, len(modules) - 0.5)
    ticks = _ticks(len(modules), keep)
    ax.set_xticks(ticks)
    ax.set_xticklabels([_label(modules[t]) for t in ticks], rotation=60, ha="right", fontsize=7)
    if keep is not None:
        ax.get_xticklabels()[ticks.index(keep)].set_color(_FIRST_COLOUR)
    shown = "every module named" if len(ticks) == len(modules) else (
        f"{len(ticks)} of {len(modules)} modules named")
    ax.set_xlabel(f"module, in execution order ({shown})")
    ax.set_ylabel(f"largest relative difference ({stat or 'worst statistic'})")
    ax.set_title(f"{labels[0]} vs {labels[1]}: divergence per module", fontsize=10, pad=16)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # never over a point
    return fig
