"""`Status`: what `%singlecard status` / `singlecard_nb.status()` shows.

Built from the pin state, a fresh NVML read (memory) and the driver probe; what single-card mode
and the borrowed-state owners are doing is handed in by `session.status()`. Building or rendering
it never starts the CUDA driver (no torch.cuda query).
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import theme
from . import devices
from . import driver as driver_probe
from .model import Machine
from .render import gib
from .state import ENV_VARS, PinState, env_values, environ_before

_MODE_WORDS = {
    "hard": "hard: the other GPUs are hidden from this process",
    "soft": "SOFT: the device is selected, but the other GPUs stay visible to this process",
    "cpu": "cpu",
    "none": "not pinned",
}


@dataclass(frozen=True)
class Status:
    mode: str  # "hard" | "soft" | "cpu" | "none"
    target: str | None
    gpu_index: int | None
    gpu_name: str | None
    gpu_uuid: str | None
    mig_uuid: str | None
    torch_device: str | None
    reason: str
    hard: bool  # other GPUs really hidden (a cpu pin counts when CUDA_VISIBLE_DEVICES took effect)
    env_before: dict[str, str | None]
    env_after: dict[str, str | None]
    driver_started: bool
    driver_how: str
    memory: dict[str, Any] | None  # total / used / free bytes on the pinned card, from NVML
    # (and "unknown": why NVML could not read them, or None)
    default_device: bool = False
    single_card: bool = False
    active: list[tuple[str, list[str]]] = field(default_factory=list)  # owner -> change labels
    parallel: dict[str, Any] | None = None  # parallel.report() when single-card code is loaded
    allocation: str | None = None  # what the kernel's own CUDA_VISIBLE_DEVICES allows, in words
    machine_error: str | None = None  # why the GPUs could not be read (a broken machine file)
    statistics: str | None = None  # how inspection takes statistics, when it has been used

    def rows(self) -> list[tuple[str, str]]:
        """(label, text) pairs: the content both renderings show."""
        mode = _MODE_WORDS.get(self.mode, self.mode)
        if self.mode == "cpu":
            mode += (": all GPUs hidden" if self.hard
                     else ": device() is cpu, but GPUs stay visible to this process")
        rows = [("mode", mode)]
        if self.gpu_uuid is not None:
            device = f"GPU {self.gpu_index} {self.gpu_name} ({self.gpu_uuid})"
            if self.mig_uuid:
                device += f", MIG device {self.mig_uuid}"
            rows.append(("device", f"{device} -> use torch device {self.torch_device}"))
        elif self.torch_device is not None:
            rows.append(("device", f"CPU -> use torch device {self.torch_device}"))
        if self.target is not None:
            rows.append(("target", self.target))
        if self.reason:
            rows.append(("why", self.reason))
        for name in ENV_VARS:
            before, after = self.env_before.get(name), self.env_after.get(name)
            text = _env_text(after) if before == after else f"{_env_text(before)} -> {_env_text(after)}"
            rows.append((name, text))
        if self.allocation is not None:
            rows.append(("allocation", self.allocation))
        if self.machine_error is not None:
            rows.append(("GPUs", f"cannot be read: {self.machine_error}"))
        rows.append(("CUDA driver", ("started" if self.driver_started else "not started")
                     + f" ({self.driver_how})"))
        if self.memory is not None:
            m = self.memory
            if m.get("unknown"):
                rows.append(("memory (NVML)", f"unknown: {m['unknown']}"))
            else:
                rows.append(("memory (NVML)", f"{gib(m['used'])} / {gib(m['total'])} GiB "
                                              f"used, {gib(m['free'])} GiB free"))
        if self.mode != "none":
            rows.append(("options", f"default device: {'yes' if self.default_device else 'no'}; "
                                    f"single-card mode requested: {'yes' if self.single_card else 'no'}"))
        if self.parallel is not None:
            rows += _parallel_rows(self.parallel)
        if self.statistics is not None:
            rows.append(("statistics", self.statistics))
        active = "; ".join(f"{name}: {', '.join(labels)}" for name, labels in self.active)
        rows.append(("active changes", active or "none"))
        return rows

    def __repr__(self) -> str:
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        return "\n".join(["singlecard_nb status"]
                         + [f"  {label.ljust(width)}  {text}" for label, text in rows])

    def _repr_html_(self) -> str:
        # Long values (UUIDs, paths, lists of patches) wrap inside the panel instead of running
        # past its right edge; `$` is never MathJax's.
        wrap = "text-align:left;white-space:normal;overflow-wrap:anywhere;word-break:break-word"
        body = "".join(
            f"<tr><th style='text-align:left;vertical-align:top;white-space:nowrap'>"
            f"{html.escape(label)}</th><td style='{wrap}'>{html.escape(text)}</td></tr>"
            for label, text in self.rows()
        )
        return theme.no_math(
            f"<div class='singlecard-status {theme.NO_MATH_CLASSES}' style='max-width:100%'>"
            "<b>singlecard_nb status</b><table style='table-layout:auto;width:100%;"
            f"max-width:100%'>{body}</table></div>")


def _parallel_rows(p: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Single-card mode's rows: state, what it said (remapped, answered), open gloo listeners."""
    if not p.get("enabled"):
        return [("single-card mode", "off")]
    # What it patched is listed under "active changes", with every other owner's changes.
    rows = [("single-card mode",
             f"on {p.get('device')} ({p.get('wrappers', 0)} wrapper(s), {p.get('groups', 0)} "
             "process group(s) formed)")]
    for i, line in enumerate(p.get("converted", [])):
        rows.append(("single-card made" if i == 0 else "", line))
    for i, line in enumerate(p.get("notices", [])):
        rows.append(("single-card said" if i == 0 else "", line))
    listeners = p.get("listeners", [])
    if listeners:
        rows.append(("gloo listener", f"open on {', '.join(listeners)} (a world-of-one process "
                                      "group; closed by destroy_process_group or "
                                      "`%singlecard off`)"))
    return rows


