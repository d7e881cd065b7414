"""Described machines: the JSON a SINGLECARD_NB_MACHINE file holds, checked field by field.

`check(data)` turns a described machine (docs/internals.md, "Described machines") into
plain checked fields, or raises ValueError naming the entry and field that is wrong
(`gpus[1].memory_total: ...`); `read(path)` does the same for a file and raises
`MachineFileError`, one line naming the file too. `model.Machine` builds itself from the
checked fields.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

MACHINE_ENV = "SINGLECARD_NB_MACHINE"

_MACHINE_KEYS = {"gpus", "reason", "driver_version"}
_GPU_KEYS = {"index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used", "memory_free",
             "utilization", "processes", "mig", "unknown", "unusable"}
_PROCESS_KEYS = {"pid", "user", "memory", "name"}
_MIG_KEYS = {"index", "uuid", "name", "memory_total", "memory_used", "unknown", "unusable"}
_ABSENT = object()
# A description of hundreds of GPUs with their processes is some hundred KiB; beyond this a file
# is no machine description (and reading it would cost its size in memory)
MAX_FILE_BYTES = 4 << 20

Unknown = tuple[tuple[str, str], ...]  # (field, why it could not be read)


class MachineFileError(ValueError):
    """A SINGLECARD_NB_MACHINE file that is missing, not JSON, or not a described machine."""


def check(data: Any) -> dict[str, Any]:
    """The checked fields of a described machine: `gpus` (each GPU's fields, with `processes`
    and `mig` lists of fields), `reason`, `driver_version`. Raises ValueError naming the field."""
    data = _object(data, "the machine", _MACHINE_KEYS)
    entries = _typed(data, "gpus", list, "a list of GPU objects", "the machine", [])
    gpus = [_gpu(g, f"gpus[{position}]") for position, g in enumerate(entries)]
    _unique(gpus)
    reason = _typed(data, "reason", str, "a string", "the machine", None)
    if not gpus and reason is None:
        reason = "the described machine has no GPUs"
    driver = _typed(data, "driver_version", str, "a string", "the machine", None)
    return {"gpus": gpus, "reason": reason, "driver_version": driver}


def read(path: str) -> dict[str, Any]:
    """The checked fields of the machine described in file `path` (raises MachineFileError)."""
    where = f"{MACHINE_ENV}={path}"
    try:
        text = _regular_file_text(path, where)
    except OSError as e:
        raise MachineFileError(f"{where}: cannot read the file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise MachineFileError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)  # NaN / Infinity are read, then refused naming their field
    except json.JSONDecodeError as e:
        raise MachineFileError(f"{where}: not valid JSON: {e.msg} at line {e.lineno} "
                               f"column {e.colno}") from None
    except RecursionError:
        raise MachineFileError(f"{where}: nested too deeply to be a machine description "
                               "(a machine is an object of gpus, each an object)") from None
    except ValueError as e:  # a number of thousands of digits
        raise MachineFileError(f"{where}: not a machine description: {e}") from None
    try:
        return check(data)
    except ValueError as e:
        raise MachineFileError(f"{where}: {e}") from None


def _regular_file_text(path: str, where: str) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES. Opened without blocking and
    checked before reading: a FIFO would wait for a writer forever, /dev/zero never ends."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MachineFileError(f"{where}: not a regular file (a {_kind(info.st_mode)}); "
                                   "point it at a JSON file describing the machine")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise MachineFileError(f"{where}: {len(data):,}+ bytes, larger than a machine "
                               f"description can be ({MAX_FILE_BYTES:,} bytes at most)")
    return data.decode("utf-8")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


# --- one field at a time ----------------------------------------------------------------------

def _shown(value: Any) -> str:
    """A JSON value as the file spells it (null, Infinity, "text")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(data: Any, where: str, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected an object, got {_shown(data)}")
    # Keys starting with "_" are comments; any other unknown key is most likely a typo.
    unknown = sorted(k for k in data if not (isinstance(k, str) and k.startswith("_"))
                     and k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return data


def _typed(data: Mapping[str, Any], key: str, kind: type, words: str, where: str,
           default: Any = _ABSENT) -> Any:
    value = data.get(key, _ABSENT)
    if value is _ABSENT:
        if default is _ABSENT:
            raise ValueError(f"{where}.{key}: missing (expected {words})")
        return default
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}.{key}: expected {words}, got {_shown(value)}")
    return value


def _whole(data: Mapping[str, Any], key: str, where: str, default: Any = _ABSENT, *,
           nullable: bool = False, at_most: int | None = None) -> Any:
    """A non-negative whole number (bytes, pids, indices); a JSON 8.5e10 that is whole is fine."""
    words = "a whole number ≥ 0" + ("" if at_most is None else f" and ≤ {at_most}")
    words += " or null" if nullable else ""
    value = data.get(key, _ABSENT)
    if value is _ABSENT:
        if default is _ABSENT:
            raise ValueError(f"{where}.{key}: missing (expected {words})")
        return default
    if value is None and nullable:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if (not isinstance(value, int) or isinstance(value, bool) or value < 0
            or (at_most is not None and value > at_most)):
        raise ValueError(f"{where}.{key}: expected {words}, got {_shown(value)}")
    return value


def _unknown(data: Mapping[str, Any], where: str) -> Unknown:
    value = data.get("unknown", {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{where}.unknown: expected an object of field -> reason strings, "
                         f"got {_shown(value)}")
    return tuple(value.items())


def _memory_pair(data: Mapping[str, Any], where: str, unknown: Unknown) -> tuple[Any, Any]:
    # Memory a description marks unknown is None; otherwise absent means 0 (a bare example).
    default = None if "memory" in dict(unknown) else 0
    return (_whole(data, "memory_total", where, default),
            _whole(data, "memory_used", where, default))


def _uuid(data: Mapping[str, Any], where: str, words: str, unusable: str | None) -> str:
    uuid = _typed(data, "uuid", str, words, where, "" if unusable is not None else _ABSENT)
    if not uuid and unusable is None:
        raise ValueError(f"{where}.uuid: empty (expected {words}; a device whose UUID cannot "
                         "be read says why in 'unusable')")
    return uuid


def _mig(data: Any, where: str, position: int) -> dict[str, Any]:
    data = _object(data, where, _MIG_KEYS)
    unusable = _typed(data, "unusable", str, "a string", where, None)
    unknown = _unknown(data, where)
    total, used = _memory_pair(data, where, unknown)
    return {
        "index": _whole(data, "index", where, position),
        "uuid": _uuid(data, where, "a MIG UUID string", unusable),
        "name": _typed(data, "name", str, "a string", where, "MIG device"),
        "memory_total": total, "memory_used": used, "unknown": unknown, "unusable": unusable,
    }


def _process(data: Any, where: str) -> dict[str, Any]:
    data = _object(data, where, _PROCESS_KEYS)
    return {
        "pid": _whole(data, "pid", where),
        "user": _typed(data, "user", str, "a string or null", where, None),
        "memory": _whole(data, "memory", where, None, nullable=True),
        "name": _typed(data, "name", str, "a string or null", where, None),
    }


def _gpu(data: Any, where: str) -> dict[str, Any]:
    data = _object(data, where, _GPU_KEYS)
    unusable = _typed(data, "unusable", str, "a string", where, None)
    unknown = _unknown(data, where)
    total, used = _memory_pair(data, where, unknown)
    free_default = None if total is None or used is None else max(total - used, 0)
    processes = _typed(data, "processes", list, "a list of process objects", where, [])
    migs = _typed(data, "mig", list, "a list of MIG device objects", where, [])
    return {
        "index": _whole(data, "index", where),
        "uuid": _uuid(data, where, "a GPU UUID string", unusable),
        "name": _typed(data, "name", str, "a string", where),
        "pci_bus_id": _typed(data, "pci_bus_id", str, "a string or null", where, None),
        "memory_total": total,
        "memory_used": used,
        "memory_free": _whole(data, "memory_free", where, free_default, nullable=True),
        "utilization": _whole(data, "utilization", where, None, nullable=True, at_most=100),
        "processes": [_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)],
        "mig": [_mig(m, f"{where}.mig[{i}]", i) for i, m in enumerate(migs)],
        "unknown": unknown,
        "unusable": unusable,
    }


def _unique(gpus: list[dict[str, Any]]) -> None:
    seen_index: dict[int, int] = {}
    seen_uuid: dict[str, str] = {}
    for position, gpu in enumerate(gpus):
        if gpu["index"] in seen_index:
            raise ValueError(f"gpus[{position}].index: {gpu['index']} is already "
                             f"gpus[{seen_index[gpu['index']]}]'s index")
        seen_index[gpu["index"]] = position
        for where, uuid in ((f"gpus[{position}].uuid", gpu["uuid"]),
                            *((f"gpus[{position}].mig[{i}].uuid", m["uuid"])
                              for i, m in enumerate(gpu["mig"]))):
            if uuid and uuid in seen_uuid:
                raise ValueError(f"{where}: {uuid!r} is already {seen_uuid[uuid]}")
            seen_uuid[uuid] = where
