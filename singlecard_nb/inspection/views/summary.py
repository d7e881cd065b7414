"""`insp.summary()`: the likeliest causes first (the ranking's findings over every recorded
series: inputs, parameters, gradients, the optimiser's groups, outputs), then the per-module
aggregate of an Inspector's output rows in the live view's order (`ranking.py`), rendered as a
table that fits a notebook panel."""

from __future__ import annotations

import html
from typing import Any

from ...theme import NO_MATH_CLASSES
from . import ranking
from .formatting import escape, num, shape, trend

_NOTHING_YET = (
    "no rows recorded yet. If the model did run: code that torch.compile compiled before "
    "inspection started runs without module hooks (torch does not re-check them), so inspect "
    "before compiling, inspect the torch.compile(model) wrapper itself, or call "
    "torch._dynamo.reset().")

FINDINGS = 8  # findings listed above the table
# What a reader needs first, left to right; the rest of `frame` stays in the DataFrame.
SHOWN = ("module", "type", "why", "shape", "absmax", "trend", "std", "mean", "zeros", "nan",
         "inf", "steps", "calls", "dtype", "training")
_NUMBERS = {"absmax", "std", "mean", "zeros"}
# Two classes deep, to win over JupyterLab's table rules (fixed layout, striped rows, cells
# aligned right); tints over the theme's own colours, readable in light and dark themes.
_T = "table.singlecard-summary.singlecard-nb"
_STYLE = (
    f"<style>{_T}{{border-collapse:collapse;font-size:11.5px;color:inherit;"
    "table-layout:auto;width:auto;margin:0}"
    f"{_T} th{{text-align:left;padding:1px 5px;white-space:nowrap;background:none;"
    "border-bottom:1px solid rgba(128,128,128,.5)}"
    f"{_T} td{{padding:1px 5px;border-bottom:1px solid rgba(128,128,128,.15);text-align:left;"
    "font-family:var(--jp-code-font-family,monospace);vertical-align:top}"
    f"{_T} td.n{{text-align:right;white-space:nowrap}}"
    f"{_T} td.m{{min-width:200px;max-width:360px;overflow-wrap:anywhere}}"
    f"{_T} td.w{{min-width:120px;max-width:220px;font-family:inherit}}"
    f"{_T} td.bad{{color:rgb(235,60,60);font-weight:bold}}"
    f"{_T} tbody tr{{background:transparent}}"
    f"{_T} tbody tr.scn-t0{{background:rgba(230,40,40,.22)}}"
    f"{_T} tbody tr.scn-t1{{background:rgba(230,40,40,.10)}}"
    f"{_T} tbody tr.scn-t2{{background:rgba(255,150,0,.16)}}"
    f"{_T} tbody tr.scn-t3{{background:rgba(255,150,0,.08)}}"
    f"{_T} tbody tr.scn-t4{{background:rgba(128,128,128,.14)}}</style>")


class Summary:
    """Per-module aggregate of an Inspector's rows (output tensors), most changed first.

    top: keep the first `top` modules only (the table says how many more there are).
    """

    def __init__(self, inspector: Any, top: int | None = None):
        frame = inspector.frame()
        table = _aggregate(frame)
        self.total = len(table)
        if not table.empty:
            table = _ranked(table, ranking.Tracks.from_frame(frame))
        self.frame = table if top is None else _leaders(table).head(top)
        self.notes = list(inspector.notes)  # what could not be recorded as asked
        # the ranking over every series, causes first: what to look at before the table
        self.findings = inspector.findings(FINDINGS) if hasattr(inspector, "findings") else []

    def _more(self) -> str:
        left = self.total - len(self.frame)
        return f"… {left} more modules (insp.summary() lists all)" if left > 0 else ""

    def _repr_html_(self) -> str:
        notes = "".join(f"<p><b>singlecard_nb</b>: {escape(n)}</p>" for n in self.notes)
        if self.frame.empty:
            body = f"<p><b>singlecard_nb</b>: {escape(_NOTHING_YET)}</p>{notes}"
        else:
            more = f"<div style='opacity:.7;font-size:11px'>{escape(self._more())}</div>"
            body = _STYLE + findings_html(self.findings) + _html(self.frame) + more + notes
        return f"<div class='{NO_MATH_CLASSES}'>{body}</div>"

    def __repr__(self) -> str:
        notes = "".join(f"\nsinglecard_nb: {n}" for n in self.notes)
        if self.frame.empty:
            return f"singlecard_nb: {_NOTHING_YET}{notes}"
        text = self.frame[list(SHOWN)].copy()
        text["shape"] = text["shape"].map(shape)
        text["module"] = text["module"].replace("", "(root)")
        for column in _NUMBERS:
            text[column] = text[column].map(num)
        more = f"\n{self._more()}" if self._more() else ""
        return findings_text(self.findings) + text.to_string(index=False) + more + notes


