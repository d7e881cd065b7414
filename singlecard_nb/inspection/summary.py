"""`insp.summary()`: per-module aggregate of an Inspector's output rows, rendered as a table."""

from __future__ import annotations

import html
from typing import Any

_NOTHING_YET = (
    "no rows recorded yet. If the model did run: code that torch.compile compiled before "
    "inspection started runs without module hooks (torch does not re-check them), so inspect "
    "before compiling, inspect the torch.compile(model) wrapper itself, or call "
    "torch._dynamo.reset().")


class Summary:
    """Per-module aggregate of an Inspector's rows (output tensors), rendered as a table."""

    def __init__(self, inspector: Any):
        frame = inspector.frame()
        self.frame = _aggregate(frame)
        self.notes = list(inspector.notes)  # what could not be recorded as asked

    def _repr_html_(self) -> str:
        notes = "".join(f"<p><b>singlecard_nb</b>: {html.escape(n)}</p>" for n in self.notes)
        if self.frame.empty:
            return f"<p><b>singlecard_nb</b>: {html.escape(_NOTHING_YET)}</p>{notes}"
        return html_table(self.frame, bad=self.frame["nan"].gt(0) | self.frame["inf"].gt(0)) + notes

    def __repr__(self) -> str:
        notes = "".join(f"\nsinglecard_nb: {n}" for n in self.notes)
        if self.frame.empty:
            return f"singlecard_nb: {_NOTHING_YET}{notes}"
        return self.frame.to_string() + notes


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
