"""The hang doctor: what each rank was doing when the job stopped, in words.

Pure functions of the ranks' last statuses (rank_status.py) and exit codes: how each rank left (it
raised, it exited with a status at a line, it died in native code), which left first (by exit 0
too, while the others waited), where each rank waits (the collective and the user's own
file:line), which ranks never arrived at a collective the others wait in, and a collective
mismatch: the first call the ranks' collectives differ in, or the calls each rank was in when
gloo found sizes that do not match, both named with rank and line.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

from .rank_status import (
    AGENT_ERROR,
    COLLECTIVE,
    COLLECTIVES,
    FAULT,
    FORMED,
    FUNCTION,
    LEFT,
    RAISED,
    TIME,
    WHERE,
    RankStatus,
)

DOCS = "docs/ranks.md"
MISMATCH = "one rank ran more steps or an extra collective"
# what gloo (a size that does not match; before torch 2.7 its enforce on the preamble's length)
# and TORCH_DISTRIBUTED_DEBUG=DETAIL say of a mismatch
MISMATCH_WORDS = ("distributed collective mismatch", "Detected mismatch between collectives",
                  "op.preamble.length <= op.nbytes")

Status = RankStatus


class RanksHang(RuntimeError):
    """No rank made progress for `--hang-after` seconds; every rank was stopped."""


class RankFailed(RuntimeError):
    """A rank exited with an error (or left while the others waited); the others were stopped."""


def _short(where: str | None) -> str:
    if not where:
        return "an unknown line"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _code(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit status {code}"


# --- how a rank left ---------------------------------------------------------------------------
def ending(status: Status | None, code: int | None) -> dict[str, Any] | None:
    """How a rank left, or None while it runs: {"kind": "raised" | "exited" | "died", "at",
    "where", "collective", "text"}; "exited" also has "status"."""
    status = status or {}
    if status.get(RAISED):
        raised = status[RAISED]
        return {"kind": "raised", "at": raised.get("at", 0.0), "where": raised.get("where"),
                "collective": raised.get("collective"), "text": raised.get("error", "")}
    if status.get(LEFT) and (code is None or code >= 0):
        left = status[LEFT]
        return {"kind": "exited", "at": left.get("at", 0.0), "where": left.get("where"),
                "collective": left.get("collective"), "status": left.get("status"),
                "text": f"exit status {left.get('status')}"}
    if code is None:
        return None
    fault = status.get(FAULT) or {}
    # no word of its own: its death followed its last status
    return {"kind": "died", "at": status.get(TIME, float("-inf")), "where": fault.get("where"),
            "collective": fault.get("collective"), "text": fault.get("error") or _code(code),
            "fault": bool(fault)}


def first_failed(statuses: Mapping[int, Status | None],
                 codes: Mapping[int, int | None]) -> int | None:
    """The rank that left first, by the time each said it raised or exited (written at once);
    a rank that died without a word by its last status's time, which its death followed, so the
    ranks failing because it went away (their raise comes after) never count as first. A rank
    that finished (exit 0) counts when a rank failed in a collective after it: it left while
    the others waited."""
    ends = sorted((end["at"], rank, end) for rank in statuses
                  if (end := ending(statuses.get(rank), codes.get(rank))) is not None)
    for index, (_, rank, end) in enumerate(ends):
        if end["kind"] == "exited" and end.get("status") == 0:
            if any(later["kind"] != "exited" and later["collective"]
                   for _, _, later in ends[index + 1:]):
                return rank
            continue
        return rank
    return None


def _how(end: Mapping[str, Any]) -> str:
    """How a rank left, in words: 'exited with status 3 at train.py:40'."""
    at = f" at {_short(end['where'])}" if end.get("where") else ""
    if end["kind"] == "exited":
        if end.get("status") == 0 and not end.get("where"):
            return "ran to the end of its script (exit status 0)"
        return f"exited with status {end.get('status')}{at}"
    if end["kind"] == "died" and end.get("fault"):
        inside = f" in {end['collective']}" if end.get("collective") else ""
        return f"died in native code ({end['text']}){inside}{at}"
    return f"failed: {end['text']}{at}"


def _left(rank: int, end: Mapping[str, Any]) -> str:
    return f"rank {rank} {_how(end)}"


# --- where each rank is ------------------------------------------------------------------------
def _point(status: Status | None, code: int | None = None,
           stopped: bool = False) -> tuple[str | None, str]:
    """(collective, short file:line) where a rank stands; for a rank `stopped` by another's
    failure, where it stood when that one died: a collective it then failed in (its peer went
    away) is where it was waiting, so the answer does not depend on who the notebook saw first."""
    if not status:
        return None, _short(None)
    place: Mapping[str, Any] = status
    end = ending(status, code) if stopped else None
    if end is not None and end.get("where"):
        place = end
    return place.get("collective"), _short(place.get("where"))


def describe(rank: int, status: Status | None, code: int | None) -> str:
    """One rank, as a line: 'rank 1: waits in all_reduce at train.py:40 (in main)'."""
    end = ending(status, code)
    if end is not None:
        return f"rank {rank}: {_how(end)}"
    if code is not None:
        return f"rank {rank}: exited with status {code}"
    if status is None:
        return f"rank {rank}: never started its script (no status yet)"
    where = f"{_short(status.get(WHERE))}" + (
        f" (in {status[FUNCTION]})" if status.get(FUNCTION) else "")
    if status.get(AGENT_ERROR):  # it may have worked on, unseen
        where += f"; its status thread failed ({status[AGENT_ERROR][:120]}), so it was not seen"
    if status.get(COLLECTIVE):
        return f"rank {rank}: waits in {status[COLLECTIVE]} at {where}"
    return f"rank {rank}: in no collective, at {where}"


def _waiting(statuses: Mapping[int, Status | None], codes: Mapping[int, int | None],
             stopped: bool = False, first: int | None = None) -> dict[tuple[str, str], list[int]]:
    """(collective, where) -> the ranks waiting there: ranks still running (with `stopped`:
    also those that failed in a collective after the `first`, where they stood)."""
    points: dict[tuple[str, str], list[int]] = {}
    for rank, status in sorted(statuses.items()):
        if rank == first:
            continue
        end = ending(status, codes.get(rank))
        if end is not None and not (stopped and end["kind"] != "exited" and end["collective"]):
            continue
        collective, where = _point(status, codes.get(rank), stopped)
        if collective:
            points.setdefault((collective, where), []).append(rank)
    return points


def never_arrived(statuses: Mapping[int, Status | None], codes: Mapping[int, int | None],
                  stopped: bool = False, first: int | None = None) -> list[str]:
    """For each collective some ranks wait in, the ranks that never arrived there (a rank that
    had left its script: said so)."""
    lines = []
    for (collective, where), waiting in sorted(_waiting(statuses, codes, stopped, first).items(),
                                               key=lambda item: len(item[1])):
        gone, missing = [], []
        for rank in sorted(statuses):
            if rank in waiting:
                continue
            end = ending(statuses.get(rank), codes.get(rank))
            if end is not None and end["kind"] == "raised" and _short(end.get("where")) == where:
                continue  # it arrived there, and raised there: its error is the report's
            (gone if end is not None and end["kind"] == "exited" else missing).append(rank)
        verb = "waits" if len(waiting) == 1 else "wait"
        if missing:
            lines.append(f"{_ranks(missing)} never arrived at the {collective} that "
                         f"{_ranks(waiting)} {verb} in at {where}.")
        for rank in gone:
            lines.append(f"{_left(rank, ending(statuses.get(rank), codes.get(rank)) or {})} "
                         f"while {_ranks(waiting)} {verb} in {collective} at {where}.")
    return lines


def never_grouped(statuses: Mapping[int, Status | None]) -> str | None:
    """Said when no rank ever was in a process group: N runs side by side, not one job."""
    if len(statuses) < 2 or any(s is None or s.get(FORMED) for s in statuses.values()):
        return None
    return (f"the ranks never formed a process group: {len(statuses)} independent runs (the "
            "script calls no `init_process_group`, or a library ran each rank as a world of "
            f"one), so nothing was all-reduced between them; see {DOCS}.")


# --- collective mismatches ---------------------------------------------------------------------
def _call(entry: Mapping[str, Any]) -> str:
    shape = f", shape {entry['shape']}" if entry.get("shape") is not None else ""
    return f"{entry['call']} at {_short(entry.get('where'))}{shape}"


def parted(statuses: Mapping[int, Status | None]) -> str | None:
    """The first collective two ranks' logs differ in (collectives.py), as a sentence."""
    logs = {r: {e["n"]: e for e in (s or {}).get(COLLECTIVES) or []}
            for r, s in statuses.items()}
    ranks = sorted(r for r, log in logs.items() if log)
    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            for n in sorted(set(logs[a]) & set(logs[b])):
                x, y = logs[a][n], logs[b][n]
                if (x["call"], x.get("where"), x.get("shape")) != \
                        (y["call"], y.get("where"), y.get("shape")):
                    return (f"The ranks' collectives part at call #{n}: rank {a} made "
                            f"{_call(x)}, rank {b} {_call(y)}: {MISMATCH}.")
    return None


