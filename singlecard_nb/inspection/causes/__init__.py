"""Diagnose, not just record: every recorded series assessed by the rules of its kind, and one
order in which causes come before their effects.

Rules, one module per kind of series: `outputs` (NaN/Inf, float16 overflow, explosion, outliers
of a type, dead modules and the module upstream that killed them), `inputs` (the model's own
inputs: scale, per channel), `params` (growth, shrinking, update ratio), `grads` (vanishing,
exploding, clipped to a tiny total norm), `optimizer` (param groups' lr and weight decay),
`learning` (the invariants of a step: every parameter meant to learn gets a gradient, is stepped
and changes; gradients are fresh; training runs in training mode; sane update sizes and lr),
`loss` (the loss itself: finite, decreasing, near unit scale, of logits). Plain Python
over `series.Tracks`: no numpy, no pandas, nothing of the recording machinery; the views (live,
summary, plots), `%inspect all` and the terminal all show this one order.

The order: first the findings that have a beginning (`Row.since`: NaN/Inf, inputs, parameters,
gradients, an optimiser setting its parameters suffer from, a module that kills the one after
it), earliest first and, within a step, in the order a step runs (settings, inputs, forward,
backward, the optimiser step); then the other findings (movement, outliers, dead modules) by
tier and size; then the quiet rest.
"""

from __future__ import annotations

from . import grads, inputs, learning, loss, optimizer, outputs, params
from .outputs import DEAD, MOVED, OUTLIER_RATIO, WINDOW
from .rows import DEAD_TIER, MOVING, NONFINITE, OUTLIER, QUIET, WAS_NONFINITE, Row
from .series import (
    ABSMAX,
    ATTRS,
    FRAME_COLUMNS,
    HISTORY,
    INF,
    MEAN,
    NAN,
    STD,
    STEP,
    ZEROS,
    Track,
    Tracks,
    condensed,
    num,
)

# The room's face: other rooms import these names from here, never its files. Beside the
# ranking (assess, order, first_grown, prior_cause): a Track's fields and a frame's columns
# (series), the tiers of a row (rows) and the thresholds the views name (outputs).
__all__ = ["ABSMAX", "ATTRS", "DEAD", "DEAD_TIER", "FRAME_COLUMNS", "HISTORY", "INF", "MEAN",
           "MOVED", "MOVING", "NAN", "NONFINITE", "OUTLIER", "OUTLIER_RATIO", "QUIET", "STD",
           "STEP", "WAS_NONFINITE", "WINDOW", "ZEROS", "Row", "Track", "Tracks", "assess",
           "condensed", "first_grown", "order", "prior_cause"]


def assess(tracks: Tracks) -> list[Row]:
    """A row per output series (quiet ones too), and per other series that shows something."""
    rows = outputs.assess(tracks.by_path, max((t.first[1] for t in tracks.inputs.values()
                                               if t.first is not None), default=0.0))
    rows += inputs.assess(tracks.inputs, tracks.channels)
    rows += params.assess(tracks.params, tracks.updates)
    # Gradients as the optimiser stepped with them where a GradScaler scaled backward's (by
    # its loss scale, 65536 at first: sizes mean nothing, and Inf where it then skipped the
    # step): params=True's step_grad rows. Without them, against the weights says nothing.
    gradients = tracks.grads or tracks.step_grads
    stepped = tracks.step_grads if tracks.scaled else gradients
    rows += grads.assess(stepped or gradients)
    rows += grads.against_weights(stepped, tracks.params, tracks.updates,
                                  {r.path for r in rows if r.kind == "grad"})
    rows += grads.clipped(tracks.step_grads, tracks.grads, tracks.scaled)
    rows += learning.assess(tracks)
    rows += loss.assess(tracks)
    troubled = {r.path for r in rows if r.kind in ("param", "grad") and r.is_finding}
    rows += optimizer.assess(tracks.optimizer, tracks.optimizer_first_step, troubled)
    for row in rows:
        bias = tracks.params.get(f"{row.path}.bias" if row.path else "bias")
        if row.kind == "output" and row.why.startswith("every output ≤ 0") and bias is not None:
            entry = bias.entries[-1]
            # the bias is named as the cause only when it alone is most of the push below 0
            if entry[MEAN] < 0 and abs(entry[MEAN]) >= 0.5 * abs(row.mean):
                row.why += (f"; its bias (mean {num(entry[MEAN])}, absmax "
                            f"{num(entry[ABSMAX])}) does it: check the bias's initialisation")
            else:
                row.why += (f"; not its bias (mean {num(entry[MEAN])}): check its weights' "
                            "initialisation and its inputs' scale")
    for row in rows:  # what a row is about, in the type column every view shows
        if row.kind in _KIND_WORDS:
            row.type = f"{row.type} {_KIND_WORDS[row.kind]}"
    return rows


_KIND_WORDS = {"param": "parameter", "grad": "gradient", "input": "(model input)"}


def _key(row: Row) -> tuple:
    if row.since is not None and row.tier < QUIET:
        # NaN/Inf of one step: the first module to run is where it was born
        within = row.order if row.tier <= WAS_NONFINITE else -row.score
        return (0, row.since, row.phase, row.tier, within, row.order)
    return (1, 0, 0, row.tier, -row.score, row.order)


def order(rows: list[Row]) -> list[Row]:
    """Rows in the ranking's order (see the module docstring)."""
    return sorted(rows, key=_key)


def first_grown(tracks: Tracks) -> str | None:
    """The first parameter that went wrong (grew, or turned NaN/Inf) and from which step, in
    words: what the trap names when a module's own weights are already non-finite."""
    rows = [r for r in params.assess(tracks.params, tracks.updates) if r.since is not None]
    if not rows:
        return None
    first = min(rows, key=lambda r: (r.since, r.tier != NONFINITE, -r.score))
    return f"the first parameter to go wrong was {first.path} (from step {first.since}: {first.why})"


_CAUSE_KINDS = ("optimizer", "param", "input", "depth", "grad", "loss")


def prior_cause(tracks: Tracks, step: int) -> str | None:
    """The likeliest cause the ranking saw begin at or before `step`, in words with its step:
    what the trap names before its own explanation (a param group's lr, the parameter that
    began to grow, an input far from unit scale). NaN/Inf rows are the trap's own effects."""
    for row in order(assess(tracks)):
        if (row.is_finding and row.kind in _CAUSE_KINDS and row.since is not None
                and row.since <= step and row.tier > WAS_NONFINITE):
            return f"{row.text()} (from step {row.since})"
    return None
