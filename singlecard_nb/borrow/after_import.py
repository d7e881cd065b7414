"""`Borrowed.after_import`'s finder: a patch of a module made just after the module first runs
(a `sys.meta_path` finder that takes itself off the path the first time)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from typing import Any


class AfterImport:
    """A `sys.meta_path` finder that lets the others find module `name` and runs `then` on
    the module once its code has run; it takes itself off the path the first time."""

    def __init__(self, name: str, then: Callable[[Any], None], label: str):
        self.name, self.then, self.label = name, then, label

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self.then, self.label)
        return spec


class _ThenLoader:
    """The real loader, and `then(module)` after it ran the module; the module keeps the real
    loader as its `__loader__`."""

    def __init__(self, loader: Any, then: Callable[[Any], None], label: str):
        self._loader, self._then, self._label = loader, then, label

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as e:  # the user's import goes on; what we could not do is said
            warnings.warn(f"singlecard_nb: {self._label} could not be made when "
                          f"{module.__name__} was imported: {type(e).__name__}: {e}",
                          RuntimeWarning, stacklevel=2)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
