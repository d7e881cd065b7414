"""The script run as python runs it: `sys.argv`, `sys.path[0]`, `__main__`; its traceback from
its own frames on, its exit status, and an explanation under a failure inside a module."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any

from ..frames import trimmed


def run(script: str | None, module: str | None, args: list[str], agent: Any = None) -> int:
    """Run the script as python would; its exit status (1 after an error, with explanation)."""
    saved_argv, path, saved_path = sys.argv[:], sys.path, sys.path[:]
    try:
        if script is not None:
            sys.argv = [script, *args]
            where = os.path.abspath(script)  # a folder with __main__.py is itself on the path
            sys.path[0:1] = [where if os.path.isdir(where) else os.path.dirname(where)]
            runpy.run_path(where, run_name="__main__")  # __file__ absolute, as python 3.9+
        else:
            sys.argv = [module, *args]  # runpy puts the module's file name in argv[0]
            sys.path[0:1] = [os.getcwd()]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        if agent is not None:
            agent.left(0)  # ran to its end: the first rank to leave is known, also by exit 0
        return 0
    except SystemExit as e:
        status = _exit_status(e.code)
        if agent is not None:
            agent.left(status, e)  # where its sys.exit was
        return status
    except KeyboardInterrupt as e:
        _print_as_python_does(e)
        return 130
    except Exception as e:
        if agent is not None:
            agent.raised(e)  # before the traceback: the first rank to fail is the one to show
        if not _print_as_python_does(e, module):
            _explain(e)
        return 1
    finally:
        # all of it, as it was: a script that emptied sys.path (or replaced it) leaves us the
        # imports the save needs
        sys.argv = saved_argv
        path[:] = saved_path
        sys.path = path


def _print_as_python_does(error: BaseException, module: str | None = None) -> bool:
    """The traceback from the script's own frames on, as python prints it (ours and runpy's
    left out, the exception itself untouched); True when nothing of the script ran (its syntax
    error, a `-m` module that is not there): then that is all python prints."""
    tb = trimmed(error.__traceback__, keep=lambda filename: not _is_launcher(filename))
    if tb is None and module is not None and isinstance(error, ImportError):
        print(f"{sys.executable}: {error}", file=sys.stderr)  # python -m's own words
        return True
    traceback.print_exception(type(error), error, tb)
    return tb is None


_LAUNCHERS = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))


def _is_launcher(filename: str) -> bool:
    return os.path.abspath(filename) in _LAUNCHERS or filename.startswith("<frozen runpy")


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what `sys.exit("message")` prints
    return 1


def _explain(error: Exception) -> None:
    from ..diagnosis.explain import build

    try:
        explanation = build(error)
    except Exception as e:
        print(f"singlecard_nb: could not explain this error ({type(e).__name__}: {e}).",
              file=sys.stderr)
        return
    if explanation is not None:
        print(f"\n{explanation!r}", file=sys.stderr)

