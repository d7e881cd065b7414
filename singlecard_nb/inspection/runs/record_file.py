"""The record file: its layout, its writing (`save`, one file per rank) and its reading
(`read_one`), in one place so that a column written is a column read.

The file format is SQLite, one file per rank. Why: pandas reads it with nothing but Python's own
`sqlite3` (`pd.read_sql_query("select * from records", sqlite3.connect(path))`), it stores
float64 exactly (JSON keeps 15 digits, CSV needs care), it is safe to open (a pickle runs code
and breaks across pandas versions: a cluster job and a laptop often differ), and any tool can
query it. Parquet and Feather would need pyarrow, HDF5 PyTables: heavy for a debugging aid.
SQLite has no column types for tuples or nullable integers, so a second table lists each
column's pandas type and `load` restores it: shapes come back as tuples, counts as Int64.

Nothing here knows the frame's columns beyond their types, so a column added to the frame later
is saved and loaded like the others.

Beside the rows, three tables keep what the ranking reads that is no row: `record_channels`, the
per-channel statistics of the model's inputs (a row per step, input and channel),
`record_param_groups`, the optimiser's param groups as stepped (a row per step and group, the
group's parameters as a JSON list of paths), and `record_losses`, what loss.backward() was
called on. A loaded frame carries them, condensed, in `frame.attrs["singlecard_nb"]["extras"]`,
so it ranks as the live inspector did. Files written before these tables existed load without
them.

Reading takes only the tables and columns `save` writes, every value checked and bounded by the
file's size, every refusal naming the file (a crafted file is refused, never trusted: see
docs/compare.md).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...job import place
from ..causes import ATTRS, condensed

# --- the layout -------------------------------------------------------------------------------
FORMAT = 1  # the extras' tables are optional: a reader that ignores them still reads the rows
ROWS_TABLE, COLUMNS_TABLE, META_TABLE = "records", "record_columns", "record_meta"
CHANNELS_TABLE, GROUPS_TABLE = "record_channels", "record_param_groups"
LOSSES_TABLE = "record_losses"
# name -> SQLite type, in the order written: the extras' tables hold nothing else
CHANNELS_COLUMNS = {"step": "INTEGER", "input": "TEXT", "shape": "TEXT", "channel": "INTEGER",
                    "mean": "REAL", "std": "REAL", "absmax": "REAL"}
GROUPS_COLUMNS = {"step": "INTEGER", "optimizer": "TEXT", "param_group": "INTEGER",
                  "lr": "REAL", "weight_decay": "REAL", "params": "TEXT",
                  "frozen": "TEXT", "eval": "INTEGER", "scaled": "INTEGER", "carried": "INTEGER"}
# columns added after the first files with the table: read where present, else left unknown
# (the rules that need them say nothing of such a file)
LATER_GROUPS_COLUMNS = frozenset({"frozen", "eval", "scaled", "carried"})
# what loss.backward() was called on: a row per loss, with its last autograd operations
LOSSES_COLUMNS = {"step": "INTEGER", "value": "REAL", "ops": "TEXT", "shared": "INTEGER"}
# The rows' columns every insp.save() writes (the Inspector's frame, recording/store.COLUMNS:
# tests/test_records_adversarial.py ties them), each with the kinds save gives it and whether a
# value may be missing (NULL: a statistic not taken, NaN). `training` came in after the first
# files, which load without it.
TEXT, WHOLE, NUMBER, FLAG, SHAPE = "text", "a whole number", "a number", "a flag", "a shape"
ROW_COLUMNS = {
    "step": (WHOLE, False), "module": (TEXT, False), "type": (TEXT, False),
    "call": (WHOLE, False), "io": (TEXT, False), "index": (TEXT, False),
    "shape": (SHAPE, False), "dtype": (TEXT, False), "device": (TEXT, False),
    "mean": (NUMBER, True), "std": (NUMBER, True), "min": (NUMBER, True),
    "max": (NUMBER, True), "absmax": (NUMBER, True), "nan": (NUMBER, True),
    "inf": (NUMBER, True), "zeros": (NUMBER, True), "rank": (WHOLE, False),
    "training": (FLAG, False),
}
OPTIONAL_COLUMNS = frozenset({"training"})
_SQLITE_MAGIC = b"SQLite format 3\x00"
# pandas type -> SQLite column type
SQL_TYPES = {"int": "INTEGER", "Int": "INTEGER", "uint": "INTEGER", "UInt": "INTEGER",
              "bool": "INTEGER", "boolean": "INTEGER", "float": "REAL", "Float": "REAL"}


def model_part(name: str) -> str:
    """A model's name as part of a file name (`run.<part>.db`): a class named `a/b` or `T{x}`
    saves too; a second instance's `Linear#2` is `Linear-2`."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


