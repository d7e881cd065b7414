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
from ..pinning import devices, pinning
from ..pinning.devices import gib

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


def _users(gpu: Any) -> str:
    processes = list(getattr(gpu, "processes", ()) or ())
    if not processes:
        return "idle"
    users = sorted({p.user for p in processes if p.user})
    text = f"{len(processes)} process{'es' if len(processes) != 1 else ''}"
    return text + (f": {', '.join(users)}" if users else "")


def _auto_choice(machine: Any) -> tuple[str | None, str]:
    """(UUID, why) of what `pin("auto")` would choose; asked of pinning so both always agree."""
    if not machine.gpus:
        return None, ""
    choice = pinning.auto_choice(machine)  # the one place the rule is written
    return choice.uuid, choice.note


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
            self._reader = reader
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
            self.status = W.HTML()
            self.errors = W.Output()  # tracebacks from callbacks land here, visible

            self.pin_button.on_click(self._on_pin)
            self.release_button.on_click(self._on_release)
            self.refresh_button.on_click(self._on_refresh)
            self.auto_refresh.observe(self._on_auto_refresh, names="value")
            controls = W.HBox([self.choice, self.pin_button, self.release_button,
                               self.refresh_button, self.auto_refresh])
            super().__init__(**kwargs)
            self.children = (self.header, self.table, controls, self.status, self.errors)
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
            options = _options(machine, auto)
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
            except pinning.TargetError as e:  # the user's input: say it, no traceback
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
                state = session.pin(target, machine=self.machine)
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
    if state is None:
        lines.append("<span style='font-size:12px'>Not pinned.</span>")
    else:
        lines.append(f"<span style='font-size:12px'><b>Pinned ({html.escape(state.mode)}):</b> "
                     f"{html.escape(_device_words(state))} → "
                     f"<code>{html.escape(str(state.torch_device))}</code></span>")
    return "<br>".join(lines)


def _table_html(machine: Any, auto: str | None, pinned: str | None, why: str = "") -> str:
    if not machine.gpus:
        reason = html.escape(machine.reason or "no GPU found")
        return (f"<div style='padding:4px 0'>No GPUs: {reason}. "
                "The CPU can still be pinned (it hides every GPU from this kernel).</div>")
    cell = "style='padding:2px 8px;text-align:left'"
    head = "".join(f"<th {cell}>{h}</th>" for h in
                   ("#", "name", "UUID", "memory", "util", "used by", ""))
    rows = []
    for gpu in machine.gpus:
        rows.append(_row_html(cell, "singlecard-gpu", str(gpu.index), gpu.name, gpu.uuid, gpu.memory_used,
                              gpu.memory_total,
                              "–" if gpu.utilization is None else f"{gpu.utilization} %",
                              _users(gpu), auto, pinned))
        for mig in gpu.mig:
            rows.append(_row_html(cell, "singlecard-mig", f"{gpu.index}:{mig.index}", f"MIG {mig.name}", mig.uuid,
                                  mig.memory_used, mig.memory_total, "", "", auto, pinned))
    note = (f"<div style='font-size:11px;color:#06c'>★ {html.escape(why)}</div>" if why else "")
    return (f"<table class='singlecard-gpus' style='border-collapse:collapse;font-size:12px'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}")


def _row_html(cell: str, css_class: str, index: str, name: str, uuid: str, used: int | None, total: int | None,
              util: str, users: str, auto: str | None, pinned: str | None) -> str:
    marks = []
    if uuid == pinned:
        marks.append("<b style='color:#060'>● pinned</b>")  # no emoji: many fonts lack it
    if uuid == auto:
        marks.append("<span style='color:#06c'>★ auto</span>")
    background = " style='background:#eaf6ea'" if uuid == pinned else ""
    cells = (html.escape(index), html.escape(name),
             f"<code title='{html.escape(uuid)}'>{html.escape(short_uuid(uuid))}</code>",
             memory_bar(used, total), html.escape(util), html.escape(users), " ".join(marks))
    return f"<tr class='{css_class}'{background}>" + "".join(
        f"<td {cell}>{c}</td>" for c in cells) + "</tr>"


def _options(machine: Any, auto: str | None) -> list[tuple[str, str]]:
    options = []
    for gpu in machine.gpus:
        star = "  ★ auto" if gpu.uuid == auto else ""
        options.append((f"GPU {gpu.index} · {gpu.name} · {short_uuid(gpu.uuid)}{star}", gpu.uuid))
        for mig in gpu.mig:
            star = "  ★ auto" if mig.uuid == auto else ""
            options.append((f"  MIG {gpu.index}:{mig.index} · {mig.name} · "
                            f"{short_uuid(mig.uuid)}{star}", mig.uuid))
    options.append(("CPU (hide all GPUs)", "cpu"))
    return options
