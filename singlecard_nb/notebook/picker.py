"""The device picker (ipywidgets): every GPU with its memory, load and users; Pin, Unpin, Refresh.

It only reads the pin wing (`devices`, what `auto` would choose) and pins through `session`, so
the picker and `%singlecard` always agree; nothing here decides which device to pin. The widget
is picker_widget.py (ipywidgets, imported when a picker is made, so importing this module costs
nothing); what it draws (the table, the pin line, the choices) is picker_view.py.
"""

from __future__ import annotations

from typing import Any

from .picker_view import memory_bar, short_uuid

__all__ = ["memory_bar", "picker", "short_uuid"]  # and Picker, made on first use


def picker(machine: Any = None) -> Any:
    """Make the device picker panel (display it, or leave it as a cell's last expression).

    machine: a `devices.Machine` to show instead of reading NVML (tests, described machines);
    with one given, *Refresh* keeps showing it.
    """
    return _picker_class()(machine=machine)


def _picker_class() -> Any:
    # The class derives from ipywidgets.VBox: its module is imported on first use, to keep
    # ipywidgets out of `import singlecard_nb`.
    from .picker_widget import Picker

    return Picker


def __getattr__(name: str) -> Any:
    if name == "Picker":
        return _picker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
