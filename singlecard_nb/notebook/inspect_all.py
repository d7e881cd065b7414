"""`%inspect all`: every model the code calls is inspected, `%run train.py` included.

While it is on, `%run` starts clean records (the models found by the previous run are stopped
and forgotten), and a run that fails inside a module (a NaN the trap caught) gets its
explanation under the traceback IPython prints: `%run` shows a script's error itself, so the
cell does not fail and the explanation after failing cells never sees it.
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from .. import job
from ..borrow import Borrowed
from . import lazy_magics
from .magic_lines import inspect_options


def inspect_all_line(magics: Any, args: Any) -> None:
    """`%inspect all [options]`, `%inspect all off`, `%inspect all show`."""
    from ..inspection.finding import Discovery

    action = args.name
    if action not in (None, "off", "show"):
        raise UsageError(f"%inspect all: {action!r} is not an action; use `%inspect all` "
                         "with options, `%inspect all off` or `%inspect all show`.")
    finder = magics.finder
    if action == "off":
        if finder is not None:
            finder.stop()  # the inspectors stop; scn.inspectors() keeps them readable
        owner = _run_owners.get(id(magics))
        if owner is not None:
            owner.restore()
        return None
    if action == "show":
        found = finder.inspectors if finder is not None else {}
        if not found:
            print("%inspect all: no model found yet.")
        for name, insp in found.items():
            insp.flush()
            print(f"{name}: {insp!r}")  # a summary does not name its model
            display(insp.summary())
        return None
    options = inspect_options(args)  # the same options, checked the same way, as %inspect
    try:
        new = Discovery(**options)
    except (TypeError, ValueError) as e:
        raise UsageError(f"%inspect all: {e}") from None
    if args.live:
        new.found.append(lambda name, insp: insp.live())
    if finder is not None:
        finder.stop()
    magics.finder = new.start()
    magics.finder_live = bool(args.live)
    _clean_runs(magics, new)
    magics.start_flushing()
    return None


WORLD_OF_ONE = ("the last `%run` ran in this process, a world of one: there are no ranks to "
                "compare (`%singlecard cpu --ranks N` runs it as N ranks); give an Inspector, a "
                "frame or a path of saved records.")

# id(magics) -> the owner of its %run wrapper
_run_owners: dict[int, Borrowed] = {}


def _clean_runs(magics: Any, finder: Any) -> None:
    """Wrap `%run` (once per shell; the wrapper reads the current finder)."""
    if id(magics) in _run_owners and _run_owners[id(magics)].active:
        return

    def wrapper_for(original: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            current = magics.finder
            if current is None or not current.active:
                return original(*args, **kwargs)
            current.reset()
            # a run in this process, unless a `%run` of ranks inside says what it recorded
            job.LAST_RANKS_RUN.remember(WORLD_OF_ONE)
            before = getattr(sys, "last_value", None)
            try:
                return original(*args, **kwargs)
            finally:
                current.flush()
                error = getattr(sys, "last_value", None)
                if error is not before and isinstance(error, Exception):
                    _explain(magics.shell, error)

        return run

    owner = Borrowed("%inspect all: %run starts clean records")
    lazy_magics.wrap_line_magic(magics.shell, "run", wrapper_for, owner, "%run wrapper")
    owner.on_restore(lambda: _run_owners.pop(id(magics), None), "%run wrapper's record")
    _run_owners[id(magics)] = owner


def _explain(shell: Any, error: Exception) -> None:
    from . import explain_cells

    if explain_cells.is_on(shell):
        explain_cells.show(shell, error)
