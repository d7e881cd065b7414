"""`python -m singlecard_nb [options] script.py args`: a training script, unchanged, inspected.

    python -m singlecard_nb --device cpu --inspect --trap train.py --batch_size=8
    torchrun --nproc_per_node=4 -m singlecard_nb --inspect --params --save runs/job.db train.py

The script runs as `python script.py args` would run it (`__name__ == "__main__"`, `sys.argv`,
`sys.path[0]` its folder; `-m package.module` as `python -m`). This module ties the wings, as
`session.py` does: `--device` pins and turns single-card mode on first (as `%singlecard TARGET`
does); `--inspect` inspects every model the script calls (`inspect_all`). Records are saved at
exit, also when the script fails or is interrupted; a failure inside a module (a NaN the trap
caught) prints its explanation under the traceback, and the exit status is not zero.
Tracebacks start at the script's own frames, as python prints them; the exit statuses and
messages are listed in docs/inspect-all.md ("Exit statuses and messages").

Here the flow; its parts: `arguments` (our options, checked before the script runs), `script`
(the script run as python runs it), `at_exit` (findings printed, records saved).
"""

from __future__ import annotations

import contextlib
import os
import sys

from ..job import launched_ranks, rank
from . import at_exit
from .arguments import (
    check_script,
    inspect_options,
    parser,
    refuse_abbreviations,
    save_path,
    split,
    wants_inspection,
)
from .script import run


def main(argv: list[str] | None = None) -> int:
    """Parse, pin, inspect, run; returns the exit status.

    1. Parse: our options (before the script's), each checked before anything runs; a
       mistake is argparse's one-line error and exit status 2.
    2. In a rank of `--ranks N` (`--ranks-dir`): its status agent starts.
    3. Pin: `--device` pins through `session.pin()`, single-card mode on (a world of N under
       torchrun or `--ranks N`).
    4. Inspect: `--inspect` starts `inspect_all`; the trap's words name the `--save` file.
    5. Run the script as python would (`script.run`).
    6. Exit, in `finally`: the agent told the status, the finder stopped, its findings
       printed, the records saved (a rank's by its agent's exit work), the trap's words and
       the pin given back; a save that failed makes the status 1.
    7. A process group the script left formed is destroyed before the interpreter exits
       (`at_exit.destroy_left_group`: gloo's threads can otherwise abort the process).
    """
    p = parser()
    ours, rest = split(list(sys.argv[1:] if argv is None else argv))
    refuse_abbreviations(p, ours)
    options = p.parse_args(ours)  # a bad option: argparse's one-line error, exit status 2
    if options.module is None and not rest:
        p.error("give the script to run (script.py [args...]) or -m package.module")
    script = None if options.module is not None else rest.pop(0)
    if script is not None:
        check_script(p, script)
    if options.save is not None:  # checked, and fixed to this folder, before the script runs
        options.save = save_path(p, options.save)
    inspect = wants_inspection(options)
    agent = None
    if options.ranks_dir is not None:
        from ..ranks.agent import Agent

        agent = Agent(options.ranks_dir, rank()).start()
    if options.device is not None:
        from .. import session

        try:
            # Under torchrun (or `%singlecard --ranks N`) the ranks stay one job: a world of N
            # on the pinned device, as N real GPUs would run it, not N worlds of one
            session.pin(options.device, world=launched_ranks())
        except ValueError as e:  # TargetError, a broken machine file: nothing has run
            p.error(f"argument --device: {e}")
    finder = None
    given_back = contextlib.ExitStack()  # what the trap says, as it was, after the script
    if inspect:
        from ..errors import TRAP_ROWS

        given_back.enter_context(TRAP_ROWS.saying(at_exit.rows_hint(options.save)))
        from ..inspection.finding import Discovery

        try:
            finder = Discovery(**inspect_options(options)).start()
        except (TypeError, ValueError) as e:
            p.error(str(e))
        if agent is not None and options.save:
            agent.every_beat(at_exit.status_as_it_goes(finder, agent))
            save_to = options.save  # the rank's records, saved once at its exit, however it ends
            agent.at_exit(lambda: at_exit.save(finder, save_to, quiet=True))
    if agent is not None:
        from ..ranks.launch import adopt_notebook_path

        adopt_notebook_path()  # a rank's script imports as the notebook's %run would
    status, started_in = 1, os.getpid()
    try:
        status = run(script, options.module, rest, agent)
    finally:
        forked = os.getpid() != started_in  # a child the script forked left the script's code
        if agent is not None and not forked:
            agent.stop(status)
        try:
            if finder is not None:
                finder.stop()
                if not forked:
                    at_exit.report(finder)
                if options.save and forked:
                    at_exit.say_forked_child_leaves_the_save(started_in, options.save)
                elif options.save and agent is not None:
                    if agent.exit_work() is False:
                        status = status or 1  # the records asked for were not written
                elif options.save and not at_exit.save(finder, options.save):
                    status = status or 1  # the records asked for were not written: a failure
        finally:
            given_back.close()
            if options.device is not None:  # given back, as everything borrowed is
                from .. import session

                session.release()
            if not forked:  # a forked child's group is its parent's to end
                at_exit.destroy_left_group()
    return status

