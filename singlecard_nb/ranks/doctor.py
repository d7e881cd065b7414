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


def _point(status: Mapping[str, Any] | None, stopped: bool = False) -> tuple[str | None, str]:
    """(collective, short file:line) where a rank stands; for a rank `stopped` by another's
    failure, where it stood when that one died: a collective it then failed in (its peer went
    away) is where it was waiting, so the answer does not depend on who the notebook saw first."""
    if not status:
        return None, _short(None)
    raised = status.get("raised") if stopped else None
    place = raised or status
    return place.get("collective"), _short(place.get("where"))


def _waiting(statuses: Mapping[int, Mapping[str, Any] | None],
             codes: Mapping[int, int | None],
             stopped: bool = False) -> dict[tuple[str, str], list[int]]:
    """(collective, where) -> the ranks waiting there, for ranks still running (with
    `stopped`: every rank but those in `codes`, each where it stood when they failed)."""
    points: dict[tuple[str, str], list[int]] = {}
    for rank, status in sorted(statuses.items()):
        gone = rank in codes if stopped else codes.get(rank) is not None
        if gone:
            continue
        collective, where = _point(status, stopped)
        if collective:
            points.setdefault((collective, where), []).append(rank)
    return points


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def never_arrived(statuses: Mapping[int, Mapping[str, Any] | None],
                  codes: Mapping[int, int | None], stopped: bool = False) -> list[str]:
    """For each collective some ranks wait in, the ranks that never arrived there."""
    everyone = sorted(statuses)
    lines = []
    for (collective, where), waiting in sorted(_waiting(statuses, codes, stopped).items(),
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


def stopped(rank: int, status: Mapping[str, Any] | None, code: int | None,
            failed: int) -> str:
    """A rank stopped because rank `failed` died, as a line: where it was when that happened
    (an error of its own after that, its peer gone, is no second failure)."""
    if code == 0:
        return f"rank {rank}: had finished (exit status 0) when rank {failed} died"
    if status is None:
        return f"rank {rank}: stopped before its script started, when rank {failed} died"
    collective, where = _point(status, stopped=True)
    if collective:
        return f"rank {rank}: stopped (waiting in {collective} at {where} when rank {failed} died)"
    return f"rank {rank}: stopped (at {where}, in no collective, when rank {failed} died)"


def failure_report(failed: int, statuses: Mapping[int, Mapping[str, Any] | None],
                   codes: Mapping[int, int | None]) -> str:
    """The RankFailed message: rank `failed` failed first, its traceback as the cause; where
    each other rank was when it died."""
    status = statuses.get(failed) or {}
    raised = status.get("raised") or {}
    what = raised.get("error") or f"exit status {codes.get(failed)}"
    at = f" at {_short(raised['where'])}" if raised.get("where") else ""
    lines = [f"rank {failed} failed: {what}{at}; the other ranks were stopped."]
    if raised.get("traceback"):
        lines.append(f"The cause, rank {failed}'s traceback (also above, under [rank {failed}]):")
        lines += [f"  {line}" for line in raised["traceback"].splitlines()]
    elif not raised:
        lines.append(f"Rank {failed} ended without a Python traceback (killed, out of memory, "
                     f"or a crash in native code): its last output is above, under [rank "
                     f"{failed}].")
    lines.append(f"Where each other rank was when rank {failed} died:")
    lines += [f"  {stopped(r, statuses.get(r), codes.get(r), failed)}"
              for r in sorted(statuses) if r != failed]
    lines += never_arrived(statuses, {failed: codes.get(failed)}, stopped=True)
    lines.append(f"An error a stopped rank printed after that (gloo's \"Connection closed by "
                 f"peer\" and the like) comes from rank {failed} going away, not from a bug of "
                 f"its own; see {DOCS}.")
    return "\n".join(lines)


def first_failed(statuses: Mapping[int, Mapping[str, Any] | None],
                 codes: Mapping[int, int | None]) -> int | None:
    """The rank that failed first: by the time each said it raised (written before its
    traceback); a rank that exited non-zero without a word (killed, a native crash) by its
    last status's time, which its death followed, so the ranks failing because it went away
    (their raise comes after its death) never count as first."""
    when = []
    for rank, status in statuses.items():
        raised = (status or {}).get("raised")
        if raised:
            when.append((raised["at"], rank))
        elif codes.get(rank) not in (None, 0):
            when.append(((status or {}).get("time", float("-inf")), rank))
    return min(when)[1] if when else None
