"""CUDA_VISIBLE_DEVICES read the way the CUDA driver reads it: which devices, in which order.

Works on any GPU objects with `index`, `uuid`, `pci_bus_id` and `mig` (MIG devices with
`uuid`): `model.Machine.with_ordinals` uses it for CUDA ordinals and for the allocation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def _in_bus_order(gpus: Sequence[Any]) -> list[Any]:
    return sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))


def visible(gpus: Sequence[Any], value: str | None) -> list[Any] | None:
    """The GPUs and MIG devices a CUDA_VISIBLE_DEVICES value makes visible, in CUDA order
    (None: unset, all).

    Follows the driver's parsing (as torch.cuda does): entries are integers (PCI-order
    positions) or GPU-/MIG- UUID prefixes; the first invalid entry ends the list (so `""`,
    `-1` and Slurm's `NoDevFiles` allow nothing) and a repeated device hides everything.
    """
    if value is None:
        return None
    in_bus_order = _in_bus_order(gpus)
    chosen: list[Any] = []
    for entry in value.split(","):
        device = _entry(entry.strip(), in_bus_order)
        if device is None:
            break
        if any(device is d for d in chosen):
            return []
        chosen.append(device)
    return chosen


def ordinals(gpus: Sequence[Any], value: str | None) -> list[int | None]:
    """Each GPU's CUDA ordinal under PCI-bus order and a CUDA_VISIBLE_DEVICES value.

    A MIG entry makes no full GPU visible, so it adds no ordinal here.
    """
    chosen = visible(gpus, value)
    if chosen is None:
        chosen = _in_bus_order(gpus)
    whole = [d for d in chosen if any(d is g for g in gpus)]
    return [next((o for o, d in enumerate(whole) if d is g), None) for g in gpus]


def _entry(entry: str, in_bus_order: list[Any]) -> Any:
    if entry.startswith(("GPU-", "MIG-")):
        candidates = [d for g in in_bus_order for d in (g, *g.mig)
                      if d.uuid and d.uuid.startswith(entry)]
        return candidates[0] if len(candidates) == 1 else None
    digits = re.match(r"\+?\d+", entry)  # strtoul: "1gpu" means 1
    if digits is None:
        return None
    position = int(digits.group())
    return in_bus_order[position] if position < len(in_bus_order) else None
