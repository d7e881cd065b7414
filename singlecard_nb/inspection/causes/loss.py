"""Rules on the loss itself (what `loss.backward()` was called on, from `recording/losses.py`):
a non-finite loss at the step it happened, with the operation that made it; a loss that never
decreases (SageMaker Debugger's loss_not_decreasing); a regression loss that starts far from
unit scale (its targets); a cross-entropy taken of a softmax's output (softmax twice); a
cross-entropy that starts far above log(classes) (the loss at init, Karpathy's recipe).

The loss's last autograd operations (`NllLoss ← LogSoftmax ← Softmax ← Addmm`) are what the words
rest on: an operation is named only when it ran. A loss two inspected models share (a GAN's) or
several losses a step say nothing of one model, and no rule here speaks of them but the first.
"""

from __future__ import annotations

import math

from ...errors import loss_hint
from .rows import BACKWARD, FORWARD, INPUTS, NONFINITE, OUTLIER, Row
from .series import Tracks, num

FLAT_STEPS = 100  # losses before "did not decrease" may be said
FLAT = 0.95  # the last tenth's mean at least this share of the first tenth's: not decreasing
REGRESSION = ("MseLoss", "L1Loss", "SmoothL1Loss", "HuberLoss")
FAR_LOSS = 1e4  # a regression loss this large at its first step: far from unit scale
INIT_LOSS = 3.0  # a cross-entropy's first loss this many times log(classes): logits too large


def assess(tracks: Tracks) -> list[Row]:
    rows = []
    for rule in (non_finite, double_softmax, regression_scale, loss_at_init, not_decreasing):
        row = rule(tracks)
        if row is not None:
            rows.append(row)
    return rows


def _row(why: str, tier: int, since: int, phase: int, score: float, tracks: Tracks,
         path: str = "loss") -> Row:
    values = [v for _, v in tracks.losses]
    latest = values[-1] if values else math.nan
    return Row(path=path, type="loss", shape=(), dtype="", absmax=abs(latest), std=math.nan,
               mean=latest, zeros=math.nan, nan=int(latest != latest), inf=0, tier=tier,
               score=score, why=why, order=-1, history=values[-64:],
               trend=(values[0], latest) if values else None, steps=len(values), kind="loss",
               since=since, phase=phase)


def _chain(ops: list[str], most: int = 5) -> str:
    return " ← ".join(ops[:most])


def non_finite(tracks: Tracks) -> Row | None:
    bad = next(((s, v) for s, v in tracks.losses if not math.isfinite(v)), None)
    if bad is None:
        return None
    step, value = bad
    before = [v for s, v in tracks.losses if s < step and math.isfinite(v)]
    what = "NaN" if value != value else "Inf"
    ops = tracks.loss_ops
    hint = loss_hint(ops)
    was = f" (finite before: {num(before[-1])})" if before else ""
    why = (f"the loss was {what} at step {step}{was}; its last operations {_chain(ops)}: {hint}")
    return _row(why, NONFINITE, step, BACKWARD, 1e9, tracks)


def double_softmax(tracks: Tracks) -> Row | None:
    ops = tracks.loss_ops
    hit = next((i for i, (a, b) in enumerate(zip(ops, ops[1:]))
                if a == "LogSoftmax" and b == "Softmax"), None)
    if hit is None or not tracks.losses:
        return None
    softmaxes = [t for t in tracks.by_path.values() if t.type == "Softmax" and t.entries]
    path = max(softmaxes, key=lambda t: t.order).path if softmaxes else "loss"
    taken = "cross_entropy (log_softmax, then NllLoss)" if any(
        op.startswith("NllLoss") for op in ops[:hit + 1]) else "log_softmax"
    why = (f"the loss takes {taken} of the output of a Softmax ({path or '(root)'}): "
           "CrossEntropyLoss wants logits, so softmax is applied twice and the gradients "
           "shrink; return the logits (drop the Softmax, or apply it only to predict)")
    return _row(why, OUTLIER, tracks.losses[0][0], FORWARD, 30.0, tracks,
                path=path or "(root)")


