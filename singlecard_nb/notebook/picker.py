"""The device picker (ipywidgets): every GPU with its memory, load and users; Pin, Unpin, Refresh.

It only reads the pin wing (`devices`, what `auto` would choose) and pins through `session`, so
the picker and `%singlecard` always agree; nothing here decides which device to pin.
ipywidgets is imported when a picker is made, so importing this module costs nothing.
"""

from __future__ import annotations

import html
import threading
import traceback
from typing import Any, Callable

from .. import borrow, session
from ..pinning import devices, pinning, render
from ..pinning.render import Column, Row, gib, mig_label, mig_number

_BAR_COLOURS = ((0.9, "#d62728"), (0.6, "#ff7f0e"), (0.0, "#2ca02c"))  # used fraction -> colour


# --- small renderers (pure functions, tested directly) --------------------------------------


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
        f'<span style="display:inline-block;width:{width_px}px;height:9px;background:#e6e6e6;'
        f'vertical-align:middle;border-radius:2px">'
        f'<span style="display:block;width:{fraction * 100:.1f}%;height:100%;background:{colour};'
        f'border-radius:2px"></span></span> '
        f'<span style="font-size:11px">{gib(used)} / {gib(total)} GiB</span>'
    )


def _auto_choice(machine: Any) -> tuple[str | None, str]:
    """(UUID, why) of what `pin("auto")` would choose; asked of pinning so both always agree."""
    if not machine.gpus:
        return None, ""
    try:
        choice = pinning.auto_choice(machine)  # the one place the rule is written
    except pinning.TargetError as e:  # e.g. an allocation with no GPU: say so, offer the CPU
        return None, str(e)
    return choice.uuid, choice.note


def _offered(device: Any, show_outside: bool) -> bool:
    """Whether the Device list offers this GPU or MIG device (never one that cannot be pinned)."""
    return device.unusable is None and (device.in_allocation or show_outside)


# --- device picker --------------------------------------------------------------------------


def picker(machine: Any = None) -> Any:
    """Make the device picker panel (display it, or leave it as a cell's last expression).

    machine: a `devices.Machine` to show instead of reading NVML (tests, described machines);
    with one given, *Refresh* keeps showing it.
    """
    return _picker_class()(machine=machine)


_PICKER_CLASS: Any = None


def _picker_class() -> Any:
    # The class derives from ipywidgets.VBox, so it is built on first use to keep ipywidgets
    # out of `import singlecard_nb.widgets`.
    global _PICKER_CLASS
    if _PICKER_CLASS is None:
        _PICKER_CLASS = _make_picker_class()
    return _PICKER_CLASS


def __getattr__(name: str) -> Any:
    if name == "Picker":
        return _picker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_picker_class() -> Any:
    import ipywidgets as W

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
            self.header.value = _header_html(machine, state)
            self.table.value = _table_html(machine, auto, pinned_uuid, why)
            outside = any(d.unusable is None and not d.in_allocation
                          for g in machine.gpus for d in (g, *g.mig))
            self.show_outside.layout.display = None if outside else "none"
            options = _options(machine, auto, self.show_outside.value)
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

        def _say(self, message: str, colour: str = "#333") -> None:
            self.status.value = (f'<div style="color:{colour};white-space:pre-wrap;'
                                 f'font-size:12px">{html.escape(message)}</div>')

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
                self._say(f"Not pinned: {e}", "#c00")
            except Exception as e:
                self._say(f"Error: {type(e).__name__}: {e} (traceback below)", "#c00")
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
                    if target != "cpu" and _find(now, target) is None:
                        self._render()
                        raise pinning.TargetError(
                            f"{_drawn_as(drawn, target)} is no longer on this machine (it fell "
                            "off the bus or was reset since the panel was drawn). The panel "
                            "now shows the GPUs as they are; choose again.")
                device = _find(now, target)
                force = device is not None and not device.in_allocation
                state = session.pin(target, machine=now, force=force)
                with self._lock:
                    self._render()
                self._say(_describe_pin(state), "#060" if state.hard else "#c60")

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
                              "#c00")
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

    return Picker


def _current_shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def _device_words(state: Any) -> str:
    return "the CPU (all GPUs hidden)" if state.gpu is None else state.describe_device()


def _describe_pin(state: Any) -> str:
    return state.summary()


def _header_html(machine: Any, state: Any) -> str:
    source = html.escape(str(getattr(machine, "source", "")))
    driver = getattr(machine, "driver_version", None)
    lines = [f"<b>GPUs</b> <span style='color:#777;font-size:11px'>({source}"
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
    return "<br>".join(lines)


def _find(machine: Any, uuid: str) -> Any:
    """The GPU or MIG device with this UUID on `machine`, or None."""
    return next((d for g in machine.gpus for d in (g, *g.mig) if d.uuid and d.uuid == uuid), None)


def _drawn_as(machine: Any, uuid: str) -> str:
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
        marks.append("<b style='color:#060'>● pinned</b>")  # no emoji: many fonts lack it
    if uuid and uuid == auto:
        marks.append("<span style='color:#06c'>★ auto</span>")
    if device.unusable is not None:
        marks.append(f"<span style='color:#c00' title='{html.escape(device.unusable)}'>"
                     "unusable</span>")
    elif not device.in_allocation:
        marks.append("<span style='color:#999'>outside allocation</span>")
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
            style = " style='background:#eaf6ea'"
        elif device.unusable is not None or not device.in_allocation:
            style = " style='color:#999'"
        else:
            style = ""
        return f" class='{css_class}'{style}"

    return attributes


def _table_html(machine: Any, auto: str | None, pinned: str | None, why: str = "") -> str:
    if not machine.gpus:
        reason = html.escape(machine.reason or "no GPU found")
        return (f"<div style='padding:4px 0'>No GPUs: {reason}. "
                "The CPU can still be pinned (it hides every GPU from this kernel).</div>")
    table = render.table_html(
        machine, _columns(auto, pinned), row_attributes=_row_attributes(pinned),
        table_attributes=" class='singlecard-gpus' style='border-collapse:collapse;font-size:12px'",
        cell_attributes=" style='padding:2px 8px;text-align:left'")
    notes = []
    if why:
        colour = "#06c" if auto else "#c60"
        mark = "★ " if auto else ""
        notes.append(f"<div style='font-size:11px;color:{colour}'>{mark}{html.escape(why)}</div>")
    notes += [f"<div style='font-size:11px;color:#c60'>{html.escape(line)}</div>"
              for line in render.problems(machine)]
    return table + "".join(notes)


def _options(machine: Any, auto: str | None, show_outside: bool = False) -> list[tuple[str, str]]:
    options = []
    for gpu in machine.gpus:
        if _offered(gpu, show_outside) and (not gpu.mig or any(
                _offered(m, show_outside) for m in gpu.mig)):
            star = "  ★ auto" if gpu.uuid == auto else ""
            outside = "" if gpu.in_allocation else "  (outside allocation: forced)"
            options.append((f"GPU {gpu.index} · {gpu.name} · {short_uuid(gpu.uuid)}{star}{outside}",
                            gpu.uuid))
        for mig in gpu.mig:
            if not _offered(mig, show_outside):
                continue
            star = "  ★ auto" if mig.uuid == auto else ""
            outside = "" if mig.in_allocation else "  (outside allocation: forced)"
            options.append((f"  {mig_label(gpu.index, mig.index)} · {mig.name} · "
                            f"{short_uuid(mig.uuid)}{star}{outside}", mig.uuid))
    options.append(("CPU (hide all GPUs)", "cpu"))
    return options
