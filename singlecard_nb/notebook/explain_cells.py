"""After a cell fails inside a module's forward, show a one-line banner with the diagnosis above
the traceback and `singlecard_nb.explain()` under it.

On by default once the extension is loaded; `%singlecard explain off|on` switches it. Per shell,
one `borrow.Borrowed` owns two things (so `%unload_ext` removes them and `%singlecard status`
lists them): a wrapper of `shell.showtraceback` that displays the banner before calling
IPython's own (a traceback can be 1 000 px tall: the banner is what is on screen when a cell
fails), and a post_run_cell callback that displays the full explanation after it. Both only read
the exception: its type, message, traceback, `%debug` and `%tb` stay exactly as IPython left
them. Loading stays free of torch: the explanation code is imported after the first failing
cell, and only if torch is in use.
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.display import display

from .. import borrow

# id(shell) -> the owner of its callback
_owners: dict[int, borrow.Borrowed] = {}
# id(shell) -> (exception, explanation) built for the banner, shown again after the traceback
_built: dict[int, tuple[BaseException, Any]] = {}


def start(shell: Any) -> None:
    """Explain failing cells in `shell` from now on (idempotent)."""
    if id(shell) in _owners:
        return
    owner = borrow.Borrowed("%singlecard explain")
    events, callback = shell.events, _show_explanation  # unregister needs the very same object
    events.register("post_run_cell", callback)
    owner.on_restore(lambda: events.unregister("post_run_cell", callback),
                     "post_run_cell: explain failing cells")
    original = shell.showtraceback

    def showtraceback(exc_tuple=None, *args: Any, **kwargs: Any) -> Any:
        _show_banner(shell, exc_tuple)
        return original(exc_tuple, *args, **kwargs)

    owner.set_attr(shell, "showtraceback", borrow.wrap_like(original, showtraceback),
                   "shell.showtraceback: a banner above the traceback")
    # restore_all() on unload must also forget this shell, or `explain on` would be a no-op later
    owner.on_restore(lambda: (_owners.pop(id(shell), None), _built.pop(id(shell), None)),
                     "explain registry")
    _owners[id(shell)] = owner


def stop(shell: Any) -> None:
    """Stop explaining failing cells in `shell` (harmless when off)."""
    owner = _owners.get(id(shell))
    if owner is not None:
        owner.restore()


def is_on(shell: Any) -> bool:
    return id(shell) in _owners


def _explanation(error: Any) -> Any:
    """The explanation of `error`, or None (nothing to explain); raises what building raised."""
    if not isinstance(error, Exception):  # no error, or Ctrl-C / SystemExit: nothing to explain
        return None
    if "torch" not in sys.modules:  # no torch, no module: and loading torch here would cost seconds
        return None
    from ..diagnosis import explain

    return explain.build(error)


def _show_banner(shell: Any, exc_tuple: Any) -> None:
    """Before IPython prints the traceback of the exception being handled (or of `exc_tuple`)."""
    error = exc_tuple[1] if exc_tuple else sys.exc_info()[1]
    try:
        explanation = _explanation(error)
    except Exception:  # said once, after the traceback, by _show_explanation
        return
    if explanation is not None:
        _built[id(shell)] = (error, explanation)
        display(explanation.banner())


def _show_explanation(result: Any = None) -> None:
    from IPython import get_ipython

    show(get_ipython(), getattr(result, "error_in_exec", None))


def show(shell: Any, error: Any) -> None:
    """Display the explanation of `error` under its traceback (the one the banner built, if it
    built one for it). Also for a traceback IPython printed without failing the cell: `%run`
    shows a script's error itself, so post_run_cell sees no error (`%inspect all` calls this)."""
    built = _built.pop(id(shell), None)
    if built is not None and built[0] is error:
        display(built[1])
        return
    try:
        explanation = _explanation(error)
    except Exception as e:  # an IPython callback error would print a second, confusing traceback
        print(f"singlecard_nb: could not explain this error ({type(e).__name__}: {e}).",
              file=sys.stderr)
        return
    if explanation is not None:
        display(explanation)
