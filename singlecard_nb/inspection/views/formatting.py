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
    # a span from -1.7e308 to 1.7e308 overflows float64: measured in halves (halving every
    # span would lose a series of denormals)
    half = 0.5 if high - low == math.inf else 1.0
    span = high * half - low * half
    top = len(_SPARK) - 1
    return "".join(
        "·" if v is None or v != v else "!" if v in (math.inf, -math.inf)
        else _SPARK[round((v * half - low * half) / span * top) if span > 0 else 0]
        for v in values)


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
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # a span from -1.7e308 to 1.7e308 overflows float64: measured in halves (as above)
        half = np.where(np.isinf(high - low), 0.5, 1.0)
        span = high * half - low * half
        position = np.where(finite & (span > 0), (values * half - low * half) / span, 0.0)
        levels = np.rint(position * (len(_SPARK) - 1)).astype(int)
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
        # in logs: 1e-300 → 1e300 is ×10^600, past float64's range as a quotient
        logged = math.log10(last) - math.log10(first)
        if abs(logged) >= 300:
            text += f" ×10^{round(logged)}"
        elif abs(logged) >= math.log10(1.5):
            text += f" ×{num(10 ** logged)}"
    return text


def escape(text: Any) -> str:
    """HTML-escaped, with `$` as `&#36;` so MathJax never typesets a path or a message."""
    return no_math(html.escape(str(text)))