def quoted(name: Any) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


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



# --- reading ------------------------------------------------------------------------------
class _NotRecords(ValueError):
    """A readable file that is not (or not yet) one `load` understands; the message names it."""


def read_one(path: Path):
    """(frame, meta) of one record file."""
    if not is_sqlite(path):
        raise ValueError(f"{str(path)!r} is not a file written by insp.save() (not SQLite)")
    try:
        return _read_tables(path)
    except _NotRecords:
        raise
    except (sqlite3.Error, ValueError, TypeError, KeyError, RecursionError) as e:
        raise ValueError(f"{str(path)!r} could not be read as saved records (truncated, or not "
                         f"written by insp.save()): {type(e).__name__}: {e}") from e


# The kinds `_kind` writes; `astype` is given nothing else (a crafted "S2000000000" would
# allocate gigabytes per row)
_NUMERIC_KINDS = frozenset(
    [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
    + [f"{sign}Int{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64)]
    + [f"float{bits}" for bits in (16, 32, 64)] + ["Float32", "Float64"])
_KINDS = _NUMERIC_KINDS | {"tuple", "json", "str", "bool", "boolean"}
_LENGTH_SLACK = 1 << 16  # SQLite's longest value may exceed the file by this little


def _read_tables(path: Path):
    """The frame and metadata of one file, reading only the tables and columns `save` writes;
    nothing a value or the schema holds can make it bigger than the file (bounded)."""
    import pandas as pd

    where = repr(str(path))
    # a path, never a URI: '#' or '%' in a file name would otherwise cut or change it
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    db = sqlite3.connect(uri, uri=True)
    try:
        # no value (nor row) longer than the file: a generated column or a function in the
        # schema could otherwise make gigabytes from a few bytes
        limit = getattr(sqlite3, "SQLITE_LIMIT_LENGTH", None)
        if limit is not None and hasattr(db, "setlimit"):
            db.setlimit(limit, max(os.path.getsize(path), 0) + _LENGTH_SLACK)
        db.execute("PRAGMA trusted_schema = OFF")
        # Only real tables, made by CREATE TABLE: a crafted view (a recursive one) could run
        # without end, a virtual table reads what its module wants.
        schema = {name: sql for name, sql in db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table'")}
        mine = (ROWS_TABLE, COLUMNS_TABLE, META_TABLE)
        if not all(str(schema.get(t, "")).lstrip().upper().startswith("CREATE TABLE")
                   for t in mine):
            raise _NotRecords(f"{where} is an SQLite file but not one written by insp.save()")
        for table, names in ((COLUMNS_TABLE, ("position", "name", "kind")),
                             (META_TABLE, ("key", "value"))):
            _ordinary_columns(db, table, names, where)
        meta = {}
        for key, value in db.execute(f"SELECT key, value FROM {META_TABLE}"):
            if not isinstance(key, str) or not isinstance(value, str):
                raise _NotRecords(f"{where}: its metadata holds a {type(key).__name__} key "
                                  f"{_short(key)} (or value): not one written by insp.save()")
            meta[key] = json.loads(value)
        kinds = {}
        for name, kind in db.execute(f"SELECT name, kind FROM {COLUMNS_TABLE} ORDER BY position"):
            if not isinstance(name, str) or kind not in _KINDS:
                raise _NotRecords(f"{where}: column {_short(name)} has kind {_short(kind)}, "
                                  "which insp.save() never writes")
            kinds[name] = kind
        _ordinary_columns(db, ROWS_TABLE, tuple(kinds), where)
        columns = ", ".join(quoted(name) for name in kinds) or "NULL"
        frame = pd.read_sql_query(f"SELECT {columns} FROM {ROWS_TABLE}", db)
        if not kinds:
            frame = frame.iloc[:, :0]
        extras = _read_extras(db, schema, where)
    finally:
        db.close()
    _check_meta(meta, where)
    _check_rows(frame, kinds, where)
    for name, kind in kinds.items():
        frame[name] = _restore(frame[name], kind)
    rank = meta.get("rank", 0)
    frame.attrs[ATTRS] = {"extras": [dict(e, rank=rank) for e in condensed(extras)]}
    return frame, meta


_MAX_CHANNEL = 1 << 16  # more than the recorder splits (4096): a larger index is no record's
_MAX_TEXT = 4096  # an input's index or an optimiser's class name: short


def _read_extras(db: sqlite3.Connection, schema: dict, where: str) -> list[dict]:
    """The steps' extras from the two tables `save` writes beside the rows (absent in files
    written before them), every value checked for the type `save` gives it."""
    by_step: dict[int, dict] = {}
    for table, columns, add in ((CHANNELS_TABLE, CHANNELS_COLUMNS, _add_channel),
                                (GROUPS_TABLE, GROUPS_COLUMNS, _add_group),
                                (LOSSES_TABLE, LOSSES_COLUMNS, _add_loss)):
        if table not in schema:
            continue
        if not str(schema[table] or "").lstrip().upper().startswith("CREATE TABLE"):
            raise _NotRecords(f"{where}: {table} is not a plain table: not a file written by "
                              "insp.save()")
        present = {row[1] for row in db.execute(f"PRAGMA table_xinfo({table})")}
        columns = [c for c in columns if c in present or c not in LATER_GROUPS_COLUMNS]
        _ordinary_columns(db, table, tuple(columns), where)
        names = ", ".join(columns)
        for values in db.execute(f"SELECT {names} FROM {table} ORDER BY rowid"):
            row = dict(zip(columns, values))
            step = row["step"]
            if type(step) is not int:
                raise _NotRecords(f"{where}: {table} holds step {_short(step)}, not a whole "
                                  "number: not a file written by insp.save()")
            try:
                add(by_step.setdefault(step, {"step": step}), row)
            except (TypeError, ValueError, KeyError) as e:
                raise _NotRecords(f"{where}: a row of {table} at step {step} is not one "
                                  f"insp.save() writes ({e})") from None
    return [by_step[step] for step in sorted(by_step)]


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"{what} {_short(value)} is no short text")
    return value


def _float(value: Any, what: str) -> float:
    """A REAL as saved: a number, or NULL for NaN."""
    if value is None:
        return math.nan
    if type(value) not in (int, float):
        raise ValueError(f"{what} {_short(value)} is no number")
    return float(value)


def _json_list(value: Any, what: str, item: type, longest: int | None = _MAX_TEXT) -> list:
    if not isinstance(value, str) or (longest is not None and len(value) > longest):
        raise ValueError(f"{what} {_short(value)} is no short text")
    found = json.loads(value)
    if not isinstance(found, list) or not all(type(v) is item for v in found):
        raise ValueError(f"{what} {_short(value)} is no list of {item.__name__}")
    return found


def _add_channel(extras: dict, row: dict) -> None:
    index = _text(row["input"], "input")
    channel = row["channel"]
    if type(channel) is not int or not 0 <= channel < _MAX_CHANNEL:
        raise ValueError(f"channel {_short(channel)} is no channel number")
    item = extras.setdefault("channels", {}).setdefault(
        index, {"shape": tuple(_json_list(row["shape"], "shape", int)), "values": []})
    if channel != len(item["values"]):  # written 0, 1, 2 ... per step and input
        raise ValueError(f"channel {channel} follows {len(item['values'])} channels")
    item["values"].append([_float(row[k], k) for k in ("mean", "std", "absmax")])


def _add_group(extras: dict, row: dict) -> None:
    group = row["param_group"]
    if type(group) is not int or group < 0:
        raise ValueError(f"param_group {_short(group)} is no group number")
    lr, decay = _float(row["lr"], "lr"), _float(row["weight_decay"], "weight_decay")
    found = {
        "optimizer": _text(row["optimizer"], "optimizer"), "group": group,
        "lr": None if lr != lr else lr, "weight_decay": None if decay != decay else decay,
        "params": _json_list(row["params"], "params", str, longest=None)}
    if row.get("frozen") is not None:  # a file with the later columns
        found["frozen"] = _json_list(row["frozen"], "frozen", str, longest=None)
    for key in ("eval", "scaled", "carried"):
        if row.get(key) is not None:
            found[key] = _count(row[key], key)
    extras.setdefault("optimizer", []).append(found)


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} {_short(value)} is no count")
    return value


def _add_loss(extras: dict, row: dict) -> None:
    loss = extras.setdefault("loss", {"values": [], "ops": [], "shared": 1})
    loss["values"].append(_float(row["value"], "value"))
    loss["ops"] = _json_list(row["ops"], "ops", str)
    loss["shared"] = max(loss["shared"], _count(row["shared"], "shared"))


def _ordinary_columns(db: sqlite3.Connection, table: str, names: tuple, where: str) -> None:
    """Refuse `table` unless `names` are ordinary columns of it (not generated ones)."""
    found = {row[1]: row[6] for row in db.execute(f"PRAGMA table_xinfo({table})")}
    for name in names:
        hidden = found.get(name)
        if hidden is None:
            raise _NotRecords(f"{where}: table {table} has no column {name!r}: not a file "
                              "written by insp.save()")
        if hidden:  # generated (computed when read) or hidden: insp.save() makes neither
            raise _NotRecords(f"{where}: column {name!r} of {table} is computed when read "
                              "(a generated column): not a file written by insp.save()")


_WHOLE_KINDS = frozenset(k for k in _NUMERIC_KINDS if "int" in k.lower())
_KINDS_OF = {TEXT: {"str"}, WHOLE: _WHOLE_KINDS, NUMBER: _NUMERIC_KINDS, SHAPE: {"tuple"},
             FLAG: {"bool", "boolean"}}


def _check_rows(frame, kinds: dict, where: str) -> None:
    """Refuse rows the views could not read: a column every save writes missing (from the
    rows, or from the list of columns), of a kind save never gives it, or empty where save
    always writes a value. One line naming the file and what is wrong."""
    missing = [c for c in ROW_COLUMNS if c not in kinds and c not in OPTIONAL_COLUMNS]
    if missing:
        raise _NotRecords(f"{where}: its {COLUMNS_TABLE} lists no column {', '.join(missing)}, "
                          "which insp.save() always writes: not a file written by insp.save(), "
                          "or edited since")
    if not len(frame):
        return  # no rows: save wrote the columns of an empty frame as text
    for name, (family, nullable) in ROW_COLUMNS.items():
        kind = kinds.get(name)
        if kind is None:
            continue
        if kind not in _KINDS_OF[family]:
            raise _NotRecords(f"{where}: column {name!r} has kind {kind!r}, where insp.save() "
                              f"writes {family}: not a file written by insp.save(), or edited "
                              "since")
        if not nullable:
            empty = frame[name].isna()
            if empty.any():
                count = int(empty.sum())
                raise _NotRecords(f"{where}: {count} of its {len(frame)} records "
                                  f"{'has' if count == 1 else 'have'} no {name} (NULL; the "
                                  f"first is row {int(empty.idxmax()) + 1}), where insp.save() "
                                  "always writes one: not a file written by insp.save(), or "
                                  "edited since")


def _check_meta(meta: dict, where: str) -> None:
    version = meta.get("format", 0)
    if type(version) is not int:
        raise _NotRecords(f"{where}: its format {_short(version)} is no number: not a file "
                          "written by insp.save()")
    if version > FORMAT:
        raise _NotRecords(f"{where} was written by a newer singlecard_nb (format "
                          f"{version!r}); upgrade singlecard_nb to read it")
    for key, least in (("rank", 0), ("world_size", 1)):
        value = meta.get(key, least)
        if type(value) is not int or value < least:
            raise _NotRecords(f"{where}: its {key} is {_short(value)}, not a whole number "
                              f"≥ {least}: not a file written by insp.save()")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _restore(series, kind: str):
    import pandas as pd

    if kind == "tuple":
        decoded: dict[str, tuple] = {}
        return pd.Series([None if v is None else decoded.get(v) or decoded.setdefault(
            v, tuple(json.loads(v))) for v in series], index=series.index, dtype=object)
    if kind == "json":
        return pd.Series([None if v is None else json.loads(v) for v in series],
                         index=series.index, dtype=object)
    if kind == "str":
        return series.astype("str") if series.notna().all() else series
    if kind == "bool":
        return series.astype(bool)
    return series.astype(kind)