def mismatch(statuses: Mapping[int, Status | None], codes: Mapping[int, int | None],
             said: Mapping[int, str]) -> str | None:
    """A collective mismatch, named with both sides: the logs' first difference, or where
    each rank was when gloo (or torch's debug check) said the collectives do not match."""
    parts = parted(statuses)
    words = dict(said)
    for rank, status in statuses.items():
        error = ((status or {}).get(RAISED) or {}).get("error", "")
        if rank not in words and any(w in error for w in MISMATCH_WORDS):
            words[rank] = error
    if not words:
        return parts
    places = []
    for rank in sorted(statuses):
        collective, where = _point(statuses.get(rank), codes.get(rank), stopped=True)
        if collective:
            places.append(f"rank {rank} in {collective} at {where}")
    rank, text = min(words.items())
    quote = text.strip()
    for start in ("Received data size", "op.preamble.length"):  # gloo's words, from there on
        if start in quote:
            quote = quote[quote.index(start):]
            break
    lines = [f"A collective mismatch (rank {rank}: \"{quote[:200]}\"): "
             f"{'; '.join(places) or 'where each rank was is not known'}: {MISMATCH}."]
    return "\n".join([*lines, *([parts] if parts else [])])


# --- the reports -------------------------------------------------------------------------------
def hang_report(statuses: Mapping[int, Status | None], codes: Mapping[int, int | None],
                seconds: float) -> str:
    """The RanksHang message: no rank moved for `seconds`."""
    lines = [f"no rank made progress for {seconds:g} s, so every rank was stopped. Where "
             "each one was:"]
    lines += [f"  {describe(r, statuses.get(r), codes.get(r))}" for r in sorted(statuses)]
    parts = parted(statuses)
    waiting = _waiting(statuses, codes)
    if not waiting:
        lines.append("No rank is in a collective: each waits in its own code (a DataLoader, "
                     "a lock or a queue that never returns, input()), not in torch.distributed.")
        return "\n".join(lines)
    lines += never_arrived(statuses, codes)
    if parts:
        lines.append(parts)
    elif len(waiting) == 1 and len(next(iter(waiting.values()))) == len(statuses):
        lines.append("Every rank waits in the same collective at the same line: a collective "
                     "whose tensors differ in size or kind between ranks waits for ever with "
                     "gloo.")
    lines.append(f"A collective only one rank makes (a metric all_reduce under `if rank == 0`) "
                 f"is the usual cause; see {DOCS}.")
    return "\n".join(lines)


