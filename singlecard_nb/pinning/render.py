"""How GPUs are shown to people: one name for each device, one table for every view of them.

`Machine`'s text and HTML tables and the device picker's table are all drawn by `table_text` /
`table_html` from the same rows, each with its own choice of columns. Objects are read by
attribute (a `model.Machine`, its `GpuInfo` and `MigInfo`), so the model can render itself
through this module without the two importing each other.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import theme

_GIB = 1024**3


def gib(n: int | None) -> str:
    """Bytes as GiB with one decimal ("?" when unknown): every GPU memory figure shown."""
    return "?" if n is None else f"{n / _GIB:.1f}"


def mig_number(gpu_index: int, mig_index: int) -> str:
    """`3/1`: MIG device 1 of GPU 3, as every message, table and list numbers it."""
    return f"{gpu_index}/{mig_index}"


def mig_label(gpu_index: int, mig_index: int) -> str:
    """`MIG 3/1`: how tables, lists and short messages name a MIG device."""
    return f"MIG {mig_number(gpu_index, mig_index)}"


def processes_text(processes: Iterable[Any]) -> str:
    """`4242 alice python 0.5 GiB, ...` (`-` when none)."""
    parts = []
    for p in processes:
        who = " ".join(x for x in (p.user, p.name) if x)
        memory = "" if p.memory is None else f" {gib(p.memory)} GiB"
        parts.append(f"{p.pid}{' ' + who if who else ''}{memory}")
    return ", ".join(parts) or "-"


def users_text(processes: Sequence[Any]) -> str:
    """`idle`, `1 process: alice`, `2 processes: bob, carol`: who uses a GPU, briefly."""
    if not processes:
        return "idle"
    users = sorted({p.user for p in processes if p.user})
    text = f"{len(processes)} process{'es' if len(processes) != 1 else ''}"
    return text + (f": {', '.join(users)}" if users else "")


def can_pin_text(device: Any) -> str:
    if device.unusable is not None:
        return "no: unusable"
    return "yes" if device.in_allocation else "outside allocation"


def problems(machine: Any) -> list[str]:
    """One line per GPU or MIG device that is unusable or has fields NVML could not read."""
    lines = []
    for gpu in machine.gpus:
        for device, label in ((gpu, f"GPU {gpu.index}"),
                              *((m, mig_label(gpu.index, m.index)) for m in gpu.mig)):
            if device.unusable is not None:
                lines.append(f"{label} cannot be pinned: {device.unusable}")
            if device.unknown:
                lines.append(f"{label}: " + "; ".join(f"{name} unknown ({why})"
                                                      for name, why in device.unknown))
    return lines


# --- the table --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One line of a GPU table: a GPU, or one of its MIG devices (`mig`)."""

    gpu: Any
    mig: Any = None

    @property
    def device(self) -> Any:
        return self.gpu if self.mig is None else self.mig

    @property
    def label(self) -> str:
        return str(self.gpu.index) if self.mig is None else mig_label(self.gpu.index,
                                                                      self.mig.index)

    def memory(self) -> str:
        return f"{gib(self.device.memory_used)} / {gib(self.device.memory_total)} GiB"

    def utilization(self) -> str:
        if self.mig is not None:
            return ""
        if self.gpu.utilization is None:
            return "?" if self.gpu.why_unknown("utilization") else "-"
        return f"{self.gpu.utilization}%"

    def processes(self, summary: Callable[[Sequence[Any]], str] = processes_text) -> str:
        if self.mig is not None:
            return ""
        return summary(self.gpu.processes) if self.gpu.processes_known else "?"


def rows(machine: Any) -> list[Row]:
    """Every GPU, each followed by its MIG devices."""
    return [row for gpu in machine.gpus for row in (Row(gpu), *(Row(gpu, m) for m in gpu.mig))]


@dataclass(frozen=True)
class Column:
    """A column of a GPU table: its header, its text, and (optionally) its own HTML."""

    header: str
    text: Callable[[Row], str]
    html: Callable[[Row], str] | None = None  # default: the text, escaped

    def cell_html(self, row: Row) -> str:
        return self.html(row) if self.html is not None else html.escape(self.text(row))


MACHINE_COLUMNS = (
    Column("GPU", lambda r: r.label if r.mig is None else f"  {r.label}"),
    Column("CUDA", lambda r: "" if r.mig is not None else (
        "-" if r.gpu.cuda_ordinal is None else str(r.gpu.cuda_ordinal))),
    Column("name", lambda r: r.device.name),
    Column("memory used / total", Row.memory),
    Column("free", lambda r: f"{gib(r.device.memory_free)} GiB"),
    Column("util", Row.utilization),
    Column("processes", Row.processes),
    Column("can pin", lambda r: can_pin_text(r.device)),
    Column("UUID", lambda r: r.device.uuid or "?"),
)


def table_text(machine: Any, columns: Sequence[Column] = MACHINE_COLUMNS) -> list[str]:
    """The table as aligned text lines, header first."""
    cells = [[c.header for c in columns]] + [[c.text(r) for c in columns] for r in rows(machine)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in cells]


def _greyed_if_not_pinnable(row: Row) -> str:
    return f" style='color:{theme.MUTED}'" if can_pin_text(row.device) != "yes" else ""


def table_html(machine: Any, columns: Sequence[Column] = MACHINE_COLUMNS, *,
               row_attributes: Callable[[Row], str] = _greyed_if_not_pinnable,
               table_attributes: str = "", cell_attributes: str = "") -> str:
    """The table as HTML; the attribute strings (each starting with a space) style it."""
    head = "".join(f"<th{cell_attributes}>{html.escape(c.header)}</th>" for c in columns)
    body = "".join(
        f"<tr{row_attributes(row)}>"
        + "".join(f"<td{cell_attributes}>{c.cell_html(row)}</td>" for c in columns) + "</tr>"
        for row in rows(machine)
    )
    return f"<table{table_attributes}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --- a whole machine (what `repr(machine)` and the notebook show) -----------------------------

def title(machine: Any) -> str:
    driver = f", driver {machine.driver_version}" if machine.driver_version else ""
    if not machine.gpus:
        return f"No GPUs ({machine.source}{driver}): {machine.reason}"
    return f"{len(machine.gpus)} GPU(s) ({machine.source}{driver})"


def notes(machine: Any) -> list[str]:
    """Lines under the table: the allocation, what each column means, what could not be read."""
    lines = []
    if machine.allocation is not None:
        lines.append(f"Allocation: {machine.allocation_text()}; GPUs outside it are not "
                     "offered (pin one anyway with --force, or force=True).")
    lines.append("CUDA = ordinal under CUDA_DEVICE_ORDER=PCI_BUS_ID and the current "
                 "CUDA_VISIBLE_DEVICES ('-' = hidden)")
    return lines + problems(machine)


def machine_text(machine: Any) -> str:
    lines = [title(machine)]
    if machine.gpus:
        lines += table_text(machine) + notes(machine)
    return "\n".join(lines)


def machine_html(machine: Any) -> str:
    head = f"<b>{html.escape(title(machine))}</b>"
    root = f"<div class='{theme.NO_MATH_CLASSES}'>"
    if not machine.gpus:
        return theme.no_math(f"{root}{head}</div>")
    small = "<br>".join(html.escape(line) for line in notes(machine))
    return theme.no_math(f"{root}{head}{table_html(machine)}<small>{small}</small></div>")
