"""The latest statistics of an Inspector's series, small enough to cross to another process.

What each rank of `%singlecard cpu --ranks N` sends the notebook with its status (ranks/agent.py)
for the ranks' side-by-side view (runs/side_by_side.py): per series (a module's output, a
parameter after the optimiser step, the gradient it used, its update) its last `LAST_STEPS`
steps, as named fields. Read from the same `Tracks` the live view reads, fed each step once,
so a snapshot costs the steps since the last one, and its size is bounded by `MAX_SERIES`.
"""

from __future__ import annotations

from typing import Any

from ..causes import ABSMAX, INF, MEAN, NAN, STD, STEP, Tracks

LAST_STEPS = 2  # steps sent per series: the notebook compares the ranks at a step they all have
MAX_SERIES = 2000  # series sent per model (in the order they first reported)


class Latest:
    """`snapshot()` of one Inspector's latest steps; reads `insp.records()` (safe while the
    model runs in another thread)."""

    def __init__(self, insp: Any, last_steps: int = LAST_STEPS, max_series: int = MAX_SERIES):
        self._insp = insp
        self._tracks = Tracks()
        self.last_steps = last_steps
        self.max_series = max_series

    def snapshot(self) -> dict[str, Any]:
        """{"step": the latest step, "series": [{"io", "path", "type", "entries": [{"step",
        "absmax", "mean", "std", "nan", "inf"(, "opt")}, ...]}, ...], "left_out": series not
        sent}."""
        tracks = self._tracks
        tracks.feed(self._insp.records())
        tables = (("output", tracks.by_path), ("param", tracks.params),
                  ("step_grad", tracks.step_grads), ("update", tracks.updates))
        every = [(track.order, io, track) for io, table in tables for track in table.values()]
        every.sort(key=lambda item: item[0])
        series = [{"io": io, "path": track.path, "type": track.type,
                   "entries": _entries(track, io, self.last_steps)}
                  for _, io, track in every[:self.max_series]]
        return {"step": tracks.last_step, "series": series,
                "left_out": max(0, len(every) - self.max_series)}


def _entries(track: Any, io: str, last: int) -> list[dict[str, Any]]:
    """The track's last steps; a parameter's, its gradient's and its update's also say which
    optimiser step each was ("opt", from 0): ranks meet there when one rank also ran forward
    passes the others did not (nanoGPT evaluates on rank 0 only) and numbers its steps ahead."""
    entries = list(track.entries)[-last:]
    first = track.added - len(entries)
    return [{"step": e[STEP], "absmax": e[ABSMAX], "mean": e[MEAN], "std": e[STD],
             "nan": e[NAN], "inf": e[INF], **({} if io == "output" else {"opt": first + i})}
            for i, e in enumerate(entries)]
