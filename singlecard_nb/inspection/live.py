"""The live inspection view: one table that follows an Inspector while it records.

`insp.live()` draws it. In a notebook it is one output updated in place through IPython's
`display(..., display_id=True)` (IPython is imported only when a view is made); in a script the
final table is printed when the inspector stops. It lives beside `plots.py` because it is a view
of an Inspector, and the engine may not import the notebook layer above it.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any

from .. import borrow

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Any) -> str:
    """Unicode sparkline scaled to the series' own range; NaN shown as `·`."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "·" * len(values)
    low, high = min(finite), max(finite)
    span = high - low
    chars = []
    for v in values:
        if v is None or math.isnan(v):
            chars.append("·")
        elif math.isinf(v):
            chars.append("!")
        else:
            level = 0 if span == 0 else round((v - low) / span * (len(_SPARK) - 1))
            chars.append(_SPARK[level])
    return "".join(chars)


def _current_shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def display(*args: Any, **kwargs: Any) -> Any:
    """IPython's display, imported on first use (tests patch this name)."""
    from IPython.display import display as ipython_display

    return ipython_display(*args, **kwargs)


_MAX_ROWS = 40
_HISTORY = 30
_STATS = ("mean", "std", "min", "max", "absmax")


class LiveView:
    """One HTML output that follows an Inspector while it records, updated in place.

    Updates are throttled to at most `max_rate` per second and never take more than about a
    tenth of the time between them; the last state is drawn when the cell ends and when the
    inspector stops, and stays in the saved notebook.
    """

    def __init__(self, insp: Any, max_rate: float = 4.0, history_stat: str = "absmax",
                 shell: Any = None):
        self.insp = insp
        self.history_stat = history_stat
        self.min_interval = 1.0 / max_rate
        self._interval = self.min_interval
        self._last_render = -math.inf
        self._dirty = False
        self._rendering = False
        self._handle: Any = None
        self._shell = shell if shell is not None else _current_shell()
        self._owner = borrow.Borrowed("live inspection view")
        self.renders = 0  # how many times the view was drawn (tests, curiosity)
        self.error: str | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def attach(self) -> LiveView:
        """Display the view and follow the inspector until it stops.

        Without IPython (a script) nothing is displayed while training; the final table is
        printed when the inspector stops.
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
        started = time.perf_counter()
        try:
            bundle = self._bundle()
        except Exception as e:  # drawing must never break the training loop
            self.error = f"{type(e).__name__}: {e}"
            bundle = {"text/plain": f"live view failed: {self.error}",
                      "text/html": f"<pre style='color:#c00'>live view failed: "
                                   f"{html.escape(self.error)}</pre>"}
        finally:
            self._rendering = False
        self._dirty = False  # the bundle already holds anything flushed while it was built
        if self._handle is not None:
            self._handle.update(bundle, raw=True)
        elif self._shell is None and not self._owner.active:
            print(bundle["text/plain"])  # a script's final state
        self.renders += 1
        finished = time.perf_counter()
        self._last_render = finished
        # Back off when drawing is slow (thousands of modules): keep it near 10 % of the time.
        self._interval = max(self.min_interval, 10 * (finished - started))

    # --- content ------------------------------------------------------------------------
    def _rows(self) -> list[dict[str, Any]]:
        """One dict per module from the last recorded step's outputs."""
        # history() first: it flushes a pending step, so last_step() then matches it
        history = _history_tail(self.insp, self.history_stat)
        last = self.insp.last_step()
        if last is None or last.empty:
            return []
        outputs = last[last["io"] == "output"]
        # Plain Python over records: a pandas groupby per draw costs ~0.2 ms per module.
        by_module: dict[str, dict[str, Any]] = {}
        for rec in outputs.to_dict("records"):
            row = by_module.get(rec["module"])
            nan, inf = _count(rec["nan"]), _count(rec["inf"])
            if row is None:  # the first output tensor of the module's first call
                by_module[rec["module"]] = {
                    "module": rec["module"], "type": rec["type"], "shape": rec["shape"],
                    "dtype": str(rec["dtype"]), "nan": nan, "inf": inf, "tensors": 1,
                    "spark": sparkline(history.get(rec["module"], [])),
                    **{stat: rec[stat] for stat in _STATS}}
            else:
                row["nan"] += nan
                row["inf"] += inf
                row["tensors"] += 1
                row["absmax"] = _nanmax(row["absmax"], rec["absmax"])
        rows = list(by_module.values())
        # Non-finite modules first, so a NaN is visible even in a 5 000-module model.
        rows.sort(key=lambda r: 0 if (r["nan"] or r["inf"]) else 1)
        return rows

    def _step(self) -> Any:
        last = self.insp.last_step()
        return None if last is None or last.empty else int(last["step"].max())

    def _bundle(self) -> dict[str, str]:
        rows = self._rows()
        return {"text/plain": self._text(rows), "text/html": self._html(rows)}

    def _html(self, rows: list[dict[str, Any]]) -> str:
        step = self._step()
        state = "recording" if getattr(self.insp, "active", False) else "stopped"
        bad = [r for r in rows if r["nan"] or r["inf"]]
        head = (f"<div style='font-size:12px;margin-bottom:2px'><b>live inspection</b> · "
                f"step {'–' if step is None else step} · {len(rows)} modules · {state}"
                f" · updated {time.strftime('%H:%M:%S')}</div>")
        if bad:
            names = ", ".join(f"<code>{html.escape(r['module'] or '(root)')}</code>"
                              for r in bad[:5])
            head += (f"<div style='color:#fff;background:#c00;padding:2px 6px;font-size:12px'>"
                     f"NaN/Inf in {len(bad)} module(s): {names}</div>")
        if not rows:
            return head + "<div style='font-size:12px;color:#777'>no step recorded yet</div>"
        cell = "style='padding:1px 6px;text-align:right;font-family:monospace'"
        left = "style='padding:1px 6px;text-align:left;font-family:monospace'"
        columns = ("module", "type", "shape", *_STATS, "nan", "inf",
                   f"{self.history_stat} (last {_HISTORY})")
        th = "".join(f"<th {left}>{c}</th>" for c in columns)
        body = []
        for r in rows[:_MAX_ROWS]:
            hot = r["nan"] or r["inf"]
            style = " style='background:#fdd'" if hot else ""
            stats = "".join(f"<td {cell}>{_num(r[s])}</td>" for s in _STATS)
            flag = "style='padding:1px 6px;text-align:right;font-family:monospace;color:#c00;font-weight:bold'"
            body.append(
                f"<tr class='singlecard-live-row'{style}>"
                f"<td {left}>{html.escape(r['module'] or '(root)')}</td>"
                f"<td {left}>{html.escape(str(r['type']))}</td>"
                f"<td {left}>{html.escape(_shape(r['shape']))}</td>{stats}"
                f"<td {flag if r['nan'] else cell}>{r['nan']}</td>"
                f"<td {flag if r['inf'] else cell}>{r['inf']}</td>"
                f"<td {left}>{html.escape(r['spark'])}</td></tr>")
        more = ""
        if len(rows) > _MAX_ROWS:
            more = (f"<div style='font-size:11px;color:#777'>… {len(rows) - _MAX_ROWS} more "
                    "modules (all in insp.frame())</div>")
        return (head + "<table class='singlecard-live' style='border-collapse:collapse;"
                f"font-size:11px'><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody>"
                f"</table>{more}")

    def _text(self, rows: list[dict[str, Any]] | None = None) -> str:
        rows = self._rows() if rows is None else rows
        step = self._step()
        lines = [f"live inspection · step {'-' if step is None else step} · {len(rows)} modules"]
        for r in rows[:_MAX_ROWS]:
            flag = f"  NaN={r['nan']} Inf={r['inf']}" if (r["nan"] or r["inf"]) else ""
            lines.append(f"  {(r['module'] or '(root)'):<30} {_shape(r['shape']):<18} "
                         f"absmax={_num(r['absmax']):<10} {r['spark']}{flag}")
        if len(rows) > _MAX_ROWS:
            lines.append(f"  … {len(rows) - _MAX_ROWS} more modules")
        return "\n".join(lines)


