"""The GPUs of this machine: read through NVML, or a described machine, or one injected.

`read_machine()` is the one way the rest of singlecard_nb asks: `use_machine()` (tests, demos)
or `SINGLECARD_NB_MACHINE=/path/machine.json` replace NVML with a described machine, which is
how the tests and notebooks show a 4-GPU box on a CPU-only runner. The machine model, the NVML
reader, the file checker and the renderer live in their own modules and are re-exported here,
so `devices.Machine`, `devices.read_nvml`, `devices.MachineFileError` keep their names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from . import machine_file
from .machine_file import MACHINE_ENV, MachineFileError
from .model import ALLOCATION_ENV, GpuInfo, Machine, MigInfo, ProcessInfo
from .nvml import read_nvml
from .render import gib, problems

__all__ = ["ALLOCATION_ENV", "MACHINE_ENV", "GpuInfo", "Machine", "MachineFileError", "MigInfo",
           "ProcessInfo", "gib", "problems", "read_machine", "read_nvml", "use_machine",
           "use_nvml"]

_injected: Machine | None = None
_injected_nvml: Any = None


def use_machine(machine: Machine | None) -> None:
    """Make `read_machine()` return `machine` (tests, demos); None goes back to NVML."""
    global _injected
    _injected = machine


def use_nvml(nvml: Any) -> None:
    """Make `read_machine()` ask this pynvml-like module (tests: a fake NVML that fails on
    purpose); None goes back to the real pynvml."""
    global _injected_nvml
    _injected_nvml = nvml


def read_machine(
    environ: Mapping[str, str] | None = None,
    allocation_environ: Mapping[str, str] | None = None,
) -> Machine:
    """The GPUs of this machine: injected, described by SINGLECARD_NB_MACHINE, or from NVML.

    Never raises for "no GPU" or a failing NVML; never starts the CUDA driver. A broken
    SINGLECARD_NB_MACHINE file raises `MachineFileError` (one line naming file, entry, field).
    `cuda_ordinal` is computed for `environ` (default `os.environ`), `in_allocation` for
    `allocation_environ` (default: `environ`).
    """
    environ = os.environ if environ is None else environ
    if _injected is not None:
        return _injected.with_ordinals(environ, allocation_environ)
    path = environ.get(MACHINE_ENV)
    if path:
        machine = Machine.from_checked(machine_file.read(path), source=f"described: {path}")
        return machine.with_ordinals(environ, allocation_environ)
    return read_nvml(_injected_nvml, environ=environ, allocation_environ=allocation_environ)
