"""Which modules an inspector records: include / exclude / hist globs matched against paths."""

from __future__ import annotations

import dataclasses
import fnmatch
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn


@dataclasses.dataclass
class Target:
    """An inspected module: its path from `named_modules()`, its class name, and whether its
    activation histograms are taken."""

    path: str
    type_name: str
    hist: bool
    # the module itself, weakly: a module made later can get a freed module's id()
    ref: Callable[[], nn.Module | None] = dataclasses.field(default=lambda: None, repr=False,
                                                          compare=False)


def target_of(targets: Mapping[int, Target], module: Any) -> Target | None:
    """The target of `module` itself, by id(): None for a module made later (swapped into the
    model) that got a freed inspected module's id()."""
    target = targets.get(id(module))
    return target if target is not None and target.ref() is module else None


def globs(patterns: str | Sequence[str] | None) -> list[str] | None:
    """Patterns as a list; items may be comma-separated ("0,2", ["0,2"], ["0", "2"]).

    A list item "" stays: it is the root module's path.
    """
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [_unquoted(part) for part in patterns.split(",") if part.strip()]
    return [_unquoted(part) for item in patterns
            for part in (item.split(",") if "," in item else [item])
            if part.strip() or "," not in item]


def _unquoted(pattern: str) -> str:
    """A pattern without the quotes a magic line keeps ('%inspect m --include "Linear"'):
    no module path or class name is quoted."""
    pattern = pattern.strip()
    if len(pattern) >= 2 and pattern[0] == pattern[-1] and pattern[0] in "'\"":
        return pattern[1:-1].strip()
    return pattern


def matches(path: str, type_name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(type_name, p) for p in patterns)


def select_targets(model: nn.Module, include: list[str] | None, exclude: list[str] | None,
                   hist: list[str] | None, say: Callable[[str, str], None]) -> dict[int, Target]:
    """id(module) -> Target for every module of `model` that the globs select.

    Modules inside a TorchScript module are left out (no Python hook runs there); `say` tells
    the user so, once per scripted module.
    """
    targets = {}
    scripted: list[str] = []
    names: list[tuple[str, str]] = []  # (path, class) of every module, for unmatched globs
    for path, module in model.named_modules(remove_duplicate=True):
        type_name = type(module).__name__
        names.append((path, type_name))
        if any(path.startswith(f"{outer}.") for outer in scripted):
            continue
        if isinstance(module, torch.jit.ScriptModule):
            scripted.append(path)
        if include is not None and not matches(path, type_name, include):
            continue
        if exclude is not None and matches(path, type_name, exclude):
            continue
        targets[id(module)] = Target(path, type_name,
                                     hist is not None and matches(path, type_name, hist),
                                     weakref.ref(module))
    for name, patterns in (("include", include), ("exclude", exclude)):
        unmatched = [p for p in patterns or ()
                     if not any(matches(path, type_name, [p]) for path, type_name in names)]
        if unmatched:
            nothing_left = name == "include" and len(unmatched) == len(patterns)
            say(f"unmatched:{name}", _unmatched_note(model, names, name, unmatched, nothing_left))
    for path in scripted:
        say(f"script:{path}", f"{path!r} is a TorchScript module (torch.jit.script or trace): "
            "its inputs and outputs are recorded, the modules inside it are not (TorchScript "
            "runs no Python hooks).")
    return targets


def _unmatched_note(model: nn.Module, names: list[tuple[str, str]], option: str,
                    patterns: list[str], nothing_left: bool) -> str:
    """What a glob that matches nothing could have matched: some paths and class names."""
    paths = [repr(path) for path, _ in names if path][:6]
    kinds = sorted({type_name for _, type_name in names})[:8]
    what = ", ".join(repr(p) for p in patterns)
    effect = {"include": "so nothing is recorded" if nothing_left else "so it adds nothing",
              "exclude": "so it leaves out nothing"}[option]
    return (f"{option} {what} matches no module of {type(model).__name__}, {effect}. Globs are "
            f"matched against module paths ({', '.join(paths) or 'the root only'}, ...) and "
            f"class names ({', '.join(kinds)}); e.g. 'encoder.*' or 'Linear'.")


def track_histograms(targets: dict[int, Target], patterns: list[str]) -> list[str]:
    """Also take histograms for the targets matching `patterns`; returns the newly tracked
    paths."""
    added = []
    for target in targets.values():
        if not target.hist and matches(target.path, target.type_name, patterns):
            target.hist = True
            added.append(target.path or "''")
    return added
