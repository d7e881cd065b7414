"""Rules on whether the model learns at all: the invariants every healthy optimiser step keeps.

Each parameter meant to learn gets a gradient (`no_gradient`: in the optimiser, requires grad,
never a gradient: a `.detach()` or an unused branch); each parameter that gets a gradient is
stepped (`not_stepped`: in no param group, as a head assigned after the optimiser was built);
each step changes what it steps (`unchanged`: zero_grad() between backward() and step());
gradients are fresh at each step (`carried_over`: never zeroed, they sum every backward);
training steps run in training mode (`eval_mode`); updates stand in a sane ratio to the weights
(`update_scale`); a learning rate does not keep rising past its usual range (`lr_runaway`).

Each rule needs the series that show its facts (params=True, and grads=True for the gradient
ones) and says nothing where they are missing: a rule that cannot tell is silent.
"""

from __future__ import annotations

import math

from .grads import total_norms
from .optimizer import group_name
from .rows import AFTER_STEP, BACKWARD, CONFIG, MOVING, Row
from .series import ABSMAX, STEP, Track, Tracks, median, num, times

MIN_STEPS = 3  # optimiser steps before a rule on what steps do speaks
CARRIED_STEPS = 3  # optimiser steps whose .grad was carried over, not zeroed
TINY_UPDATE = 1e-7  # the median weight matrix changes by less than this share per step ...
SMALL_LR = 1e-5  # ... with every lr below this: the lr is what is too small
RUNAWAY = 10.0  # an lr this many times its value half a run ago, still rising, ...
USUAL_TOP_LR = 0.1  # ... and above the usual range (Adam's 1e-4 to 1e-2, SGD's to 0.1)
MODE_TYPES = ("Dropout", "BatchNorm", "InstanceNorm", "AlphaDropout")  # train/eval differ


def assess(tracks: Tracks) -> list[Row]:
    rows = []
    for rule in (no_gradient, not_stepped, unchanged, carried_over, eval_mode, update_scale,
                 lr_runaway):
        row = rule(tracks)
        if row is not None:
            rows.append(row)
    return rows


def _row(path: str, type_: str, why: str, since: int | None, phase: int, score: float,
         count: int, history: list[float] | None = None) -> Row:
    history = history or []
    return Row(path=path, type=type_, shape=(count,), dtype="", absmax=math.nan, std=math.nan,
               mean=math.nan, zeros=math.nan, nan=0, inf=0, tier=MOVING, score=score, why=why,
               order=-1, history=history, trend=(history[0], history[-1]) if history else None,
               steps=len(history) or 1, kind="optimizer", since=since, phase=phase)


def _names(paths: list[str], most: int = 3) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _grads(tracks: Tracks) -> dict[str, Track]:
    return {**tracks.step_grads, **tracks.grads}


def no_gradient(tracks: Tracks) -> Row | None:
    """Parameters an optimiser steps, with requires_grad, that never had a gradient, while
    others of the model did: forward never uses them in what the loss depends on."""
    if tracks.optimizer_steps < MIN_STEPS or not tracks.optimizer:
        return None
    if any("frozen" not in g for g in tracks.optimizer):
        return None  # a file saved without it: requires_grad is unknown
    grads = _grads(tracks)
    if not grads:
        return None  # no gradient recorded at all: nothing to tell the missing ones by
    frozen = {p for g in tracks.optimizer for p in g["frozen"]}
    missing = sorted(p for g in tracks.optimizer for p in g.get("params", ())
                     if p not in frozen and p not in grads and p in tracks.params
                     and tracks.params[p].added >= MIN_STEPS)
    if not missing:
        return None
    name = group_name(missing)
    why = (f"{len(missing)} parameters never got a gradient in {tracks.optimizer_steps} optimiser "
           f"steps ({_names(missing)}), though they require grad and the optimizer holds them: "
           "the loss does not depend on them; a .detach() or torch.no_grad() in forward cuts "
           "them off, or forward never calls them (under DDP: 'parameters that did not receive "
           "grad')")
    first = min(tracks.params[p].entries[0][STEP] for p in missing)
    return _row(name, "no gradient", why, first, BACKWARD, 50.0 + len(missing), len(missing))


def not_stepped(tracks: Tracks) -> Row | None:
    """Parameters that get a gradient at every step but that no optimiser steps, while it steps
    the others: they never change."""
    if tracks.optimizer_steps < MIN_STEPS or not tracks.grads:
        return None
    stepped = {p for g in tracks.optimizer for p in g.get("params", ())}
    left = sorted(p for p, t in tracks.grads.items()
                  if p not in stepped and p not in tracks.params and t.added >= MIN_STEPS
                  and any(e[ABSMAX] > 0 for e in t.entries))
    if not left:
        return None
    optimizers = sorted({g.get("optimizer", "the optimizer") for g in tracks.optimizer})
    why = (f"{_names(left)} get a gradient at every step but are in no param group of "
           f"{' or '.join(optimizers)}, which steps the other parameters: they never change; "
           "a module assigned after the optimizer was built (build the optimizer once the "
           "model is complete, or add_param_group)")
    first = min(tracks.grads[p].entries[0][STEP] for p in left)
    return _row(group_name(left), "not stepped", why, first, AFTER_STEP, 50.0 + len(left),
                len(left))


