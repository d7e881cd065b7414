"""The hang doctor: what each rank was doing when the job stopped, in words.

Pure functions of the ranks' last statuses (agent.py) and exit codes: where each rank waits
(the collective and the user's own file:line), which ranks never arrived at a collective the
others wait in, and the rank that failed first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

DOCS = "docs/ranks.md"


class RanksHang(RuntimeError):
    """No rank made progress for `--hang-after` seconds; every rank was stopped."""


class RankFailed(RuntimeError):
    """A rank exited with an error; the others were stopped."""


def _short(where: str | None) -> str:
    if not where:
        return "an unknown line"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def describe(rank: int, status: Mapping[str, Any] | None, code: int | None) -> str:
    """One rank, as a line: 'rank 1: waits in all_reduce at train.py:40 (main)'."""
    if code is not None:
        return f"rank {rank}: exited with status {code}"
    if status is None:
        return f"rank {rank}: never started its script (no status yet)"
    raised = status.get("raised")
    if raised:  # failed too, most often because a peer went away in a collective
        place = (f"in {raised['collective']} " if raised.get("collective") else "") + \
            f"at {_short(raised.get('where'))}"
        return f"rank {rank}: {place}, then failed too: {raised.get('error', '')[:160]}"
    where = f"{_short(status.get('where'))}" + (
        f" (in {status['function']})" if status.get("function") else "")
    if status.get("collective"):
        return f"rank {rank}: waits in {status['collective']} at {where}"
    return f"rank {rank}: in no collective, at {where}"


def _waiting(statuses: Mapping[int, Mapping[str, Any] | None],
             codes: Mapping[int, int | None]) -> dict[tuple[str, str], list[int]]:
    """(collective, where) -> the ranks waiting there, for ranks still running."""
    points: dict[tuple[str, str], list[int]] = {}
    for rank, status in sorted(statuses.items()):
        if codes.get(rank) is None and status and status.get("collective"):
            points.setdefault((status["collective"], _short(status.get("where"))), []).append(rank)
    return points


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def never_arrived(statuses: Mapping[int, Mapping[str, Any] | None],
                  codes: Mapping[int, int | None]) -> list[str]:
    """For each collective some ranks wait in, the ranks that never arrived there."""
    everyone = sorted(statuses)
    lines = []
    for (collective, where), waiting in sorted(_waiting(statuses, codes).items(),
                                               key=lambda item: len(item[1])):
        missing = [r for r in everyone if r not in waiting]
        if missing:
            lines.append(f"{_ranks(missing)} never arrived at the {collective} that "
                         f"{_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in "
                         f"at {where}.")
    return lines


def hang_report(statuses: Mapping[int, Mapping[str, Any] | None],
                codes: Mapping[int, int | None], seconds: float) -> str:
    """The RanksHang message: no rank moved for `seconds`."""
    lines = [f"no rank made progress for {seconds:g} s, so every rank was stopped. Where "
             "each one was:"]
    lines += [f"  {describe(r, statuses.get(r), codes.get(r))}" for r in sorted(statuses)]
    lines += never_arrived(statuses, codes) or [
        "Every waiting rank is in the same collective at the same line: a collective whose "
        "tensors differ in size or kind between ranks waits for ever with gloo."]
    lines.append(f"A collective only one rank makes (a metric all_reduce under `if rank == 0`) "
                 f"is the usual cause; see {DOCS}.")
    return "\n".join(lines)


def failure_report(failed: int, statuses: Mapping[int, Mapping[str, Any] | None],
                   codes: Mapping[int, int | None]) -> str:
    """The RankFailed message: rank `failed` failed first; what the others were doing."""
    status = statuses.get(failed) or {}
    raised = status.get("raised") or {}
    what = raised.get("error") or f"exit status {codes.get(failed)}"
    at = f" at {_short(raised['where'])}" if raised.get("where") else ""
    lines = [f"rank {failed} failed: {what}{at} (its traceback is above, under "
             f"[rank {failed}]); the other ranks were stopped. Where each one was:"]
    lines += [f"  {describe(r, statuses.get(r), None if r != failed else codes.get(r))}"
              for r in sorted(statuses) if r != failed]
    lines += never_arrived(statuses, {failed: codes.get(failed)})
    return "\n".join(lines)


def first_failed(statuses: Mapping[int, Mapping[str, Any] | None],
                 codes: Mapping[int, int | None]) -> int | None:
    """The rank that raised first (its own word, written before its traceback), else the
    first with a non-zero exit status."""
    raised = [(s["raised"]["at"], r) for r, s in statuses.items() if s and s.get("raised")]
    if raised:
        return min(raised)[1]
    failed = [r for r, c in codes.items() if c not in (None, 0)]
    return min(failed) if failed else None
