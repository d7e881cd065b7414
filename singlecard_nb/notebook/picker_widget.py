"""The device picker's widget: a VBox of the GPU table, the device choice, Pin, Unpin, Refresh
and auto-refresh, wired to `session` (picker.py makes it; picker_view.py draws its parts).

This module imports ipywidgets at once; picker.py imports it only when a picker is made.
"""

from __future__ import annotations

import html
import threading
import traceback
from typing import Any, Callable

import ipywidgets as W

from .. import borrow, session, theme
from ..pinning import devices, pinning
from . import picker_view as view


def _auto_choice(machine: Any) -> tuple[str | None, str]:
    """(UUID, why) of what `pin("auto")` would choose; asked of pinning so both always agree."""
    if not machine.gpus:
        return None, ""
    try:
        choice = pinning.auto_choice(machine)  # the one place the rule is written
    except pinning.TargetError as e:  # e.g. an allocation with no GPU: say so, offer the CPU
        return None, str(e)
    return choice.uuid, choice.note


class Picker(W.VBox):
    """Device picker: one row per GPU (and MIG device), a CPU choice, *Pin*, *Refresh*.

    `choice` (a Dropdown) holds the pin target: a GPU or MIG UUID, or "cpu".
    """

    AUTO_REFRESH_S = 5.0

    def __init__(self, machine: Any = None, reader: Callable[[], Any] | None = None,
                 shell: Any = None, **kwargs: Any):
        if reader is None:
            reader = (lambda: machine) if machine is not None else devices.read_machine
        # Whatever the reader gives is seen as this kernel sees it: the allocation is the
        # CUDA_VISIBLE_DEVICES from before our pin (a scheduler's), not the pin's own.
        self._reader = lambda: pinning.machine_view(reader())
        self._shell = shell
        self._owner = borrow.Borrowed("device picker: auto-refresh")
        self._shell_owner = borrow.Borrowed("device picker: follows the pin")
        self._drawn_state: Any = None
        self._refresh_thread: tuple[threading.Event, threading.Thread] | None = None
        self._lock = threading.Lock()  # a refresh thread and a click may overlap
        self.machine: Any = None

        self.header = W.HTML()
        self.table = W.HTML()
        self.choice = W.Dropdown(description="Device:", layout=W.Layout(width="500px"))
        self.pin_button = W.Button(description="Pin", button_style="primary", icon="thumb-tack",
                                   tooltip="Pin this kernel to the chosen device")
        self.release_button = W.Button(description="Unpin", tooltip="Undo the pin")
        self.refresh_button = W.Button(description="Refresh", icon="refresh",
                                       tooltip="Read the GPUs again")
        self.auto_refresh = W.Checkbox(value=False, indent=False,
                                       description=f"auto-refresh every {self.AUTO_REFRESH_S:g} s")
        self.show_outside = W.Checkbox(
            value=False, indent=False, layout=W.Layout(display="none"),
            description="offer GPUs outside the allocation (pins them with force)")
        self.status = W.HTML()
        self.errors = W.Output()  # tracebacks from callbacks land here, visible

        self.pin_button.on_click(self._on_pin)
        self.release_button.on_click(self._on_release)
        self.refresh_button.on_click(self._on_refresh)
        self.auto_refresh.observe(self._on_auto_refresh, names="value")
        self.show_outside.observe(self._on_show_outside, names="value")
        controls = W.HBox([self.choice, self.pin_button, self.release_button,
                           self.refresh_button, self.auto_refresh])
        super().__init__(**kwargs)
        self.children = (self.header, self.table, controls, self.show_outside, self.status,
                         self.errors)
        self.add_class("singlecard-picker")
        for css_class in theme.NO_MATH_CLASSES.split():
            self.add_class(css_class)
        self.refresh()
        self._follow_pins()

    # --- reading and rendering ------------------------------------------------------
    def refresh(self) -> None:
        """Read the machine again and redraw the rows, keeping the chosen device."""
        with self._lock:
            self.machine = self._reader()
            self._render()

    def _render(self) -> None:
        machine = self.machine
        state = self._drawn_state = session.current()
        auto, why = _auto_choice(machine)
        pinned_uuid = None if state is None else state.uuid
        self.header.value = view.header_html(machine, state)
        self.table.value = view.table_html(machine, auto, pinned_uuid, why)
        outside = any(d.unusable is None and not d.in_allocation
                      for g in machine.gpus for d in (g, *g.mig))
        self.show_outside.layout.display = None if outside else "none"
        options = view.options(machine, auto, self.show_outside.value)
        previous = self.choice.value
        self.choice.options = options
        values = [value for _, value in options]
        if previous in values:
            self.choice.value = previous
        elif pinned_uuid in values:
            self.choice.value = pinned_uuid
        elif state is not None and state.mode == "cpu":
            self.choice.value = "cpu"
        elif auto in values:
            self.choice.value = auto
        else:  # nothing to keep and nothing auto would take (e.g. no GPU allocated)
            self.choice.value = values[0]
        if not machine.gpus:
            self.choice.value = "cpu"

    def _follow_pins(self) -> None:
        """Redraw after any cell that changed the pin (`%singlecard 2` in another cell)."""
        shell = self._shell or _current_shell()
        events = getattr(shell, "events", None)
        if events is None:
            return
        callback = self._on_post_run_cell
        events.register("post_run_cell", callback)
        self._shell_owner.on_restore(lambda: events.unregister("post_run_cell", callback),
                                     "post_run_cell: picker follows the pin")

    def _on_post_run_cell(self, result: Any = None) -> None:
        if session.current() is not self._drawn_state:
            with self._lock:
                self._render()

    def _say(self, message: str, colour: str = theme.TEXT) -> None:
        self.status.value = (f'<div style="color:{colour};white-space:pre-wrap;'
                             f'font-size:12px">{theme.no_math(html.escape(message))}</div>')

    # --- callbacks ------------------------------------------------------------------
    def _guarded(self, action: Callable[[], None]) -> None:
        """Run a callback with the controls disabled; show every error, lose none."""
        buttons = (self.pin_button, self.release_button, self.refresh_button, self.choice)
        for control in buttons:
            control.disabled = True
        try:
            action()
        except (pinning.TargetError, devices.MachineFileError) as e:
            # the user's input or setting, not a bug: say it, no traceback
            self._say(f"Not pinned: {e}", theme.ERROR)
        except Exception as e:
            self._say(f"Error: {type(e).__name__}: {e} (traceback below)", theme.ERROR)
            self._show_traceback()
        finally:
            for control in buttons:
                control.disabled = False

    def _clear_errors(self) -> None:
        if self.errors.outputs:
            self.errors.clear_output()

    def _show_traceback(self) -> None:
        shell = self._shell or _current_shell()
        with self.errors:
            if shell is not None:
                shell.showtraceback()
            else:
                traceback.print_exc()

    def _on_pin(self, _button: Any = None) -> None:
        def pin() -> None:
            target = self.choice.value
            self._clear_errors()
            if target is None:
                raise pinning.TargetError("no device is chosen: choose one in the list")
            # The panel may be minutes old: resolve the chosen UUID on a fresh reading, so
            # a GPU that vanished (or moved to another index) is never pinned by mistake.
            drawn, now = self.machine, self._reader()
            with self._lock:
                self.machine = now
                if target != "cpu" and view.find(now, target) is None:
                    self._render()
                    raise pinning.TargetError(
                        f"{view.drawn_as(drawn, target)} is no longer on this machine (it fell "
                        "off the bus or was reset since the panel was drawn). The panel "
                        "now shows the GPUs as they are; choose again.")
            device = view.find(now, target)
            force = device is not None and not device.in_allocation
            state = session.pin(target, machine=now, force=force)
            with self._lock:
                self._render()
            self._say(state.summary(), theme.GOOD if state.hard else theme.WARN)

        self._guarded(pin)

    def _on_release(self, _button: Any = None) -> None:
        def release() -> None:
            self._clear_errors()
            session.release()
            with self._lock:
                self._render()
            self._say("Unpinned: the environment is as it was before pinning.")

        self._guarded(release)

    def _on_refresh(self, _button: Any = None) -> None:
        self._guarded(self.refresh)

    def _on_show_outside(self, change: dict) -> None:
        with self._lock:
            self._render()

    def _on_auto_refresh(self, change: dict) -> None:
        if change["new"]:
            self._start_auto_refresh()
        else:
            self._owner.restore()

    # --- auto-refresh thread ----------------------------------------------------------
    def _start_auto_refresh(self) -> None:
        if self._refresh_thread is not None:
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._auto_refresh_loop, args=(stop,),
                                  name="singlecard-picker-refresh", daemon=True)
        self._refresh_thread = (stop, thread)
        # Owned so that %unload_ext stops the thread even if the panel is never closed.
        self._owner.on_restore(self._end_auto_refresh, "picker auto-refresh thread")
        thread.start()

    def _end_auto_refresh(self) -> None:
        running, self._refresh_thread = self._refresh_thread, None
        if running is not None:
            stop, thread = running
            stop.set()
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        if self.auto_refresh.value:  # the checkbox tells the truth after unload too
            self.auto_refresh.value = False

    def _auto_refresh_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.AUTO_REFRESH_S):
            try:
                self.refresh()
            except Exception as e:
                self._say(f"Auto-refresh stopped: {type(e).__name__}: {e} (traceback below)",
                          theme.ERROR)
                self._show_traceback()
                self._owner.restore()
                return

    def __repr__(self) -> str:
        # The text/plain fallback of the panel (saved notebooks, terminals): the GPU table.
        state = session.current()
        pinned = state.summary() if state is not None else "Not pinned."
        return f"{self.machine!r}\n{pinned}"

    def close(self) -> None:
        """Close the panel, stop its auto-refresh thread and its cell callback."""
        try:
            self._owner.restore()
        finally:
            self._shell_owner.restore()
            super().close()


def _current_shell() -> Any:
    from IPython import get_ipython

    return get_ipython()