def regression_scale(tracks: Tracks) -> Row | None:
    ops = tracks.loss_ops
    if not ops or ops[0] not in REGRESSION or not tracks.losses:
        return None
    step, value = tracks.losses[0]
    if not math.isfinite(value) or value < FAR_LOSS:
        return None
    root = tracks.by_path.get("")
    start = root.trail.first() if root is not None else None
    output = start[1] if start is not None else math.nan
    typical = math.sqrt(value) if ops[0] == "MseLoss" else value  # |y - ŷ| it implies
    if not output < typical / 10:
        return None  # the model's own output is that large: not the targets alone
    why = (f"the loss starts at {num(value)} ({ops[0]}, step {step}): |target - output| is "
           f"about {num(typical)} while the model's output is about {num(output)}, so the "
           "targets are far from unit scale and the gradients are that large; standardise "
           "the regression targets (and scale the predictions back)")
    return _row(why, OUTLIER, step, INPUTS, math.log(value), tracks)


def loss_at_init(tracks: Tracks) -> Row | None:
    """A cross-entropy's first loss far above a uniform guess's, log(classes): the logits start
    far from 0, the last layer initialised too large (Karpathy's recipe: verify the loss at
    init). Read when the model's output is the loss's input (its last dimension the classes)."""
    ops = tracks.loss_ops
    root = tracks.by_path.get("")
    if (ops[:2] not in (["NllLoss", "LogSoftmax"], ["NllLoss(sum)", "LogSoftmax"])
            or not tracks.losses or root is None):
        return None
    shape = root.shape
    classes = shape[-1] if isinstance(shape, (tuple, list)) and shape else 0
    step, value = tracks.losses[0]
    if (not isinstance(classes, int) or classes < 2 or not math.isfinite(value)
            or not all(isinstance(size, int) for size in shape)):
        return None
    uniform = math.log(classes)
    starts = f"the loss starts at {num(value)} (step {step})"
    if ops[0] == "NllLoss(sum)":  # reduction="sum" (pytorch/examples' VAE, fairseq): the loss
        predictions = math.prod(shape[:-1])  # of each prediction, added up
        value /= max(predictions, 1)
        starts += f", a sum over {predictions} predictions of {num(value)} each"
    if value < INIT_LOSS * uniform:
        return None
    why = (f"{starts}, {value / uniform:.3g}× a uniform guess's log({classes}) = "
           f"{num(uniform)}: the logits start far from 0, so the first steps only shrink "
           "them; initialise the last layer smaller (or zero its weights), and check the loss "
           "at init")
    return _row(why, OUTLIER, step, FORWARD, math.log(value / uniform), tracks)


def not_decreasing(tracks: Tracks) -> Row | None:
    if tracks.loss_shared or tracks.losses_per_step != 1:
        return None
    values = [(s, v) for s, v in tracks.losses if math.isfinite(v)]
    if len(values) < FLAT_STEPS or len(values) < len(tracks.losses):
        return None
    tenth = len(values) // 10
    head, tail = values[:tenth], values[-tenth:]
    first = sum(v for _, v in head) / tenth
    last = sum(v for _, v in tail) / tenth
    if not first > 1e-6 or last < FLAT * first:
        return None
    why = (f"the loss did not decrease in {len(values)} steps: mean {num(first)} over steps "
           f"{head[0][0]}-{head[-1][0]}, {num(last)} over steps {tail[0][0]}-{tail[-1][0]}: the "
           "model does not learn what the loss asks; check that the targets follow the inputs "
           "(labels shuffled apart from their samples, a wrong target column), then the "
           "learning rate")
    return _row(why, OUTLIER, tail[0][0], BACKWARD, 20.0, tracks)
