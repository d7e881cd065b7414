"""Which modules an inspector records: include / exclude / hist globs matched against paths."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Sequence

import torch
from torch import nn


@dataclasses.dataclass
class Target:
    """An inspected module: its path from `named_modules()`, its class name, and whether its
    activation histograms are taken."""

    path: str
    type_name: str
    hist: bool


def globs(patterns: str | Sequence[str] | None) -> list[str] | None:
    """Patterns as a list; items may be comma-separated ("0,2", ["0,2"], ["0", "2"]).

    A list item "" stays: it is the root module's path.
    """
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [part.strip() for part in patterns.split(",") if part.strip()]
    return [part.strip() for item in patterns
            for part in (item.split(",") if "," in item else [item])
            if part.strip() or "," not in item]


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
    for path, module in model.named_modules(remove_duplicate=True):
        if any(path.startswith(f"{outer}.") for outer in scripted):
            continue
        type_name = type(module).__name__
        if isinstance(module, torch.jit.ScriptModule):
            scripted.append(path)
        if include is not None and not matches(path, type_name, include):
            continue
        if exclude is not None and matches(path, type_name, exclude):
            continue
        targets[id(module)] = Target(path, type_name,
                                     hist is not None and matches(path, type_name, hist))
    for path in scripted:
        say(f"script:{path}", f"{path!r} is a TorchScript module (torch.jit.script or trace): "
            "its inputs and outputs are recorded, the modules inside it are not (TorchScript "
            "runs no Python hooks).")
    return targets


def track_histograms(targets: dict[int, Target], patterns: list[str]) -> list[str]:
    """Also take histograms for the targets matching `patterns`; returns the newly tracked
    paths."""
    added = []
    for target in targets.values():
        if not target.hist and matches(target.path, target.type_name, patterns):
            target.hist = True
            added.append(target.path or "''")
    return added
