"""The ranks of a running job side by side: per module, each rank's latest statistics, ranked by
where the ranks disagree most.

Fed with the snapshots each rank sends (views/latest.py, inside the ranks' statuses) while the
job runs; the ranks are compared at the latest step every one of them has (a parameter, its
gradient and its update at the latest optimiser step, as `compare_ranks` matches them where a
rank ran forward passes the others did not), with `align`, the matching `compare_ranks` uses,
each rank against the lowest. Order: a NaN or Inf some ranks have and others not, then what
DDP keeps equal on every rank (parameters after the step, the gradient it used, the update)
where it differs (the likeliest bug), then other differences, largest first (outputs differ
where each rank reads its own batch), then rows not comparable yet, then rows equal on every
rank. The text form lists what the HTML shows, in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...theme import NO_MATH_CLASSES
from ..views import escape, num
from .alignment import COMPARED, align
from .comparison import STATE_IO

TOP = 20  # rows drawn; the rest are counted
_STATS = ("absmax", "mean")
_SHOWN = ("absmax", "mean", "nan")  # per rank, in each rank's group of columns
_RTOL = 1e-6  # compare_ranks' tolerance: DDP keeps its state equal bit for bit

# Tiers of a row, in the order shown
NONFINITE_ON_SOME, KEPT_EQUAL_DIFFERS, DIFFERS, NOT_COMPARED, EQUAL = range(5)


@dataclass
class RankRow:
    """One series (a module's output, a parameter, ...) on every rank that reported it."""

    model: str
    io: str
    path: str
    type: str
    order: int
    step: int | None  # the step compared (None: the ranks have no step in common yet)
    values: dict[int, dict[str, Any]]  # rank -> {"step", "absmax", "mean", "std", "nan", ...}
    rel: float = math.nan  # largest relative difference from the lowest rank (nan: none)
    stat: str | None = None  # the statistic that differs most
    odd: int | None = None  # the rank that differs most from the lowest rank
    tier: int = NOT_COMPARED
    why: str = ""
    missing: list[int] = field(default_factory=list)  # ranks that did not report it

    @property
    def label(self) -> str:
        kind = "" if self.io == "output" else f" [{self.io}]"
        return f"{self.path or '(root)'}{kind}"


class SideBySide:
    """The ranks' latest statistics, fed as they come; `rows()` ranked, `bundle()` drawn."""

    def __init__(self, ranks: int, top: int = TOP):
        self.ranks = list(range(ranks))
        self.top = top
        self._latest: dict[int, dict[str, Any]] = {}  # rank -> {model: snapshot}
        self._rows: list[RankRow] | None = None

    def feed(self, statuses: Mapping[int, Mapping[str, Any] | None]) -> bool:
        """Take each rank's latest snapshot; True when one changed."""
        changed = False
        for rank, status in statuses.items():
            latest = (status or {}).get("latest")
            if latest and latest != self._latest.get(rank):
                self._latest[rank] = latest
                changed = True
        if changed:
            self._rows = None
        return changed

    def steps(self) -> dict[int, int | None]:
        """Each rank's latest recorded step (None: nothing yet)."""
        found: dict[int, int | None] = {}
        for rank in self.ranks:
            steps = [s.get("step") for s in self._latest.get(rank, {}).values()
                     if s.get("step") is not None]
            found[rank] = max(steps) if steps else None
        return found

    # --- the ranking ------------------------------------------------------------------------
    def rows(self) -> list[RankRow]:
        if self._rows is None:
            self._rows = self._ranked()
        return self._rows

    def _ranked(self) -> list[RankRow]:
        reporting = sorted(self._latest)
        rows: dict[tuple[str, str, str], RankRow] = {}
        by_rank: dict[tuple[str, str, str], dict[int, dict[int, dict]]] = {}
        for rank in reporting:
            for model, snapshot in self._latest[rank].items():
                for item in snapshot.get("series", ()):
                    key = (model, item["io"], item["path"])
                    if key not in rows:  # in the order the lowest rank first reported them
                        rows[key] = RankRow(model, item["io"], item["path"], item["type"],
                                            len(rows), None, {})
                    # parameters meet at their optimiser step, outputs at their step number
                    by_rank.setdefault(key, {})[rank] = {e.get("opt", e["step"]): e
                                                         for e in item["entries"]}
        for key, row in rows.items():
            have = by_rank[key]
            row.missing = [r for r in self.ranks if r not in have]
            common = set.intersection(*(set(e) for e in have.values()))
            if common and not row.missing:
                met = max(common)
                row.values = {r: entries[met] for r, entries in sorted(have.items())}
                row.step = row.values[min(have)]["step"]  # the lowest rank's number for it
            else:  # each rank's latest, shown but not compared
                row.values = {r: entries[max(entries)] for r, entries in sorted(have.items())}
        self._compare([r for r in rows.values() if r.step is not None], reporting)
        for row in rows.values():
            row.tier, row.why = _judged(row)
        return sorted(rows.values(), key=lambda r: (
            r.tier, -(r.rel if r.rel == r.rel else -1.0), r.order))

    def _compare(self, rows: list[RankRow], reporting: list[int]) -> None:
        """Each rank against the lowest, with `align` (what compare_ranks matches with)."""
        if len(reporting) < 2 or not rows:
            return
        import pandas as pd

        def frame(rank: int):
            return pd.DataFrame(
                [{"step": r.step, "module": r.path, "call": 0, "io": r.io, "index": r.model,
                  "absmax": float(r.values[rank]["absmax"]),
                  "mean": float(r.values[rank]["mean"]), "std": float(r.values[rank]["std"])}
                 for r in rows])

        index = {(r.model, r.io, r.path): r for r in rows}
        reference = frame(reporting[0])
        for rank in reporting[1:]:
            table = align(reference, frame(rank), _STATS, _RTOL, 0.0).table
            table = table[table["status"] == COMPARED]
            for model, io, path, rel, stat, diverged in zip(
                    table["index"], table["io"], table["module"], table["rel"], table["stat"],
                    table["diverged"]):
                row = index[(model, io, path)]
                rel = float(rel)
                if diverged and (row.odd is None or rel > row.rel):
                    row.odd, row.stat = rank, stat
                row.rel = rel if row.rel != row.rel else max(row.rel, rel)
        # of three ranks or more, the odd one is the reference when every other rank differs
        # from it: which rank it is, by majority (with two, either could be)
        if len(reporting) >= 3:
            for row in rows:
                if row.odd is not None and all(
                        _differs(row, reporting[0], r) for r in reporting[1:]) and not any(
                        _differs(row, a, b) for a in reporting[1:] for b in reporting[1:]
                        if a < b):
                    row.odd = reporting[0]

    # --- drawing ----------------------------------------------------------------------------
    def head(self, state: str) -> str:
        steps = self.steps()
        said = " · ".join(f"rank {r} step {'-' if s is None else s}" for r, s in steps.items())
        return (f"ranks side by side · {len(self.ranks)} ranks · {said} · "
                f"{len(self.rows())} series · {state}")

    def text(self, state: str) -> str:
        rows = self.rows()
        lines = [self.head(state)]
        shown = rows[:self.top]
        width = min(44, max([len(_name(r, self._models())) for r in shown] + [6]))
        group = " ".join(f"{s:>9}" for s in _SHOWN)
        lines.append(f"{'#':>3} {'module':<{width}} {'type':<12} "
                     + " | ".join(f"rank {r}: {group}" for r in self.ranks)
                     + " | differs  why")
        for i, row in enumerate(shown, 1):
            cells = " | ".join(
                " " * (len(f"rank {r}: ")) + " ".join(f"{v:>9}" for v in _cells(row, r))
                for r in self.ranks)
            lines.append(f"{i:>3} {_name(row, self._models()):<{width}} {row.type[:12]:<12} "
                         f"{cells} | {_percent(row):>7}  {row.why}")
        if len(rows) > self.top:
            lines.append(f"  … {len(rows) - self.top} more rows")
        return "\n".join(lines)

    def html(self, state: str) -> str:
        rows = self.rows()
        models = self._models()
        heads = "".join(f"<th colspan='{len(_SHOWN)}' class='scn-rank'>rank {r}</th>"
                        for r in self.ranks)
        subs = "".join(f"<th>{s}</th>" for _ in self.ranks for s in _SHOWN)
        body = []
        for i, row in enumerate(rows[:self.top], 1):
            cells = "".join(
                f"<td class='n{' bad' if row.odd == r and row.tier < EQUAL else ''}'>"
                f"{escape(v)}</td>" for r in self.ranks for v in _cells(row, r))
            body.append(f"<tr class='scn-t{row.tier}'><td class='n'>{i}</td>"
                        f"<td>{escape(_name(row, models))}</td><td>{escape(row.type)}</td>"
                        f"{cells}<td class='n'>{escape(_percent(row))}</td>"
                        f"<td>{escape(row.why)}</td></tr>")
        more = (f"<div class='scn-more'>… {len(rows) - self.top} more rows</div>"
                if len(rows) > self.top else "")
        return (f"<div class='singlecard-ranks-live {NO_MATH_CLASSES}'><style>{_STYLE}</style>"
                f"<div>{escape(self.head(state))}</div><table><thead><tr><th rowspan='2'>#"
                f"</th><th rowspan='2'>module</th><th rowspan='2'>type</th>{heads}"
                f"<th rowspan='2'>differs</th><th rowspan='2'>why</th></tr><tr>{subs}</tr>"
                f"</thead><tbody>{''.join(body)}</tbody></table>{more}</div>")

    def bundle(self, state: str) -> dict[str, str]:
        """{"text/plain", "text/html"} of the current state ("running", "finished", ...)."""
        return {"text/plain": self.text(state), "text/html": self.html(state)}

    def _models(self) -> set[str]:
        return {m for latest in self._latest.values() for m in latest}


_STYLE = """
.singlecard-ranks-live{font-size:12px;max-width:100%;overflow-x:auto}
.singlecard-ranks-live table{border-collapse:collapse;font-size:11.5px;width:auto}
.singlecard-ranks-live th{text-align:left;padding:1px 6px;white-space:nowrap;background:none;
 border-bottom:1px solid rgba(128,128,128,.5)}
.singlecard-ranks-live th.scn-rank{text-align:center;border-left:1px solid rgba(128,128,128,.5)}
.singlecard-ranks-live td{padding:1px 6px;text-align:left;vertical-align:top;
 font-family:var(--jp-code-font-family,monospace);border-bottom:1px solid rgba(128,128,128,.15)}
.singlecard-ranks-live td.n{text-align:right;white-space:nowrap}
.singlecard-ranks-live td.bad{color:rgb(235,60,60);font-weight:bold}
.singlecard-ranks-live tr.scn-t0{background:rgba(230,40,40,.22)}
.singlecard-ranks-live tr.scn-t1{background:rgba(230,40,40,.12)}
.singlecard-ranks-live tr.scn-t2{background:rgba(255,150,0,.10)}
"""


def _differs(row: RankRow, a: int, b: int) -> bool:
    va, vb = row.values[a], row.values[b]
    for stat in _STATS:
        x, y = float(va[stat]), float(vb[stat])
        if not (x == y or (x != x and y != y)) and not abs(x - y) <= _RTOL * max(abs(x), abs(y)):
            return True
    return False


def _judged(row: RankRow) -> tuple[int, str]:
    bad = [r for r, v in row.values.items() if (v.get("nan") or 0) + (v.get("inf") or 0)]
    if bad and len(bad) < len(row.values):
        who = "rank" + ("s " if len(bad) > 1 else " ") + ", ".join(map(str, bad))
        return NONFINITE_ON_SOME, f"NaN/Inf on {who} only"
    if row.step is None:
        if row.missing:
            return NOT_COMPARED, "not recorded on rank" + (
                "s " if len(row.missing) > 1 else " ") + ", ".join(map(str, row.missing))
        return NOT_COMPARED, "the ranks are at other steps"
    if row.odd is None:
        return EQUAL, "equal on every rank" if row.rel == row.rel else ""
    differs = f"rank {row.odd}'s {row.stat} differs by {_percent(row)}"
    if row.io in STATE_IO:
        return KEPT_EQUAL_DIFFERS, f"DDP keeps it equal on every rank: {differs}"
    return DIFFERS, differs


def _cells(row: RankRow, rank: int) -> tuple[str, ...]:
    value = row.values.get(rank)
    if value is None:
        return ("-",) * len(_SHOWN)
    return tuple(num(value.get(s)) if s != "nan" else str(int(value.get(s) or 0))
                 for s in _SHOWN)


def _name(row: RankRow, models: set[str]) -> str:
    return f"{row.model}: {row.label}" if len(models) > 1 else row.label


def _percent(row: RankRow) -> str:
    if row.tier == EQUAL:
        return "-"  # within tolerance: a figure in rounding's last bits would say nothing
    if row.rel != row.rel:
        return ""
    if math.isinf(row.rel):
        return "inf"
    return f"{100 * row.rel:.3g}%"
