"""Whose code a frame runs: the user's, or torch's and ours (ground floor: imports nothing of
ours). One rule for every part that points a notice, a traceback or a rank's place at the
user's own line: a file is torch's or ours when it lies in that package's folder, compared
with the path separator (`.../torchvision/...` is not torch's).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType

_OURS = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _torch_folder() -> str:
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        return os.path.dirname(os.path.abspath(torch.__file__))
    spec = importlib.util.find_spec("torch")  # finds the folder without importing torch
    return os.path.abspath(list(spec.submodule_search_locations)[0]) if spec else "/nonexistent"


@functools.cache
def library_roots(installed: bool = False) -> tuple[str, ...]:
    """The folders whose files are not the user's, each ending in the path separator:
    singlecard_nb's and torch's; with `installed`, also the standard library's and every
    installed package's (a rank's place: the user's own script, never a library's line)."""
    roots = {_OURS, _torch_folder()}
    if installed:
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_paths().get(key)
            if path:
                roots.add(os.path.abspath(path))
    return tuple(os.path.normcase(root) + os.sep
                 for root in sorted(roots, key=len, reverse=True))


def is_user_file(filename: str, installed: bool = False) -> bool:
    """Not torch's, not ours (with `installed`: nor the standard library's, an installed
    package's, or a frozen module's such as <frozen runpy>)."""
    if installed and filename.startswith("<"):  # <frozen runpy>, <string>
        return False
    path = os.path.normcase(os.path.abspath(filename))
    return not (path + os.sep).startswith(library_roots(installed))


def user_frame(frame: FrameType | None,
               also: Sequence[str] = ()) -> tuple[FrameType | None, int]:
    """The first frame from `frame` outwards that is the user's, and how many frames out it
    is (0: `frame` itself); None (and the stack's depth) where none is. A frame is torch's or
    ours by its file (`library_roots()`) or its module's name; `also` names more packages
    whose frames are passed over (accelerate's launcher, typing_extensions' @deprecated)."""
    packages = ("torch", "singlecard_nb", *also)
    steps = 0
    while frame is not None and (
            not is_user_file(frame.f_code.co_filename)
            or _in_packages(frame.f_globals.get("__name__") or "", packages)):
        frame, steps = frame.f_back, steps + 1
    return frame, steps


def _in_packages(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def trimmed(tb: TracebackType | None,
            keep: Callable[[str], bool]) -> TracebackType | None:
    """The traceback from its first entry whose file `keep` accepts (None: no such entry),
    as python prints a script's error: from the script's own frames on."""
    while tb is not None and not keep(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb
