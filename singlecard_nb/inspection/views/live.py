"""The live inspection view: one table that follows an Inspector while it records.

`insp.live()` draws it. In a notebook it is one output updated in place through IPython's
`display(..., display_id=True)` (IPython is imported only when a view is made); in a script the
final table is printed when the inspector stops. It lives beside the figures (`heatmap.py`)
because it is a view of an Inspector, and the engine may not import the notebook layer above it.
"""

from __future__ import annotations

import html
import itertools
import math
import time
from typing import Any

from ... import borrow
from . import live_html, ranking
from .formatting import num as _num
from .formatting import shape, sparkline  # noqa: F401  (sparkline: the view's, for scripts)
from .ranking import Row

_views = itertools.count(1)


def _current_shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def updates_in_place(shell: Any) -> bool:
    """Whether a display in `shell` can be updated in place: a Jupyter kernel's can; a terminal
    IPython prints every update anew (a 25-line table twice a second, and in a log file)."""
    return shell is not None and not any(
        c.__name__ == "TerminalInteractiveShell" for c in type(shell).__mro__)


def display(*args: Any, **kwargs: Any) -> Any:
    """IPython's display, imported on first use (tests patch this name)."""
    from IPython.display import display as ipython_display

    return ipython_display(*args, **kwargs)


TOP = 40  # rows drawn before a search: the ranked head of a 5 000-module model
# Drawing may take this share of the time between drawings at most (slow draws back off).
_DRAW_SHARE = 0.04


