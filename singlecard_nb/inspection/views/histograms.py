"""`insp.hist()`: activation histograms of an Inspector, the latest step and the recent ones."""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from . import figures  # figures.new_figure, looked up at each call: the one figure helper
from .figures import BAD_COLOUR, label, message_figure


def _rebin(counts: Any, edges: Any, bins: int) -> tuple[Any, Any]:
    """Merge adjacent bins so there are at most `bins` (exact: counts are summed)."""
    import numpy as np

    counts = np.asarray(counts, dtype=float)
    edges = np.asarray(edges, dtype=float)
    group = max(1, math.ceil(len(counts) / max(1, bins)))
    if group == 1:
        return counts, edges
    pad = (-len(counts)) % group
    padded = np.concatenate([counts, np.zeros(pad)])
    merged = padded.reshape(-1, group).sum(axis=1)
    merged_edges = np.concatenate([edges[:-1][::group], edges[-1:]])
    return merged, merged_edges


def histograms(insp: Any, modules: Any = None, bins: int = 64) -> Any:
    """Histograms of recorded activation values per module; returns a Figure.

    Per module: the latest step's histogram (left) and, once several steps are recorded, the
    histogram of each recent step as one row of a heatmap (right: value × step, log counts).
    NaN and Inf values are not in any histogram: where a step had them, the panel says how many.

    modules: module paths or glob patterns (default: every module with a histogram). The
    inspector computes histograms on the device for the modules given as `hist=` when it was
    created, so no activation is kept for this. bins: at most this many bars (adjacent bins are
    merged, never re-estimated).
    """
    available: dict[str, tuple[Any, Any]] = dict(insp.histograms())
    over_steps: dict[str, list] = dict(insp.histograms(steps=True))
    if isinstance(modules, str):
        modules = [modules]
    if modules is None:
        chosen = list(available)
    else:
        chosen = [name for name in available if any(fnmatch.fnmatchcase(name, p) for p in modules)]
        if not chosen:
            have = ", ".join(repr(n) for n in available) or "none"
            raise ValueError(
                f"no histogram recorded for {list(modules)!r}; modules with histograms: {have}. "
                "Ask for them when inspecting, e.g. scn.inspect(model, hist=['encoder.*'])"
            )
    if not chosen:
        return message_figure("no histograms recorded: inspect with hist=[...module paths...]")

    nonfinite = _nonfinite_counts(insp.frame(), chosen)
    many = any(len(over_steps.get(name, [])) > 1 for name in chosen)
    ncols = 2 if many else min(3, len(chosen))
    nrows = len(chosen) if many else math.ceil(len(chosen) / ncols)
    fig, axes = figures.new_figure(4.5 * ncols, 2.6 * nrows, grid=(nrows, ncols))
    for ax in axes.flat:
        ax.axis("off")
    panels = [(axes[i, 0], axes[i, 1]) for i in range(nrows)] if many else \
        [(ax, None) for ax in axes.flat]
    for (ax, steps_ax), name in zip(panels, chosen):
        ax.axis("on")
        step = over_steps[name][-1][0] if over_steps.get(name) else None
        counts, edges = _rebin(*available[name], bins)
        ax.set_title(label(name), fontsize=9)
        note = _nonfinite_note(nonfinite.get(name, {}), step)
        if counts.sum() == 0 or not edges[-1] > edges[0]:
            ax.text(0.5, 0.5, "no finite values to count" + (f"\n{note}" if note else ""),
                    ha="center", va="center", transform=ax.transAxes, color=BAD_COLOUR)
        else:
            ax.stairs(counts, edges, fill=True, color="#3b75af")
            positive = counts[counts > 0]
            if positive.size and positive.max() / positive.min() > 100:  # heavy tails visible
                ax.set_yscale("log")
            if note:
                ax.text(0.98, 0.95, note, ha="right", va="top", transform=ax.transAxes,
                        fontsize=8, color=BAD_COLOUR)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=7)
        if steps_ax is not None and len(over_steps.get(name, [])) > 1:
            steps_ax.axis("on")
            _histogram_steps(steps_ax, over_steps[name], bins, nonfinite.get(name, {}))
    fig.suptitle("activation values (latest recorded step" + ("; right: per step)" if many
                                                              else ")"), fontsize=10)
    return fig


def _nonfinite_counts(frame: Any, modules: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """module -> step -> (NaN, Inf) counts of its outputs, where there were any."""
    if frame is None or frame.empty:
        return {}
    rows = frame[(frame["io"] == "output") & frame["module"].isin(modules)]
    rows = rows[(rows["nan"].fillna(0) + rows["inf"].fillna(0)).gt(0)]
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for (module, step), group in rows.groupby(["module", "step"]):
        out.setdefault(module, {})[int(step)] = (int(group["nan"].fillna(0).sum()),
                                                 int(group["inf"].fillna(0).sum()))
    return out


def _nonfinite_note(counts: dict[int, tuple[int, int]], step: Any) -> str:
    if step is None or step not in counts:
        return ""
    nan, inf = counts[step]
    parts = [f"NaN ×{nan}" if nan else "", f"Inf ×{inf}" if inf else ""]
    return " ".join(p for p in parts if p) + " not counted"


def _histogram_steps(ax: Any, kept: list, bins: int, nonfinite: dict) -> None:
    """Histograms of recent steps as rows of one image on a shared value axis (each source
    bin's count goes to the shared bin holding its centre); steps with NaN/Inf marked red."""
    import numpy as np

    finite = [(s, c, e) for s, c, e in kept if e[-1] > e[0] and np.isfinite(e).all()]
    steps = [s for s, _, _ in kept]
    if not finite:
        ax.text(0.5, 0.5, "no finite values in these steps", ha="center", va="center",
                transform=ax.transAxes, color=BAD_COLOUR)
        return
    lo = min(float(e[0]) for _, _, e in finite)
    hi = max(float(e[-1]) for _, _, e in finite)
    shared = np.linspace(lo, hi, bins + 1)
    image = np.zeros((len(kept), bins))
    for i, (_, counts, edges) in enumerate(kept):
        if not (edges[-1] > edges[0]):
            continue
        centres = (edges[:-1] + edges[1:]) / 2
        where = np.clip(np.searchsorted(shared, centres, side="right") - 1, 0, bins - 1)
        np.add.at(image[i], where, counts)
    ax.imshow(np.log1p(image), aspect="auto", interpolation="nearest", cmap="magma",
              extent=(lo, hi, len(kept) - 0.5, -0.5))
    marked = [i for i, s in enumerate(steps) if s in nonfinite]
    if marked:
        ax.plot([hi] * len(marked), marked, "<", color=BAD_COLOUR, markersize=6, clip_on=False)
        ax.set_title("per step (◀ NaN/Inf in that step)", fontsize=8)
    else:
        ax.set_title("per step", fontsize=8)
    positions = sorted({0, len(kept) - 1, *range(0, len(kept), max(1, len(kept) // 8))})
    ax.set_yticks(positions, [str(steps[i]) for i in positions], fontsize=7)
    ax.set_ylabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
