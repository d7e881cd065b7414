"""What the command line does as the script ends: the findings printed, the records saved (also
after an error, and when a rank of `--ranks N` is stopped), the trap's words on a terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..inspection.runs import model_part
from ..job import group_formed


def say_forked_child_leaves_the_save(parent: int, path: str) -> None:
    print(f"singlecard_nb: process {os.getpid()}, forked from {parent}, does not save its "
          f"records: {path} is written by the process that started the script.", file=sys.stderr)


def destroy_left_group() -> None:
    """The default process group the script left formed, destroyed before the interpreter
    exits, as torch asks a script to do: a gloo group left to the interpreter's teardown can
    abort the process after the script ended well ("terminate called without an active
    exception", exit status -6 under torchrun: 5 of 12 runs of a two-rank gloo script without
    it on a loaded 2-core box, torch 2.15; 0 of 12 with it). The script is over, so nothing of
    it is lost; a failure here leaves the group to the interpreter, as before.

    After single-card mode has given its patches back, so with the same pause its own
    destroy_process_group() makes first (`let_finished_works_go`): without it a rank of a
    two-rank gloo job under torch 2.6 (tests/scripts/mesh_world.py) hung here in 6 of 20 runs on
    a loaded 2-core box, destroying the group while a gloo thread waited for the GIL."""
    if not group_formed():
        return
    from ..parallel.groups import let_finished_works_go

    let_finished_works_go()
    try:
        sys.modules["torch.distributed"].destroy_process_group()
    except Exception:  # noqa: BLE001 - the script's outcome stands; torch's exit path remains
        pass


TOP_FINDINGS = 5


def rows_hint(save: str | None) -> str:
    """What the trap says about the rows, on a terminal: where they will be, how to read them."""
    if save:
        return (f"The rows recorded so far are saved at exit to {save}: read them with "
                f"`import singlecard_nb as scn; scn.load({save!r})`, their findings with "
                f"`scn.findings({save!r})`.")
    return ("Run again with --save PATH to keep the rows recorded so far, then read them with "
            "`import singlecard_nb as scn; scn.load(PATH)`, their findings with "
            "`scn.findings(PATH)`.")


def report(finder: Any) -> None:
    """The top findings of each model, likeliest cause first; also when nothing is NaN."""
    for name, insp in finder.inspectors.items():
        try:
            rows = insp.findings(TOP_FINDINGS)
        except Exception as e:  # the report must not hide the script's own outcome
            print(f"singlecard_nb: {name}: could not rank the findings ({type(e).__name__}: "
                  f"{e}).", file=sys.stderr)
            continue
        steps = insp.steps_recorded
        if not rows:
            print(f"singlecard_nb: {name}: {steps} steps recorded; nothing stands out (no NaN/"
                  "Inf, nothing growing, no outlier or dead module).", file=sys.stderr)
            continue
        lines = [f"singlecard_nb: {name}: {steps} steps recorded; findings, likeliest cause "
                 "first:"]
        lines += [f"  {i}. {row.text()}" for i, row in enumerate(rows, 1)]
        print("\n".join(lines), file=sys.stderr)


def status_as_it_goes(finder: Any, agent: Any, seconds: float = 1.0) -> Any:
    """What a rank of `--ranks N` adds to its status: {"records": {model: steps}} at each beat,
    and every `seconds` (and at the last beat) "latest": {model: its latest steps} (the
    notebook's side-by-side view reads them). Small: the records themselves are saved once,
    at the rank's exit (also when it is stopped: lifeline.py)."""
    import time

    from ..inspection.views import Latest
    from ..ranks.rank_status import LATEST, RECORDS

    last = [0.0]
    latest: dict[str, Latest] = {}

    def beat() -> dict[str, Any]:
        found = finder.inspectors
        said: dict[str, Any] = {RECORDS: {name: insp.steps_recorded
                                            for name, insp in found.items()}}
        if found and (agent.stopping or time.monotonic() - last[0] >= seconds):
            last[0] = time.monotonic()
            for name, insp in found.items():
                latest.setdefault(name, Latest(insp))
            said[LATEST] = {name: view.snapshot() for name, view in latest.items()}
        return said

    return beat


def save(finder: Any, path: str, quiet: bool = False) -> bool:
    """Each model's records: PATH for one model, PATH.<Model>.db (suffix kept) for several;
    False when a file could not be written (said, with why)."""
    found = _models(finder)
    if quiet and not found:
        return True
    if not found:
        print(f"singlecard_nb: no model was called, so nothing was saved to {path}.",
              file=sys.stderr)
        return True
    target, saved = Path(path), True
    for name, insp in found.items():
        where = target if len(found) == 1 else target.with_name(
            f"{target.stem}.{model_part(name)}{target.suffix}")
        try:
            written = insp.save(where)
        except OSError as e:
            print(f"singlecard_nb: {e}", file=sys.stderr)
            saved = False
            continue
        if not quiet:
            print(f"singlecard_nb: {name}: {insp.steps_recorded} steps recorded, saved to "
                  f"{written}", file=sys.stderr)
    return saved


def _models(finder: Any) -> dict[str, Any]:
    """The models ours found, and those of an `inspect_all()` the script started itself (which
    stopped ours): every record the run made."""
    from ..inspection.finding import current

    found = dict(finder.inspectors)
    theirs = current()
    if theirs is not None and theirs is not finder:
        theirs.stop()  # the script's own finder, still looking if the script never stopped it
        known = {id(insp) for insp in found.values()}
        for name, insp in theirs.inspectors.items():
            if id(insp) not in known:
                found[name if name not in found else f"{name}#{len(found) + 1}"] = insp
    return found
