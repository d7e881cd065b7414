"""Records read back from their files: the ranking of a saved run (`scn.findings`), and a
model's records from one rank of a job, what `scn.inspectors()` holds after a `%run` of N ranks
(`GPT[rank 1]`): the rows, their findings and summary, no model."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..causes.series import FRAME_COLUMNS
from ..views import ranking
from ..views.summary import Summary
from .records import load, read_one

_RANK_FILE = re.compile(r"^(?P<stem>.+?)(?:\.(?P<model>[^.]+))?\.rank(?P<rank>\d+)\.db$")


class Recorded:
    """One model of one rank, recorded in another process; reads like a stopped Inspector."""

    active = False  # no hooks here: the model ran in the rank's process

    def __init__(self, name: str, rank: int, frame: Any, path: str | os.PathLike):
        self.name, self.rank, self.path = name, rank, Path(path)
        self._frame = frame
        self.notes: list[str] = []
        self.errors: list[str] = []

    @property
    def steps_recorded(self) -> int:
        return int(self._frame["step"].nunique()) if len(self._frame) else 0

    def frame(self, ranks: str | None = None):
        """The rank's rows (ranks="all" gives the same: the other ranks are their own entries)."""
        return self._frame.copy()

    def findings(self, top: int | None = 10) -> list:
        """The ranked rows that show something, likeliest cause first, as the rank's live
        inspector ranked them (its input channels and param groups were saved too)."""
        if not len(self._frame):
            return []  # as an Inspector that recorded no step
        return findings(self._frame, top)

    def summary(self, top: int | None = None) -> Summary:
        return Summary(self, top)

    def flush(self) -> None:
        """Nothing to move: the rows are on the host already."""

    def stop(self) -> None:
        """Nothing to stop: the rank that recorded these rows has ended."""

    def __repr__(self) -> str:
        return f"<{self.name}: {self.steps_recorded} steps recorded in rank {self.rank}>"


def from_folder(folder: str | os.PathLike, stem: str = "records") -> dict[str, Recorded]:
    """{"GPT[rank 0]": Recorded, ...} of the rank files `python -m singlecard_nb --save
    FOLDER/STEM.db` wrote, ordered by model then rank."""
    found = []
    for path in Path(folder).glob(f"{stem}*.rank*.db"):
        match = _RANK_FILE.match(path.name)
        if match is None or match["stem"] != stem:
            continue
        frame, meta = read_one(path)
        model = match["model"] or str(meta.get("model") or "model")
        found.append((model, int(match["rank"]), frame, path))
    return {f"{model}[rank {rank}]": Recorded(f"{model}[rank {rank}]", rank, frame, path)
            for model, rank, frame, path in sorted(found, key=lambda f: (f[0], f[1]))}


def findings(source: Any, top: int | None = 10) -> list:
    """The ranking's findings, likeliest cause first, of saved records: a frame from
    `scn.load()`, a path, directory or glob of files `insp.save()` wrote, or an Inspector.

    A loaded frame ranks as the inspector that recorded it did: its input channels and the
    optimiser's param groups come with it (`frame.attrs`); a frame cut to one rank ranks with
    that rank's. top: the first `top` rows (None: all).
    """
    if hasattr(source, "findings") and not hasattr(source, "columns"):
        return source.findings(top)
    if isinstance(source, (str, os.PathLike, list, tuple)):
        source = load(source)
    if not hasattr(source, "columns"):
        raise TypeError("scn.findings() takes a frame from scn.load() or insp.frame(), a path "
                        f"of saved records, or an Inspector; got {type(source).__name__}")
    _check_rankable(source)
    return ranking.findings(ranking.Tracks.from_frame(source), top)


# Columns that name a series: a missing value there is no row the ranking can place
_NAMING = ("io", "step", "module", "type", "call", "index")


def _check_rankable(frame: Any) -> None:
    """A sentence (ValueError) for a frame the ranking cannot read: columns missing, no rows,
    a row without a name; pandas' KeyError or a TypeError deep in a rule otherwise."""
    missing = [c for c in FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"scn.findings(): these records have no column {', '.join(missing)} "
                         "(the ranking reads them): give insp.frame(), scn.load(path) or an "
                         "Inspector, with its columns as recorded")
    if not len(frame):
        raise ValueError("scn.findings(): these records hold no rows, so there is nothing to "
                         "rank (was the model called while it was inspected?)")
    for column in _NAMING:
        empty = frame[column].isna()
        if empty.any():
            raise ValueError(f"scn.findings(): {int(empty.sum())} of these records have no "
                             f"{column} (the first at row {empty.idxmax()!r}): each row needs "
                             "the step, module, type, call, io and index it was recorded at")
