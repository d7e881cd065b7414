"""What the device picker draws: its GPU table (the one GPU table of `pinning.render`, with
the picker's columns), the pin line above it and the choices below. Pure functions of a
machine and a pin, tested directly; the widget itself is in picker.py.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from .. import theme
from ..pinning import render
from ..pinning.render import Column, Row, gib, mig_label, mig_number

_BAR_COLOURS = ((0.9, "#d62728"), (0.6, "#ff7f0e"), (0.0, "#2ca02c"))  # used fraction -> colour


def short_uuid(uuid: str) -> str:
    """`GPU-2f6d2c1a-...` -> `GPU-2f6d2c1a` (what people type as a unique prefix)."""
    head, _, rest = uuid.partition("-")
    return f"{head}-{rest[:8]}" if rest else uuid[:12]


def memory_bar(used: int | None, total: int | None, width_px: int = 120) -> str:
    """HTML bar of used/total memory with the figures beside it."""
    if not total or used is None:
        return "<span>?</span>"
    fraction = min(max(used / total, 0.0), 1.0)
    colour = next(c for threshold, c in _BAR_COLOURS if fraction >= threshold)
    return (
        f'<span style="display:inline-block;width:{width_px}px;height:9px;background:{theme.TRACK};'
        f'vertical-align:middle;border-radius:2px">'
        f'<span style="display:block;width:{fraction * 100:.1f}%;height:100%;background:{colour};'
        f'border-radius:2px"></span></span> '
        f'<span style="font-size:11px">{gib(used)} / {gib(total)} GiB</span>'
    )


def offered(device: Any, show_outside: bool) -> bool:
    """Whether the Device list offers this GPU or MIG device (never one that cannot be pinned)."""
    return device.unusable is None and (device.in_allocation or show_outside)


def _device_words(state: Any) -> str:
    return "the CPU (all GPUs hidden)" if state.gpu is None else state.describe_device()


def header_html(machine: Any, state: Any) -> str:
    source = html.escape(str(getattr(machine, "source", "")))
    driver = getattr(machine, "driver_version", None)
    lines = [f"<b>GPUs</b> <span style='color:{theme.MUTED};font-size:11px'>({source}"
             f"{', driver ' + html.escape(driver) if driver else ''})</span>"]
    if getattr(machine, "allocation", None) is not None:
        lines.append(f"<span style='font-size:12px'>Allocation: "
                     f"{html.escape(machine.allocation_text())}</span>")
    if state is None:
        lines.append("<span style='font-size:12px'>Not pinned.</span>")
    else:
        lines.append(f"<span style='font-size:12px'><b>Pinned ({html.escape(state.mode)}):</b> "
                     f"{html.escape(_device_words(state))} → "
                     f"<code>{html.escape(str(state.torch_device))}</code></span>")
    return theme.no_math("<br>".join(lines))


def find(machine: Any, uuid: str) -> Any:
    """The GPU or MIG device with this UUID on `machine`, or None."""
    return next((d for g in machine.gpus for d in (g, *g.mig) if d.uuid and d.uuid == uuid), None)


def drawn_as(machine: Any, uuid: str) -> str:
    for gpu in machine.gpus:
        if gpu.uuid == uuid:
            return f"GPU {gpu.index} ({uuid})"
        for mig in gpu.mig:
            if mig.uuid == uuid:
                return f"MIG device {mig_number(gpu.index, mig.index)} ({uuid})"
    return uuid


def _marks(row: Row, auto: str | None, pinned: str | None) -> str:
    device, uuid = row.device, row.device.uuid
    marks = []
    if uuid and uuid == pinned:
        marks.append(f"<b style='color:{theme.GOOD}'>● pinned</b>")  # no emoji: many fonts lack it
    if uuid and uuid == auto:
        marks.append(f"<span style='color:{theme.INFO}'>★ auto</span>")
    if device.unusable is not None:
        marks.append(f"<span style='color:{theme.ERROR}' title='{html.escape(device.unusable)}'>"
                     "unusable</span>")
    elif not device.in_allocation:
        marks.append(f"<span style='color:{theme.MUTED}'>outside allocation</span>")
    return " ".join(marks)


def _uuid_html(row: Row) -> str:
    uuid = row.device.uuid
    return (f"<code title='{html.escape(uuid)}'>{html.escape(short_uuid(uuid))}</code>"
            if uuid else "?")


def _columns(auto: str | None, pinned: str | None) -> tuple[Column, ...]:
    """The picker's columns of the one GPU table (`render.table_html`)."""
    return (
        Column("#", lambda r: r.label),
        Column("name", lambda r: r.device.name),
        Column("UUID", lambda r: r.device.uuid or "?", _uuid_html),
        Column("memory", Row.memory,
               lambda r: memory_bar(r.device.memory_used, r.device.memory_total)),
        Column("util", Row.utilization),
        Column("used by", lambda r: r.processes(render.users_text)),
        Column("", lambda r: "", lambda r: _marks(r, auto, pinned)),
    )


def _row_attributes(pinned: str | None) -> Callable[[Row], str]:
    def attributes(row: Row) -> str:
        css_class = "singlecard-gpu" if row.mig is None else "singlecard-mig"
        device = row.device
        if device.uuid and device.uuid == pinned:
            style = f" style='background:{theme.GOOD_ROW}'"
        elif device.unusable is not None or not device.in_allocation:
            style = f" style='color:{theme.MUTED}'"
        else:
            style = ""
        return f" class='{css_class}'{style}"

    return attributes


def table_html(machine: Any, auto: str | None, pinned: str | None, why: str = "") -> str:
    if not machine.gpus:
        reason = html.escape(machine.reason or "no GPU found")
        return theme.no_math(f"<div style='padding:4px 0'>No GPUs: {reason}. "
                             "The CPU can still be pinned (it hides every GPU from this "
                             "kernel).</div>")
    table = render.table_html(
        machine, _columns(auto, pinned), row_attributes=_row_attributes(pinned),
        table_attributes=" class='singlecard-gpus' style='border-collapse:collapse;font-size:12px'",
        cell_attributes=" style='padding:2px 8px;text-align:left'")
    notes = []
    if why:
        colour = theme.INFO if auto else theme.WARN
        mark = "★ " if auto else ""
        notes.append(f"<div style='font-size:11px;color:{colour}'>{mark}{html.escape(why)}</div>")
    notes += [f"<div style='font-size:11px;color:{theme.WARN}'>{html.escape(line)}</div>"
              for line in render.problems(machine)]
    return theme.no_math(table + "".join(notes))


def options(machine: Any, auto: str | None, show_outside: bool = False) -> list[tuple[str, str]]:
    options = []
    for gpu in machine.gpus:
        if offered(gpu, show_outside) and (not gpu.mig or any(
                offered(m, show_outside) for m in gpu.mig)):
            star = "  ★ auto" if gpu.uuid == auto else ""
            outside = "" if gpu.in_allocation else "  (outside allocation: forced)"
            options.append((f"GPU {gpu.index} · {gpu.name} · {short_uuid(gpu.uuid)}{star}{outside}",
                            gpu.uuid))
        for mig in gpu.mig:
            if not offered(mig, show_outside):
                continue
            star = "  ★ auto" if mig.uuid == auto else ""
            outside = "" if mig.in_allocation else "  (outside allocation: forced)"
            options.append((f"  {mig_label(gpu.index, mig.index)} · {mig.name} · "
                            f"{short_uuid(mig.uuid)}{star}{outside}", mig.uuid))
    options.append(("CPU (hide all GPUs)", "cpu"))
    return options
