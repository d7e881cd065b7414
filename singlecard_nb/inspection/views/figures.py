"""The one figure helper every view draws with (`new_figure`), a figure that says why there is
nothing to draw, and what every figure shares (the NaN/Inf colour, the root's label).

Every figure is made by `new_figure`: through pyplot (so the notebook's inline backend knows how
to render it) and closed at once, so it shows exactly once: as the value returned to the cell.
Callers look it up at each call (`figures.new_figure`), so it stays the one helper.
"""

from __future__ import annotations

from typing import Any

BAD_COLOUR = "#e41a1c"  # NaN/Inf cells: red on viridis cannot be mistaken for a value


def label(module: str) -> str:
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