def _env_text(value: str | None) -> str:
    if value is None:
        return "(unset)"
    return repr(value) if value == "" else value


def _memory(state: PinState | None, machine: Machine | None) -> dict[str, Any] | None:
    if state is None or state.gpu is None or machine is None:
        return None
    for gpu in machine.gpus:
        if state.mig is not None:
            for mig in gpu.mig:
                if mig.uuid == state.mig.uuid:
                    return _figures(mig.memory_total, mig.memory_used, mig.memory_free,
                                    mig.why_unknown("memory"))
        elif gpu.uuid == state.gpu.uuid:
            return _figures(gpu.memory_total, gpu.memory_used, gpu.memory_free,
                            gpu.why_unknown("memory"))
    return None


def _figures(total: int | None, used: int | None, free: int | None,
             unknown: str | None) -> dict[str, Any]:
    figures: dict[str, Any] = {"total": total, "used": used, "free": free}
    if unknown is not None:
        figures["unknown"] = unknown
    return figures


def _read(state: PinState | None, environ: Mapping[str, str]) -> tuple[Any, str | None]:
    """The machine (ordinals now, allocation as before the pin), or why it cannot be read."""
    try:
        return devices.read_machine(environ, allocation_environ=environ_before(environ, state)), None
    except devices.MachineFileError as e:  # status is where one looks when things go wrong
        return None, str(e)


def build_status(
    state: PinState | None,
    environ: Mapping[str, str] | None = None,
    *,
    active: list[tuple[str, list[str]]] | None = None,
    parallel: dict[str, Any] | None = None,
    statistics: str | None = None,
    single_card: bool = False,
) -> Status:
    """A `Status` for `state` (None: not pinned) and the environment `environ`.

    active: (owner, change labels) of everything borrowed. parallel: single-card mode's report.
    statistics: how inspection takes statistics (its one-read kernel, or why not).
    single_card: whether the pin asked for single-card mode (`session.pin(single_card=...)`).
    """
    environ = os.environ if environ is None else environ
    now = env_values(environ)
    driver = driver_probe.driver_state()
    active = active or []
    machine, machine_error = _read(state, environ)
    allocation = None if machine is None else machine.allocation_text()
    if state is None:
        return Status(
            mode="none", target=None, gpu_index=None, gpu_name=None, gpu_uuid=None,
            mig_uuid=None, torch_device=None, reason="", hard=False, env_before=now,
            env_after=now, driver_started=driver.started, driver_how=driver.how, memory=None,
            active=active, parallel=parallel, allocation=allocation,
            machine_error=machine_error, statistics=statistics,
        )
    gpu = state.gpu
    return Status(
        mode=state.mode, target=state.target,
        gpu_index=None if gpu is None else gpu.index,
        gpu_name=None if gpu is None else gpu.name,
        gpu_uuid=None if gpu is None else gpu.uuid,
        mig_uuid=None if state.mig is None else state.mig.uuid,
        torch_device=str(state.torch_device), reason=state.reason, hard=state.hard,
        env_before=dict(state.env_before), env_after=now,
        driver_started=driver.started, driver_how=driver.how,
        memory=_memory(state, machine), default_device=state.default_device,
        single_card=single_card, active=active, parallel=parallel,
        allocation=allocation, machine_error=machine_error, statistics=statistics,
    )