class LiveView:
    """One HTML output that follows an Inspector while it records, updated in place.

    Updates are throttled to at most `max_rate` per second and never take more than 4 % of the
    time between them; the last state is drawn when the cell ends and when the
    inspector stops, and stays in the saved notebook.
    """

    def __init__(self, insp: Any, max_rate: float = 4.0, top: int = TOP, shell: Any = None):
        self.insp = insp
        self.top = top
        self._tracks = ranking.Tracks()
        # Names this view's state (search, sort, pins) in the page across its updates.
        self._view_id = f"scn-live-{next(_views)}-{id(self):x}"
        self.min_interval = 1.0 / max_rate
        self._interval = self.min_interval
        self._last_render = -math.inf
        self._dirty = False
        self._rendering = False
        self._handle: Any = None
        shell = shell if shell is not None else _current_shell()
        # a terminal IPython is drawn to as a script is: the final table when it stops
        self._shell = shell if updates_in_place(shell) else None
        self._owner = borrow.Borrowed("live inspection view")
        self.renders = 0  # how many times the view was drawn (tests, curiosity)
        self.error: str | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def attach(self) -> LiveView:
        """Display the view and follow the inspector until it stops.

        Without IPython (a script) or in a terminal IPython nothing is displayed while
        training; the final table is printed when the inspector stops.
        """
        if self._shell is not None:
            self._handle = display(self._bundle(), raw=True, display_id=True)
        self.renders += 1
        self._last_render = time.perf_counter()
        listener = self._on_step
        self.insp.add_listener(listener)
        self._owner.on_restore(lambda: self.insp.remove_listener(listener), "live view listener")
        if self._shell is not None:
            events, post = self._shell.events, self._post_run_cell
            events.register("post_run_cell", post)
            self._owner.on_restore(lambda: events.unregister("post_run_cell", post),
                                   "post_run_cell: live view")
        return self

    def detach(self) -> None:
        """Draw the final state and stop following the inspector (idempotent)."""
        if self._owner.active:
            self._owner.restore()
            self._render()  # always: at least the label changes from recording to stopped

    def flush(self) -> None:
        """Draw the latest state now if anything changed since the last drawing."""
        if self._dirty:
            self._render()

    def show(self) -> None:
        """Display another copy (it updates together with the first)."""
        display(self._bundle(), raw=True, display_id=self._display_id())

    def _display_id(self) -> Any:
        return getattr(self._handle, "display_id", None)

    def _ipython_display_(self) -> None:
        # `insp.live()` as a cell's last expression: the view is already on screen once.
        if self._handle is None:
            self.attach()

    def __repr__(self) -> str:
        return self._text()

    # --- updates ------------------------------------------------------------------------
    def _on_step(self, insp: Any = None) -> None:
        self._dirty = True
        if not getattr(self.insp, "active", True):
            self.detach()
            return
        if time.perf_counter() - self._last_render >= self._interval:
            self._render()

    def _post_run_cell(self, result: Any = None) -> None:
        self.flush()
        if not getattr(self.insp, "active", False):
            self.detach()

    def _render(self) -> None:
        if self._rendering:  # reading the inspector can flush a step, which calls us again
            return
        self._rendering = True
        # The draw's cost is this thread's CPU time, not the wall clock: on a busy machine a
        # 30 ms draw can take a second of wall time while other processes run, and backing
        # off by that froze the view for 25 s (CI, the browser test beside another worker).
        started = time.thread_time()
        try:
            bundle = self._bundle()
        except Exception as e:  # drawing must never break the training loop
            self.error = f"{type(e).__name__}: {e}"
            bundle = {"text/plain": f"live view failed: {self.error}",
                      "text/html": f"<pre style='color:#d33'>live view failed: "
                                   f"{html.escape(self.error)}</pre>"}
        finally:
            self._rendering = False
        self._dirty = False  # the bundle already holds anything flushed while it was built
        if self._handle is not None:
            self._handle.update(bundle, raw=True)
        elif self._shell is None and not self._owner.active:
            print(bundle["text/plain"])  # a script's final state
        self.renders += 1
        self._last_render = time.perf_counter()
        # Back off when drawing is slow (thousands of modules): a bounded share of the time.
        self._interval = max(self.min_interval, (time.thread_time() - started) / _DRAW_SHARE)

    # --- content ------------------------------------------------------------------------
    def rows(self, search: str | None = None) -> list[Row]:
        """The rows shown, in the view's order (groups collapsed); with `search`, the modules
        matching it (path or type, substring or glob), ungrouped."""
        # The recorded steps, read once each: a draw costs the steps since the last draw.
        self._tracks.feed(self.insp.records())
        rows = ranking.rank(self._tracks)
        return ranking.search(rows, search) if search else rows

    def _step(self) -> Any:
        return self._tracks.last_step

    def _state(self) -> str:
        return "recording" if getattr(self.insp, "active", False) else "stopped"

    def _bundle(self) -> dict[str, str]:
        rows = self.rows()
        step, modules = self._step(), len(self._tracks.by_path)
        return {"text/plain": self._text(rows),
                "text/html": live_html.render(rows, step, modules, self._state(),
                                              view_id=self._view_id, top=self.top)}

    def _text(self, rows: list[Row] | None = None) -> str:
        rows = self.rows() if rows is None else rows
        step = self._step()
        head = (f"live inspection · step {'-' if step is None else step} · "
                f"{len(self._tracks.by_path)} modules · {self._state()}")
        return text_table(rows, head, self.top)


def text_table(rows: list[Row], head: str, top: int) -> str:
    """The rows as text, one line each, in the order the rich view shows them: rank, the full
    module path (a group names its worst member, then its pattern), why, the latest absmax."""
    lines = [head]
    width = min(48, max([len(r.path or "(root)") for r in rows[:top]] + [6]))
    for i, r in enumerate(rows[:top], 1):
        group = f"  [worst of {r.label}, {len(r.members)}]" if r.is_group else ""
        why = f"  {r.why}" if r.why else ""
        kind = "" if r.kind == "output" else f"[{r.kind}] "
        value = "" if r.kind == "optimizer" else f"absmax={_num(r.absmax):<9}"
        lines.append(f"{i:>3} {(r.path or '(root)'):<{width}} {shape(r.shape):<14} "
                     f"{kind}{value}{why}{group}")
    if len(rows) > top:
        lines.append(f"  … {len(rows) - top} more rows")
    return "\n".join(lines)


def live_view(insp: Any, max_rate: float = 4.0, top: int = TOP) -> LiveView:
    """Display a view of `insp` that updates in place while it records; returns the view.

    max_rate: most updates per second. top: rows drawn before a search narrows them.
    """
    return LiveView(insp, max_rate=max_rate, top=top).attach()
