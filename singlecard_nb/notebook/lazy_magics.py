"""The magic a shell really runs, whether IPython registered it eagerly or lazily.

From IPython 9.17 on, built-in magics such as `%run` sit in the magics table as placeholders
(`LazyMagic`) that look the name up again when called. A wrapper put in the table in place of
a placeholder would be found by that lookup and call itself for ever, so whoever wraps a magic
resolves it first and wraps the real callable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..borrow import Borrowed


def resolved(shell: Any, kind: str, name: str) -> Callable[..., Any]:
    """The callable behind `%name` (kind "line") or `%%name` (kind "cell"), imported if lazy.

    Resolving registers IPython's real magic in the table, so the table then holds what the
    shell itself would hold after the magic's first use.
    """
    magic = shell.find_magic(name, kind)  # imports a placeholder's class on IPython >= 9.17
    if magic is None:
        raise KeyError(f"the shell has no {kind} magic {name!r}")
    return magic


def wrap_line_magic(shell: Any, name: str, wrapper_for: Callable[[Callable[..., Any]], Callable],
                    owner: Borrowed, label: str) -> None:
    """Put `wrapper_for(real)` in the shell's table as line magic `name`, owned by `owner`.

    `real` is what the shell runs now (another wrapper, or IPython's own magic, never a lazy
    placeholder). Wrappers nest: whichever is given back first, the table ends with what it
    held before both. Giving back puts a resolved callable back, not the placeholder: IPython
    counts the placeholder's class as loaded once resolved, and would refuse it.
    """
    real = resolved(shell, "line", name)
    # functools.wraps keeps IPython's magic attributes (no variable expansion, the help)
    wrapper = functools.wraps(real)(wrapper_for(real))
    owner.set_item(shell.magics_manager.magics["line"], name, wrapper, label)