def unchanged(tracks: Tracks) -> Row | None:
    """An optimiser steps the parameters, backward gives them gradients, and yet no step
    changes any of them: the gradients are gone by the time of the step."""
    if tracks.optimizer_steps < MIN_STEPS or not tracks.updates or not tracks.grads:
        return None
    updates = [t for t in tracks.updates.values() if t.added >= MIN_STEPS]
    if not updates or any(e[ABSMAX] != 0 for t in updates for e in t.entries):
        return None
    backward = [e[ABSMAX] for t in tracks.grads.values() for e in t.entries]
    if not any(v > 0 for v in backward):
        return None
    at_step = [e[ABSMAX] for t in tracks.step_grads.values() for e in t.entries]
    seen = ("with gradients of zero" if at_step else "with no gradient at all (None)")
    why = (f"the parameters never change: no optimiser step changed any of the {len(updates)} "
           f"it stepped in {tracks.optimizer_steps} steps; it stepped {seen}, though backward gave "
           f"them gradients (absmax up to {num(max(backward))}); zero_grad() runs between "
           "backward() and step(): call it before backward()")
    first = min(t.entries[0][STEP] for t in updates)
    return _row("(all parameters)", "no update", why, first, AFTER_STEP, 60.0, len(updates))


def carried_over(tracks: Tracks) -> Row | None:
    """At CARRIED_STEPS or more optimiser steps in a row, most stepped parameters held last
    step's .grad tensor, one backward pass on and never zeroed (set to None or zero_()): each
    step then follows the sum of every gradient so far."""
    steps = tracks.carried_steps
    if len(steps) < CARRIED_STEPS:
        return None
    norms = total_norms(tracks.step_grads or tracks.grads)
    grew = (f"; the total gradient norm went {num(norms[0][1])} → {num(norms[-1][1])}"
            if len(norms) >= 2 else "")
    why = (f"the gradients are not zeroed between steps: at {len(steps)} of "
           f"{tracks.optimizer_steps} optimiser steps (from step {steps[0]}) .grad was the last "
           f"step's tensor with one more backward pass added{grew}, so each update follows the "
           "sum of every gradient so far; call optimizer.zero_grad() (or model.zero_grad()) "
           "once per step")
    return _row("(all parameters)", "gradients not zeroed", why, steps[0], BACKWARD, 55.0,
                len(steps))


def eval_mode(tracks: Tracks) -> Row | None:
    """Optimiser steps taken while the model was in eval mode, in a model with Dropout or
    BatchNorm (whose behaviour the mode changes)."""
    steps = tracks.eval_steps
    if len(steps) < 2:
        return None
    modal = sorted({t.type for t in tracks.by_path.values() if t.type.startswith(MODE_TYPES)})
    if not modal:
        return None  # nothing in the model behaves differently: the mode changes nothing
    why = (f"{len(steps)} of {tracks.optimizer_steps} optimiser steps ran with the model in eval "
           f"mode (from step {steps[0]}), so its {', '.join(modal)} ran as at evaluation while "
           "it trained: model.train() is not called again after model.eval()")
    return _row("(model)", "eval mode", why, steps[0], CONFIG, 45.0, len(steps))


def update_scale(tracks: Tracks) -> Row | None:
    """Updates far too small for anything to learn: the median weight matrix changes by less
    than TINY_UPDATE of itself per step, over the recent steps."""
    if tracks.optimizer_steps < MIN_STEPS:
        return None
    lrs = sorted({g["lr"] for g in tracks.optimizer if isinstance(g.get("lr"), (int, float))})
    if not lrs or lrs[-1] > SMALL_LR:
        return None  # a usual lr with tiny steps: vanishing gradients (the gradient rules')
    ratios = []
    for path, update in tracks.updates.items():
        param = tracks.params.get(path)
        if param is None or not isinstance(param.shape, (tuple, list)) or len(param.shape) < 2:
            continue
        by_step = {e[STEP]: param.rms(e) for e in param.entries}
        per_step = [update.rms(e) / by_step[e[STEP]] for e in list(update.entries)[-MIN_STEPS:]
                    if by_step.get(e[STEP])]
        if len(per_step) == MIN_STEPS and all(math.isfinite(r) for r in per_step):
            ratios.append(max(per_step))
    if not ratios:
        return None
    typical = median(ratios)
    if not 0 < typical < TINY_UPDATE:
        return None  # exactly 0 is `unchanged`'s
    lr = f" (lr {', '.join(num(v) for v in lrs)})"
    why = (f"each optimiser step changes the weights by about {num(typical)} of their size "
           f"(|Δw|/|w|, the median of {len(ratios)} weight matrices; a learning run moves them "
           f"1e-4 to 1e-2 per step): nothing learns; the learning rate is far too small{lr}")
    return _row("(all parameters)", "tiny updates", why, tracks.optimizer_first_step, CONFIG,
                40.0, len(ratios))


def lr_runaway(tracks: Tracks) -> Row | None:
    """A param group's lr that rose RUNAWAY× over the second half of its steps, still rises at
    the last, and is past the usual range: a schedule that never stops growing (a warm-up
    rises and then stops, and stays within it)."""
    for (optimizer, group), history in tracks.lr_history.items():
        if len(history) < 10:
            continue
        half = history[len(history) // 2][1]
        (_, before), (step, last) = history[-2], history[-1]
        if half > 0 and last >= RUNAWAY * half and last > before and last > USUAL_TOP_LR:
            why = (f"lr of param group {group} of {optimizer} rose {times(last / half)} over "
                   f"the last {len(history) - len(history) // 2} steps to {num(last)} at step "
                   f"{step}, and still rises: a scheduler that never stops growing (stepped per "
                   "batch where it expects epochs, or a factor that grows); check the scheduler")
            since = next(s for (s, v), (_, nxt) in zip(history, history[1:]) if nxt > v)
            return _row(f"{optimizer} group {group}", "lr schedule", why, since, CONFIG, 45.0,
                        1, [v for _, v in history])
    return None
