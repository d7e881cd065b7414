"""The record file's layout, shared by writing (records.py) and reading (record_reading.py):
table and column names, the SQLite types of pandas' kinds, and how a file is known as SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
