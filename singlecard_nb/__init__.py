"""singlecard_nb: debug multi-GPU PyTorch code in Jupyter on one card.

Importing this package is cheap and never starts CUDA: submodules (and pandas, matplotlib,
ipywidgets) load on first use of the name that needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "Machine": "pinning.devices",
    "GpuInfo": "pinning.devices",
    "gpus": "session",
    "pin": "session",
    "release": "session",
    "device": "session",
    "status": "session",
    "current": "session",
    "TargetError": "session",
    "single_card": "session",
    "unwrap": "session",
    "Status": "pinning.report",
    "inspect": "inspection.engine",
    "Inspector": "inspection.engine",
    "inspector": "inspection.engine",
    "inspect_all": "inspection.finding",
    "inspectors": "inspection.finding",
    "NonFiniteError": "errors",
    "compare": "inspection.runs",
    "compare_ranks": "inspection.runs",
    "load": "inspection.runs",
    "findings": "inspection.runs",
    "explain": "diagnosis.explain",
    "fit": "session",
    "Explanation": "diagnosis.explain",
    "picker": "notebook.picker",
}

__all__ = sorted(_EXPORTS) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'singlecard_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext singlecard_nb`: register the magics (and pin if SINGLECARD_NB_DEVICE is set)."""
    from .notebook.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext singlecard_nb`: give back every hook, patch, callback and variable."""
    from .notebook.extension import unload

    unload(ipython)
