"""After a cell fails inside a module's forward, show `singlecard_nb.explain()` under the traceback.

On by default once the extension is loaded; `%singlecard explain off|on` switches it. One
post_run_cell callback per shell, owned by a `borrow.Borrowed` (so `%unload_ext` removes it and
`%singlecard status` lists it). It only reads `result.error_in_exec`: the exception, its
traceback, `%debug` and `%tb` stay exactly as IPython left them. Loading stays free of torch: the
explanation code is imported after the first failing cell, and only if torch is in use.
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.display import display

from .. import borrow

# id(shell) -> the owner of its callback
_owners: dict[int, borrow.Borrowed] = {}


def start(shell: Any) -> None:
    """Explain failing cells in `shell` from now on (idempotent)."""
    if id(shell) in _owners:
        return
    owner = borrow.Borrowed("%singlecard explain")
    events, callback = shell.events, _show_explanation  # unregister needs the very same object
    events.register("post_run_cell", callback)
    owner.on_restore(lambda: events.unregister("post_run_cell", callback),
                     "post_run_cell: explain failing cells")
    # restore_all() on unload must also forget this shell, or `explain on` would be a no-op later
    owner.on_restore(lambda: _owners.pop(id(shell), None), "explain registry")
    _owners[id(shell)] = owner


def stop(shell: Any) -> None:
    """Stop explaining failing cells in `shell` (harmless when off)."""
    owner = _owners.get(id(shell))
    if owner is not None:
        owner.restore()


def is_on(shell: Any) -> bool:
    return id(shell) in _owners


def _show_explanation(result: Any = None) -> None:
    show(getattr(result, "error_in_exec", None))


def show(error: Any) -> None:
    """Display the explanation of `error` (an exception raised inside a module), if any."""
    if not isinstance(error, Exception):  # no error, or Ctrl-C / SystemExit: nothing to explain
        return
    if "torch" not in sys.modules:  # no torch, no module: and loading torch here would cost seconds
        return
    try:
        from ..diagnosis import explain

        explanation = explain.build(error)
    except Exception as e:  # an IPython callback error would print a second, confusing traceback
        print(f"singlecard_nb: could not explain this error ({type(e).__name__}: {e}).",
              file=sys.stderr)
        return
    if explanation is not None:
        display(explanation)
