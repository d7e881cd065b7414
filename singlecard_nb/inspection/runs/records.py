"""Records that outlive the process: saved per rank, loaded and merged, gathered across a job.

The file format is SQLite, one file per rank. Why: pandas reads it with nothing but Python's own
`sqlite3` (`pd.read_sql_query("select * from records", sqlite3.connect(path))`), it stores
float64 exactly (JSON keeps 15 digits, CSV needs care), it is safe to open (a pickle runs code
and breaks across pandas versions: a cluster job and a laptop often differ), and any tool can
query it. Parquet and Feather would need pyarrow, HDF5 PyTables: heavy for a debugging aid.
SQLite has no column types for tuples or nullable integers, so a second table lists each
column's pandas type and `load` restores it: shapes come back as tuples, counts as Int64.

Nothing here knows the frame's columns beyond their types, so a column added to the frame later
is saved and loaded like the others.

Beside the rows, two tables keep what the ranking reads that is no row: `record_channels`, the
per-channel statistics of the model's inputs (a row per step, input and channel), and
`record_param_groups`, the optimiser's param groups as stepped (a row per step and group, the
group's parameters as a JSON list of paths). A loaded frame carries them, condensed, in
`frame.attrs["singlecard_nb"]["extras"]`, so it ranks as the live inspector did. Files written
before these tables existed load without them.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ...job import place
from ..causes.series import ATTRS
from .record_file import (
    CHANNELS_COLUMNS,
    CHANNELS_TABLE,
    COLUMNS_TABLE,
    FORMAT,
    GROUPS_COLUMNS,
    GROUPS_TABLE,
    LOSSES_COLUMNS,
    LOSSES_TABLE,
    META_TABLE,
    ROWS_TABLE,
    SQL_TYPES,
    is_sqlite,
    quoted,
)
from .record_reading import read_one


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


# --- saving -----------------------------------------------------------------------------------
def rank_path(path: str | os.PathLike, rank: int, world_size: int) -> Path:
    """Where rank `rank` writes: `{rank}` in the path is filled in; a directory gets
    `rank<N>.db`; in a job of several processes `run.db` becomes `run.rank<N>.db`."""
    text = os.fspath(path)
    if "{" in text:
        try:
            return Path(text.format(rank=rank))
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"cannot save records to {text!r}: the only field a path may hold "
                             "is {rank} (write {{ and }} for literal braces)") from e
    target = Path(text)
    if target.is_dir() or text.endswith(("/", os.sep)):
        return target / f"rank{rank}.db"
    if world_size > 1:
        return target.with_name(f"{target.stem}.rank{rank}{target.suffix}")
    return target


def _kind(series) -> str:
    """How a column is stored and restored: a pandas dtype name, or tuple / json / str."""
    import pandas as pd

    dtype = series.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "boolean" if isinstance(dtype, pd.BooleanDtype) else "bool"
    if pd.api.types.is_numeric_dtype(dtype):
        return str(dtype)
    if not pd.api.types.is_object_dtype(dtype):  # pandas' string dtype, categoricals, datetimes: kept as text
        return "str"
    values = series.dropna()
    if len(values) and all(isinstance(v, tuple) for v in values):
        return "tuple"
    if all(isinstance(v, str) for v in values):
        return "str"
    return "json"


def _column_values(series, kind: str) -> list:
    """Python values SQLite can bind (None for missing; SQLite stores a float NaN as NULL)."""
    if kind in ("tuple", "json"):
        encoded: dict = {}  # shapes repeat: encode each distinct one once

        def encode(value):
            try:
                text = encoded.get(value)
            except TypeError:  # a list: not hashable
                return json.dumps(value, default=str)
            if text is None:
                text = encoded[value] = json.dumps(value, default=str)
            return text

        return [None if v is None else encode(v) for v in series]
    if kind.startswith(("float", "int", "uint", "bool")):  # numpy dtypes: no missing values
        return series.to_numpy().tolist()
    values = series.astype(object).where(series.notna(), None)
    if kind.startswith(("Int", "UInt", "boolean")):
        return [None if v is None else int(v) for v in values]
    if kind.startswith("Float"):
        return [None if v is None else float(v) for v in values]
    return [None if v is None else str(v) for v in values]


def save(frame, path: str | os.PathLike, meta: dict[str, Any] | None = None,
         extras: Iterable[dict] = ()) -> Path:
    """Write `frame` (one process's rows) to an SQLite file for this rank; returns its path.

    extras: what each recorded step held beside its rows (`StepRecord.extras`: the model's
        input channels, the optimiser's param groups), kept in tables of their own.

    The file is written beside its final name and moved into place, so a reader never sees a
    half-written file and an earlier file of the same name is replaced whole.
    """
    rank, world_size = place()
    target = rank_path(path, rank, world_size)
    kinds = {name: _kind(frame[name]) for name in frame.columns}
    info = {"format": FORMAT, "rank": rank, "world_size": world_size,
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": os.uname().nodename if hasattr(os, "uname") else "", **(meta or {})}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # a name no other thread or process writing the same target can have
        handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                        dir=target.parent)
        os.close(handle)
    except OSError as e:
        raise _save_error(target, e) from e
    partial = Path(name)
    db = None
    try:
        db = sqlite3.connect(partial)
        with db:
            names = [quoted(name) for name in frame.columns]
            types = [SQL_TYPES.get(kind.rstrip("0123456789"), "TEXT") for kind in kinds.values()]
            db.execute(f"CREATE TABLE {ROWS_TABLE} "
                       f"({', '.join(f'{n} {t}' for n, t in zip(names, types))})")
            columns = [_column_values(frame[name], kind) for name, kind in kinds.items()]
            db.executemany(f"INSERT INTO {ROWS_TABLE} VALUES ({', '.join('?' * len(names))})",
                           zip(*columns))
            db.execute(f"CREATE TABLE {COLUMNS_TABLE} (position INTEGER, name TEXT, kind TEXT)")
            db.executemany(f"INSERT INTO {COLUMNS_TABLE} VALUES (?, ?, ?)",
                           [(i, str(n), k) for i, (n, k) in enumerate(kinds.items())])
            db.execute(f"CREATE TABLE {META_TABLE} (key TEXT, value TEXT)")
            db.executemany(f"INSERT INTO {META_TABLE} VALUES (?, ?)",
                           [(k, json.dumps(v, default=str)) for k, v in info.items()])
            _write_extras(db, extras)
        db.close()
        db = None
        os.replace(partial, target)
    except (OSError, sqlite3.Error) as e:  # a full disk, no permission: say which file
        raise _save_error(target, e) from e
    finally:
        if db is not None:  # an open connection would keep the deleted file's space
            db.close()
        partial.unlink(missing_ok=True)
    return target


def _write_extras(db: sqlite3.Connection, extras: Iterable[dict]) -> None:
    """The extras' two tables, by named columns (see the module docstring)."""
    channels, groups, losses = [], [], []
    for item in extras:
        step = int(item.get("step", 0))
        for index, found in (item.get("channels") or {}).items():
            shape = json.dumps(list(found.get("shape") or ()))
            channels += [(step, str(index), shape, c, *map(_real, values[:3]))
                         for c, values in enumerate(found.get("values") or ())]
        for group in item.get("optimizer") or ():
            frozen = group.get("frozen")
            groups.append((step, str(group.get("optimizer", "")), int(group.get("group", 0)),
                           _real(group.get("lr")), _real(group.get("weight_decay")),
                           json.dumps([str(p) for p in group.get("params", ())]),
                           None if frozen is None else json.dumps([str(p) for p in frozen]),
                           *(_whole(group.get(k)) for k in ("eval", "scaled", "carried"))))
        loss = item.get("loss") or {}
        ops = json.dumps([str(op) for op in loss.get("ops", ())])
        losses += [(step, _real(v), ops, int(loss.get("shared", 1)))
                   for v in loss.get("values", ())]
    for table, columns, rows in ((CHANNELS_TABLE, CHANNELS_COLUMNS, channels),
                                 (GROUPS_TABLE, GROUPS_COLUMNS, groups),
                                 (LOSSES_TABLE, LOSSES_COLUMNS, losses)):
        db.execute(f"CREATE TABLE {table} "
                   f"({', '.join(f'{n} {t}' for n, t in columns.items())})")
        db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})", rows)


def _whole(value: Any) -> int | None:
    return None if value is None else int(value)


def _real(value: Any) -> float | None:
    """A float SQLite keeps (it stores NaN as NULL: so does this)."""
    if value is None:
        return None
    value = float(value)
    return None if value != value else value


def _save_error(target: Path, error: Exception) -> OSError:
    number = getattr(error, "errno", None)
    return OSError(number, f"could not save records to {str(target)!r}: {error}", str(target))


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
