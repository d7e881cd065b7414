"""Compact words for numbers, shapes and series, shared by the text and HTML views; and HTML
escaping that also keeps `$` away from MathJax (JupyterLab typesets `$…$` in HTML outputs)."""

from __future__ import annotations

import html
import math
from typing import Any

from ...theme import no_math

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Any) -> str:
    """Unicode sparkline scaled to the series' own range; NaN shown as `·`, Inf as `!`."""
    finite = [v for v in values if v is not None and -math.inf < v < math.inf]
    if not finite:
        return "·" * len(values)
    low, high = min(finite), max(finite)
    scale = (len(_SPARK) - 1) / (high - low) if high > low else 0.0
    return "".join(
        "·" if v is None or v != v else "!" if v in (math.inf, -math.inf)
        else _SPARK[round((v - low) * scale)] for v in values)


def sparklines(series: list[list[float]]) -> list[str]:
    """`sparkline` of many series at once (numpy): what a 1 000-module view draws per update."""
    import numpy as np

    if not series:
        return []
    lengths = [len(s) for s in series]
    width = max(lengths) or 1
    values = np.full((len(series), width), np.nan)
    for i, s in enumerate(series):
        values[i, :len(s)] = s
    finite = np.isfinite(values)
    low = np.where(finite, values, np.inf).min(axis=1, keepdims=True)
    high = np.where(finite, values, -np.inf).max(axis=1, keepdims=True)
    span = high - low
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(span > 0, (len(_SPARK) - 1) / span, 0.0)
        levels = np.rint(np.where(finite, (values - low) * scale, 0)).astype(int)
    chars = np.array(list(_SPARK))[np.clip(levels, 0, len(_SPARK) - 1)]
    chars[np.isnan(values)] = "·"
    chars[np.isinf(values)] = "!"
    return ["".join(row[:n]) for row, n in zip(chars.tolist(), lengths)]


def num(value: Any) -> str:
    """3 significant digits, exponents without padding (`1.2e+05` -> `1.2e5`)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "" if value is None else str(value)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = f"{v:.3g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    return text


def shape(value: Any) -> str:
    """`(64, 1024, 768)` -> `64×1024×768`: a third of the width in a table."""
    if isinstance(value, (tuple, list)):
        return "×".join(str(s) for s in value) if value else "scalar"
    return "" if value is None else str(value)


def trend(first: float, last: float) -> str:
    """`0.52→3.1 ×6`: first and last value and their ratio (where both are positive)."""
    text = f"{num(first)}→{num(last)}"
    if first > 0 and last > 0 and math.isfinite(first) and math.isfinite(last):
        ratio = last / first
        if ratio >= 1.5 or ratio <= 1 / 1.5:
            text += f" ×{num(ratio)}"
    return text


def escape(text: Any) -> str:
    """HTML-escaped, with `$` as `&#36;` so MathJax never typesets a path or a message."""
    return no_math(html.escape(str(text)))