def _ranked(table, tracks: ranking.Tracks):
    """The aggregate in the ranking's order, with `why` and `trend` (absmax, first → last step);
    a module folded into another (same output) follows it and says so."""
    order: dict[str, tuple[int, int, str]] = {}
    for row in ranking.rank(tracks, group=False):
        order[row.path] = (len(order), row.tier, row.why)
        for path in row.same:
            path = "" if path == "(root)" else path
            order[path] = (len(order), ranking.QUIET, f"same output as {row.path or '(root)'}")
    trends = {t.path: (t.first[1] if t.first else float("nan"), t.entries[-1][ranking.ABSMAX])
              for t in tracks.by_path.values() if t.entries}
    place = table["module"].map(lambda m: order.get(m, (len(order), ranking.QUIET, "")))
    table = table.assign(
        why=[p[2] for p in place], tier=[p[1] for p in place], _order=[p[0] for p in place],
        trend=[trend(*trends[m]) if m in trends else "" for m in table["module"]])
    table = table.sort_values(["_order", "training"], ascending=[True, False], kind="stable")
    first = [c for c in SHOWN if c in table.columns]
    return table[first + [c for c in table.columns if c not in first and c != "_order"]] \
        .reset_index(drop=True)


def _leaders(table):
    """The table as `top` counts it: one row per tensor. A module whose output is another's
    ("same output as h.0.mlp") is said on that one's row instead of taking a row of its own,
    and a module's eval row follows its training row only in the whole table."""
    if table.empty:
        return table
    folded = table["why"].str.startswith("same output as ")
    same: dict[str, list[str]] = {}
    for module, why in zip(table["module"][folded], table["why"][folded]):
        same.setdefault(why.removeprefix("same output as "), []).append(module or "(root)")
    leaders = table[~folded & ~table.duplicated("module", keep="first")].copy()
    also = [same.get(m or "(root)") for m in leaders["module"]]
    leaders["why"] = [(f"{why}; " if why else "") + f"also the output of {', '.join(a)}"
                      if a else why for why, a in zip(leaders["why"], also)]
    return leaders


def findings_text(rows: list) -> str:
    """The findings as numbered lines, likeliest cause first ("" when nothing stands out)."""
    if not rows:
        return ""
    lines = ["findings, likeliest cause first:"]
    lines += [f"{i:>3}. {r.text()}" for i, r in enumerate(rows, 1)]
    return "\n".join(lines) + "\n\n"


def findings_html(rows: list) -> str:
    if not rows:
        return ""
    items = "".join(f"<li class='scn-t{r.tier}'><code>{escape(r.name)}</code> "
                    f"<span style='opacity:.7'>({escape(r.kind)})</span>: {escape(r.why)}</li>"
                    for r in rows)
    return ("<div class='singlecard-findings'><b>findings, likeliest cause first</b>"
            f"<ol style='margin:2px 0 6px 0;padding-left:22px'>{items}</ol></div>")


def _html(frame) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in SHOWN)
    body = []
    for row in frame[list(SHOWN) + ["tier"]].itertuples(index=False):
        values = row._asdict()
        cells = []
        for column in SHOWN:
            value = values[column]
            if column == "module":
                cells.append(f"<td class='m'>{escape(value or '(root)')}</td>")
            elif column == "why":
                cells.append(f"<td class='w'>{escape(value)}</td>")
            elif column == "trend":
                cells.append(f"<td class='n'>{escape(value)}</td>")
            elif column == "shape":
                cells.append(f"<td>{escape(shape(value))}</td>")
            elif column in _NUMBERS:
                cells.append(f"<td class='n'>{num(value)}</td>")
            elif column in ("nan", "inf"):
                bad = " bad" if value and value == value else ""
                cells.append(f"<td class='n{bad}'>{escape(value)}</td>")
            elif column == "training":
                cells.append(f"<td>{'train' if value else 'eval'}</td>")
            else:
                cells.append(f"<td>{escape(value)}</td>")
        body.append(f"<tr class='scn-t{values['tier']}'>{''.join(cells)}</tr>")
    return (f"<table class='singlecard-summary singlecard-nb'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.4g}"
    return html.escape(str(value))


def html_table(frame, bad=None) -> str:
    """A compact HTML table of a DataFrame; rows where `bad` is true are highlighted."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for i, row in enumerate(frame.itertuples(index=False)):
        style = ' style="background:#fdd"' if bad is not None and bool(bad.iloc[i]) else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>")
    return (f'<table class="singlecard-nb"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _aggregate(frame):
    import pandas as pd

    outputs = frame[frame["io"] == "output"]
    if outputs.empty:
        return pd.DataFrame()
    # train and eval calls of a module are aggregated apart
    grouped = outputs.groupby(["module", "type", "index", "training"], sort=False, dropna=False)
    table = grouped.agg(
        steps=("step", "nunique"), calls=("call", "max"), shape=("shape", "last"),
        dtype=("dtype", "last"), mean=("mean", "mean"), std=("std", "mean"),
        min=("min", "min"), max=("max", "max"), absmax=("absmax", "max"),
        nan=("nan", "sum"), inf=("inf", "sum"), zeros=("zeros", "mean"),
    )
    table["calls"] = table["calls"] + 1
    return table.reset_index()
