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


# Parsed `%inspect` arguments that are the magic's own; every other option is inspect()'s.
_MAGIC_ONLY = ("what", "name", "live")


def inspect_options(args: Any) -> dict[str, Any]:
    """inspect()'s keyword arguments from a parsed `%inspect` line: every option but the
    magic's own, by its name, so an option added to the magic reaches inspect() and
    `%inspect all` alike."""
    if args.every < 1:
        raise UsageError(f"%inspect: --every must be a positive integer, got {args.every}.")
    if args.max_rows is not None and args.max_rows < 1:
        raise UsageError(f"%inspect: --max-rows must be a positive integer, got "
                         f"{args.max_rows}.")
    return {key: value for key, value in vars(args).items() if key not in _MAGIC_ONLY}
