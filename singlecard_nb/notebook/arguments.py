"""Magic lines parsed into arguments, every mistake a `UsageError` naming what was wrong."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring


def parse_line(magic: Any, name: str, line: str) -> Any:
    """`parse_argstring(magic, line)`, with the tokeniser's own errors (an unbalanced quote)
    turned into a UsageError that names the line; argparse's errors already are one."""
    try:
        return parse_argstring(magic, line)
    except ValueError as e:
        raise UsageError(f"{name} {line}: {e} (quote a value with matching ' or \")") from None
