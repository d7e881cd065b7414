"""The latest statistics of an Inspector's series, small enough to cross to another process.

What each rank of `%singlecard cpu --ranks N` sends the notebook with its status (ranks/agent.py)
for the ranks' side-by-side view (runs/side_by_side.py): per series (a module's output, a
parameter after the optimiser step, the gradient it used, its update) its last `LAST_STEPS`
steps, as named fields. Read from the same `Tracks` the live view reads, fed each step once,
so a snapshot costs the steps since the last one, and its size is bounded by `MAX_SERIES`.
"""

from __future__ import annotations

from typing import Any

from ..causes.series import ABSMAX, INF, MEAN, NAN, STD, STEP, Tracks

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
        "absmax", "mean", "std", "nan", "inf"}, ...]}, ...], "left_out": series not sent}."""
        tracks = self._tracks
        tracks.feed(self._insp.records())
        tables = (("output", tracks.by_path), ("param", tracks.params),
                  ("step_grad", tracks.step_grads), ("update", tracks.updates))
        every = [(track.order, io, track) for io, table in tables for track in table.values()]
        every.sort(key=lambda item: item[0])
        series = [{"io": io, "path": track.path, "type": track.type,
                   "entries": [_entry(e) for e in list(track.entries)[-self.last_steps:]]}
                  for _, io, track in every[:self.max_series]]
        return {"step": tracks.last_step, "series": series,
                "left_out": max(0, len(every) - self.max_series)}


def _entry(entry: list) -> dict[str, Any]:
    return {"step": entry[STEP], "absmax": entry[ABSMAX], "mean": entry[MEAN],
            "std": entry[STD], "nan": entry[NAN], "inf": entry[INF]}
