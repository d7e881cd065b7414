"""Rules on the optimiser the inspector saw stepping (params=True): a param group whose learning
rate or weight decay stands far from the other groups', and a weight decay that by itself takes
a sizeable part off the weights at every step (lr × weight_decay). A group is named by what it
holds, in the inspector's paths ("head", "encoder.layers.{0-5}")."""

from __future__ import annotations

import math
import os

from .rows import CONFIG, OUTLIER, Row
from .series import median, num, times

FAR = 10.0  # a group's lr (or weight decay) this many times the other groups'
# the tops of the usual ranges (Adam's lr 1e-4 to 1e-2, SGD's to 0.1; decay 1e-5 to 0.1)
USUAL_LR, USUAL_DECAY = 0.1, 0.1
# lr × weight_decay from which decay alone shrinks the weights fast: 1 % per step halves them in
# 70 steps (usual settings take 1e-5 to 1e-4: AdamW lr 1e-3 × 0.1, SGD lr 0.1 × 5e-4)
SHRINKS = 0.01


def assess(groups: list[dict], first_step: int | None, troubled: set[str]) -> list[Row]:
    """A row per param group whose lr or weight decay is FAR above the others'. It ranks as a
    cause (from the first step it was seen) when one of its parameters shows a problem
    (`troubled`: paths of parameters with a finding), else among the outliers."""
    rows = []
    for i, group in enumerate(groups):
        others = [g for j, g in enumerate(groups) if j != i]
        parts, score = [], 0.0
        for key, label in (("lr", "lr"), ("weight_decay", "weight_decay")):
            value = group.get(key)
            if not isinstance(value, (int, float)) or not value > 0 or not others:
                continue
            rest = [g[key] for g in others if isinstance(g.get(key), (int, float)) and g[key] > 0]
            if key == "lr" and not rest:
                continue
            if not rest:
                continue
            base = median(rest)
            if value >= FAR * base:
                against = "the other group" if len(rest) == 1 else \
                    f"the median of the other {len(rest)} groups"
                parts.append(f"{label} {num(value)}, {times(value / base)} {against} "
                             f"({num(base)})")
                score = max(score, math.log(value / base))
        checks = {k for k in ("lr", "weight_decay") if any(p.startswith(k) for p in parts)}
        decay = _decay(group, others)
        if decay is not None and "weight_decay" not in checks:
            parts.append(decay[0])
        if decay is not None:
            score = max(score, decay[1])
            checks |= decay[2]
        if not parts:
            continue
        name = group_name(group.get("params", []))
        hit = sorted(p for p in group.get("params", []) if p in troubled)
        effect = (f"; its parameters {', '.join(hit[:3])} show it (see their rows)" if hit
                  else "")
        setting = " and ".join(k for k in ("lr", "weight_decay") if k in checks)
        why = (f"`{name}`: " + "; ".join(parts) + f" in param group {group.get('group', i)} of "
               f"{group.get('optimizer', 'the optimizer')}{effect}: check the {setting} given "
               "to the optimizer")
        rows.append(Row(
            path=name, type=f"{group.get('optimizer', 'optimizer')} group {group.get('group', i)}",
            shape=(len(group.get("params", [])),), dtype="", absmax=float(group.get("lr", math.nan)),
            std=math.nan, mean=float(group.get("weight_decay", math.nan) or 0.0), zeros=math.nan,
            nan=0, inf=0, tier=OUTLIER, score=score + 10.0, why=why, order=-1, history=[],
            trend=None, steps=1, kind="optimizer",
            since=(first_step if hit and first_step is not None else None), phase=CONFIG))
    return rows


def _decay(group: dict, others: list[dict]) -> tuple[str, float, set[str]] | None:
    """(words, score, the settings to check) when lr × weight_decay takes SHRINKS or more off
    the weights per step. The one outside its usual range is the one to check: AdamW's
    default weight_decay 0.01 with an lr of 20 is a wrong lr, not a wrong decay."""
    lr, decay = group.get("lr"), group.get("weight_decay")
    if not all(isinstance(v, (int, float)) and v > 0 for v in (lr, decay)):
        return None
    shrink = lr * decay
    if shrink < SHRINKS:
        return None
    rest = [g.get("weight_decay") for g in others]
    rest = [v for v in rest if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(rest) == 1:
        against = f" (the other group's: {num(rest[0])})"
    elif rest:
        against = f" (the median of the other {len(rest)} groups': {num(median(rest))})"
    else:
        against = ""
    usual_lr, usual_decay = lr <= USUAL_LR, decay <= USUAL_DECAY
    checks = ({"lr"} if usual_decay and not usual_lr else
              {"weight_decay"} if usual_lr and not usual_decay else {"lr", "weight_decay"})
    lead = (f"lr {num(lr)} with weight_decay {num(decay)}{against}" if checks == {"lr"} else
            f"weight_decay {num(decay)}{against} with lr {num(lr)}")
    return (f"{lead}: decay alone takes {min(shrink, 1.0):.0%} off its weights at every step "
            f"(lr × weight_decay = {num(shrink)}; usual settings give 1e-5 to 1e-4)",
            math.log(shrink / SHRINKS), checks)


def group_name(params: list[str]) -> str:
    """What a group holds, by its parameters' paths: their common module ("head"), else the
    first one and how many more."""
    modules = sorted({p.rpartition(".")[0] for p in params})
    if not modules:
        return "(empty group)"
    if len(modules) == 1:
        return modules[0] or "(root)"
    common = os.path.commonprefix([m.split(".") for m in modules])
    if common:
        return ".".join(common)
    return f"{modules[0]} and {len(modules) - 1} more modules"
