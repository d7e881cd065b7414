"""A recorded run, as a reader has it: the rows of every rank gathered in a live job
(`gather`), record files found and merged into one frame (`scn.load`), the ranking of a saved
run (`scn.findings`), and a model's records from one rank of a job, what `scn.inspectors()`
holds after a `%run` of N ranks (`GPT[rank 1]`): the rows, their findings and summary, no
model. One file's layout, writing and reading are record_file.py's."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..causes import ATTRS, FRAME_COLUMNS, Tracks
from ..views import Summary
from ..views import findings as ranked
from .record_file import is_sqlite, read_one

_RANK_FILE = re.compile(r"^(?P<stem>.+?)(?:\.(?P<model>[^.]+))?\.rank(?P<rank>\d+)\.db$")


def gather(frame, ranks: str | None = None):
    """Every rank's rows (ranks="all") or this process's (ranks=None).

    Under a multi-process job this is a collective on the default process group: every rank
    must call it. Only the frames of statistics travel (pickled by all_gather_object), never a
    tensor of the model.
    """
    import pandas as pd

    if ranks not in (None, "all"):
        raise ValueError(f"ranks must be None (this process) or 'all'; got {ranks!r}")
    dist = torch.distributed
    if ranks is None or not (dist.is_available() and dist.is_initialized()):
        return frame
    world = dist.get_world_size()
    if world == 1:
        return frame
    frames: list[Any] = [None] * world
    dist.all_gather_object(frames, frame)
    return pd.concat(frames, ignore_index=True)




# --- loading ----------------------------------------------------------------------------------
def find(path_or_glob: str | os.PathLike | Iterable) -> list[Path]:
    """The record files meant by a path, a directory, a glob, or a list of those."""
    if not isinstance(path_or_glob, (str, os.PathLike)):
        return [p for item in path_or_glob for p in find(item)]
    text = os.fspath(path_or_glob)
    target = Path(text)
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.is_file() and is_sqlite(p))
    elif target.is_file():
        files = [target]
    else:
        files = [Path(p) for p in sorted(glob.glob(text)) if Path(p).is_file()]
        if not files:  # `run.db` saved by several ranks is run.rank0.db, run.rank1.db ...
            files = [Path(p) for p in sorted(glob.glob(glob.escape(
                str(target.with_name(target.stem))) + ".rank*" + glob.escape(target.suffix)))]
    if not files:
        # a run of several models saved one file each: run.Generator.db, run.Discriminator.db
        stem = glob.escape(str(target.with_name(target.stem)))
        per_model = sorted(Path(p).name for p in glob.glob(f"{stem}.*{glob.escape(target.suffix)}")
                           if Path(p).is_file())
        if target.suffix and per_model:
            raise FileNotFoundError(
                f"no saved records at {text!r}: that run saved one file per model "
                f"({', '.join(per_model)}); load the model's file (two models are two runs, "
                "not one job)")
        raise FileNotFoundError(
            f"no saved records at {text!r}: give a file written by insp.save(), a directory of "
            "them, or a glob such as 'runs/ddp.rank*.db'")
    return files


def load(path_or_glob: str | os.PathLike | Iterable):
    """One frame from saved records: a file, a directory, a glob or a list (all ranks of a job).

    Files are merged rank by rank, each in its own execution order. Two files of the same rank
    are two runs, not one job: load them separately and compare them.
    """
    import pandas as pd

    frames, sources = [], {}
    for path in find(path_or_glob):
        frame, meta = read_one(path)
        rank = meta.get("rank", 0)
        if rank in sources:
            raise ValueError(
                f"{str(sources[rank])!r} and {str(path)!r} both hold rank {rank}: they are two "
                "runs, not one job. Load each with scn.load() and compare them with scn.compare().")
        sources[rank] = path
        frames.append((rank, frame))
    frames.sort(key=lambda item: item[0])
    merged = pd.concat([f for _, f in frames], ignore_index=True)
    merged.attrs[ATTRS] = {"files": [str(sources[r]) for r, _ in frames],
                           "extras": [e for _, f in frames for e in f.attrs[ATTRS]["extras"]]}
    return merged


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
    return ranked(Tracks.from_frame(source), top)


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