def _history_tail(insp: Any, stat: str) -> dict[str, list[float]]:
    table = insp.history(stat, "output")
    if table is None or table.empty:
        return {}
    tail = table.iloc[:, -_HISTORY:]
    return {str(module): [float(v) for v in values] for module, values in zip(tail.index, tail.to_numpy())}


def _count(value: Any) -> int:
    try:
        return 0 if value is None or math.isnan(value) else int(value)
    except TypeError:
        return 0


def _nanmax(a: Any, b: Any) -> Any:
    """max that lets NaN win: a NaN absmax is exactly what the view must not hide."""
    try:
        if math.isnan(a) or math.isnan(b):
            return math.nan
        return max(a, b)
    except TypeError:
        return a if b is None else b


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "" if value is None else str(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.3g}"


def _shape(shape: Any) -> str:
    if isinstance(shape, (tuple, list)):
        return "(" + ", ".join(str(s) for s in shape) + ")"
    return str(shape)


def live_view(insp: Any, max_rate: float = 4.0, history_stat: str = "absmax") -> LiveView:
    """Display a view of `insp` that updates in place while it records; returns the view.

    max_rate: most updates per second. history_stat: the statistic drawn as a sparkline.
    """
    return LiveView(insp, max_rate=max_rate, history_stat=history_stat).attach()
