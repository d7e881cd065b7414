"""A ranked row: one series as the views show it, with its tier, why, and when it began."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Tiers: how bad, in the order rows of one band are shown (and the views' colours).
NONFINITE, WAS_NONFINITE, MOVING, OUTLIER, DEAD_TIER, QUIET = range(6)

# Phases of a step, for causes seen in the same step: what comes first in a step comes first.
CONFIG, INPUTS, FORWARD, BACKWARD, AFTER_STEP = range(5)


@dataclass
class Row:
    """One series as ranked: its latest statistics, its tier and score, and why it is shown.

    kind: "output", "input", "param", "grad", "update" or "optimizer". since: the step from
    which the finding held (a cause, ranked by when it began; None: an effect or nothing).
    """

    path: str
    type: str
    shape: Any
    dtype: str
    absmax: float
    std: float
    mean: float
    zeros: float
    nan: int
    inf: int
    tier: int
    score: float
    why: str
    order: int
    history: list[float]  # absmax over the kept steps (the sparkline)
    trend: tuple[float, float] | None  # absmax at the first and the last step seen
    steps: int
    same: list[str] = field(default_factory=list)  # folded modules with this very output
    members: list[Row] = field(default_factory=list)  # a group's members, worst first
    label: str = ""  # a group's pattern, `h.{0-11}.mlp.c_fc`; the path otherwise
    kind: str = "output"
    since: int | None = None
    phase: int = FORWARD

    @property
    def name(self) -> str:
        return self.label or self.path or "(root)"

    @property
    def is_group(self) -> bool:
        return bool(self.members)

    @property
    def is_finding(self) -> bool:
        return self.tier < QUIET

    def text(self) -> str:
        """`path (kind): why`, the one line a terminal or a title shows; a group names its
        worst member first."""
        group = f", worst of {self.label}, {len(self.members)}" if self.is_group else ""
        head = f"{self.path or '(root)'} ({self.kind}{group})"
        return f"{head}: {self.why}" if self.why else head


def row_of(track: Any, tier: int, score: float, why: str, **extra: Any) -> Row:
    """A row of a `series.Track` at its latest step."""
    from .series import ABSMAX

    entry = track.entries[-1]
    _, absmax, std, mean, zeros, nan, inf, _ = entry
    first = track.first[1] if track.first else float("nan")
    return Row(track.path, track.type, track.shape, track.dtype, absmax, std, mean, zeros,
               nan, inf, tier, score, why, track.order, track.series(ABSMAX), (first, absmax),
               len(track.entries), kind=track.kind, **extra)