def stopped(rank: int, status: Status | None, code: int | None, failed: int,
            verb: str = "died") -> str:
    """A rank stopped because rank `failed` died (or left), as a line: where it was when that
    happened (an error of its own after that, its peer gone, is no second failure)."""
    end = ending(status, code)
    if end is not None and end["kind"] == "exited" and end.get("status") == 0:
        return f"rank {rank}: had finished (exit status 0) when rank {failed} {verb}"
    if _ended_on_its_own(end):  # no consequence of rank `failed`
        return f"rank {rank}: {_how(end)} (its own, not from rank {failed} going away)"
    if status is None:
        return f"rank {rank}: stopped before its script started, when rank {failed} {verb}"
    collective, where = _point(status, code, stopped=True)
    if collective:
        return (f"rank {rank}: stopped (waiting in {collective} at {where} when rank {failed} "
                f"{verb})")
    return f"rank {rank}: stopped (at {where}, in no collective, when rank {failed} {verb})"


def _ended_on_its_own(end: dict | None) -> bool:
    """A rank's end that its peers did not cause: finished, or its own error outside any
    collective, or a death of its own."""
    return end is not None and not (end["kind"] == "raised" and end["collective"])


def failure_report(failed: int, statuses: Mapping[int, Status | None],
                   codes: Mapping[int, int | None], said: Mapping[int, str] | None = None) -> str:
    """The RankFailed message: rank `failed` left first, its traceback as the cause; where
    each other rank was when it left; a collective mismatch named with both sides.

    said: what a rank printed of a collective mismatch (gloo's abort message), by rank."""
    status = statuses.get(failed) or {}
    end = ending(status, codes.get(failed)) or {"kind": "died", "text": _code(codes.get(failed))}
    head = _left(failed, end)
    if end["kind"] == "exited" and end.get("status") == 0:
        head += " while the others waited"
    lines = [f"{head}; the other ranks were stopped."]
    raised = status.get(RAISED) or {}
    if raised.get("traceback"):
        lines.append(f"The cause, rank {failed}'s traceback (also above, under [rank {failed}]):")
        lines += [f"  {line}" for line in raised["traceback"].splitlines()]
    elif end["kind"] == "died" and not end.get("fault"):
        lines.append(f"Rank {failed} ended without a Python traceback (killed, out of memory, "
                     f"or a crash in native code): its last output is above, under [rank "
                     f"{failed}].")
    verb = "left" if end["kind"] == "exited" else "died"
    lines.append(f"Where each other rank was when rank {failed} {verb}:")
    lines += [f"  {stopped(r, statuses.get(r), codes.get(r), failed, verb)}"
              for r in sorted(statuses) if r != failed]
    found = mismatch(statuses, codes, said or {})
    lines += [found] if found else never_arrived(statuses, codes, stopped=True, first=failed)
    if not all(_ended_on_its_own(ending(statuses.get(r), codes.get(r)))
               for r in statuses if r != failed):  # a rank it stopped may say so after
        lines.append(f"An error a stopped rank printed after that (gloo's \"Connection closed "
                     f"by peer\" and the like) comes from rank {failed} going away, not from a "
                     f"bug of its own; see {DOCS}.")
    return "\n".join(lines)
