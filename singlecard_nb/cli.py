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
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from .job import launched_world_size, rank

PROG = "python -m singlecard_nb"
# Our options that take a value: everything up to the script (or -m MODULE) is ours.
_VALUED = {"--device", "--every", "--save", "--include", "--exclude", "--max-rows", "-m",
           "--ranks-dir"}
# Options that mean "inspect": each one turns --inspect on
_OWN = ("device", "inspect", "save", "module", "ranks_dir")  # the rest are inspect()'s, by their names
_INSPECT_OPTIONS = ("grads", "params", "trap", "memory", "every", "save", "include",
                    "exclude", "max_rows")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} [options] (script.py | -m package.module) [args...]",
        description="Run a training script unchanged, its models inspected "
                    "(singlecard_nb.inspect_all) and, with --device, on one device.")
    p.add_argument("--device", metavar="TARGET",
                   help="pin to one device first and run DataParallel/DDP code on it "
                        "(as %%singlecard TARGET): a GPU index, UUID, 'auto' or 'cpu'")
    p.add_argument("--inspect", action="store_true",
                   help="inspect every model the script calls (implied by each option below)")
    p.add_argument("--grads", action="store_true", help="also record gradients")
    p.add_argument("--params", action="store_true",
                   help="also record parameters after each optimiser step (compare_ranks)")
    p.add_argument("--trap", action="store_true",
                   help="stop at the first NaN/Inf output or gradient (NonFiniteError)")
    p.add_argument("--memory", action="store_true",
                   help="also record what each module saved for backward (insp.memory())")
    p.add_argument("--every", type=_positive, metavar="N",
                   help="record steps 0, N, 2N... (default 1)")
    p.add_argument("--include", action="append", metavar="GLOB", help="only these modules")
    p.add_argument("--exclude", action="append", metavar="GLOB", help="skip these modules")
    p.add_argument("--max-rows", type=_positive, default=None, metavar="N",
                   help="keep at most N rows per model (ring buffer)")
    p.add_argument("--save", metavar="PATH",
                   help="write the records at exit (per rank in a job: PATH.rank<N>.db; "
                        "several models: one file each, PATH.<Model>.db)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    p.add_argument("--ranks-dir", metavar="DIR",
                   help="this process is a rank of `%%singlecard cpu --ranks N` (torchrun's "
                        "variables set): it joins the real world of N on --device, says where "
                        "it stands in DIR/rank<k>.json and saves its records there as it goes")
    return p


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, the script and its arguments): ours end at the first word that is not an
    option of ours or its value, or right after `-m MODULE`."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1:]
        if not word.startswith("-"):
            break
        if word in _VALUED:
            i += 1
            if word == "-m":
                return argv[:i + 1], argv[i + 1:]
        i += 1
    return argv[:i], argv[i:]


def main(argv: list[str] | None = None) -> int:
    """Parse, pin, inspect, run; returns the exit status."""
    p = parser()
    ours, rest = split(list(sys.argv[1:] if argv is None else argv))
    _refuse_abbreviations(p, ours)
    options = p.parse_args(ours)  # a bad option: argparse's one-line error, exit status 2
    if options.module is None and not rest:
        p.error("give the script to run (script.py [args...]) or -m package.module")
    script = None if options.module is not None else rest.pop(0)
    if script is not None:
        _check_script(p, script)
    if options.save is not None:  # checked, and fixed to this folder, before the script runs
        options.save = _save_path(p, options.save)
    inspect = options.inspect or any(getattr(options, name) for name in _INSPECT_OPTIONS)
    agent = None
    if options.ranks_dir is not None:
        from .ranks.agent import Agent

        agent = Agent(options.ranks_dir, rank()).start()
    if options.device is not None:
        from . import session

        try:
            session.pin(options.device, world=launched_world_size() if agent else 1)
        except ValueError as e:  # TargetError, a broken machine file: nothing has run
            p.error(f"argument --device: {e}")
    finder = None
    hint = None
    if inspect:
        from . import borrow, errors

        hint = borrow.Borrowed("the trap's words on a terminal")
        hint.set_attr(errors, "rows_hint", _rows_hint(options.save), "NonFiniteError rows")
        from .inspection.finding.discovery import Discovery

        try:
            finder = Discovery(**_inspect_options(options)).start()
        except (TypeError, ValueError) as e:
            p.error(str(e))
        if agent is not None and options.save:
            agent.every_beat(_saving_as_it_goes(finder, options.save))
    status, started_in = 1, os.getpid()
    try:
        status = _run(script, options.module, rest, agent)
    finally:
        forked = os.getpid() != started_in  # a child the script forked left the script's code
        if agent is not None and not forked:
            agent.stop(status)
        try:
            if finder is not None:
                finder.stop()
                if not forked:
                    _report(finder)
                if options.save and forked:
                    _say_forked_child_leaves_the_save(started_in, options.save)
                elif options.save and not _save(finder, options.save, quiet=agent is not None):
                    status = status or 1  # the records asked for were not written: a failure
        finally:
            if hint is not None:
                hint.restore()
            if options.device is not None:  # given back, as everything borrowed is
                from . import session

                session.release()
    return status


def _refuse_abbreviations(p: argparse.ArgumentParser, ours: list[str]) -> None:
    """`--dev cpu` is refused by name: an abbreviation would take the script's own options
    (`--dev` of a script's argparse) for ours."""
    # argparse lists its options only in this attribute (it has no public accessor)
    names = [o for action in p._actions for o in action.option_strings if o.startswith("--")]
    for word in ours:
        given = word.split("=", 1)[0]
        if given.startswith("--") and given not in names:
            meant = [name for name in names if name.startswith(given)]
            if meant:
                p.error(f"{given}: write the option in full ({' or '.join(meant)}); "
                        "abbreviations are not accepted, so the script's own options are "
                        "never taken for ours")


def _check_script(p: argparse.ArgumentParser, script: str) -> None:
    """A file, or a folder (or zip) with `__main__.py`, as python runs them."""
    path = Path(script)
    if path.is_dir() and not (path / "__main__.py").is_file():
        p.error(f"can't find '__main__' module in {script!r}")
    if not path.exists():
        p.error(f"can't open file {script!r}: no such file")


def _save_path(p: argparse.ArgumentParser, path: str) -> str:
    """`--save PATH` checked before the script runs, and made absolute, so a script that changes
    folder (os.chdir) still saves where the command line said."""
    from .inspection.runs.records import rank_path

    try:
        rank_path(path, rank(), launched_world_size())
    except ValueError as e:
        p.error(f"argument --save: {e}")
    return os.path.abspath(path)


def _say_forked_child_leaves_the_save(parent: int, path: str) -> None:
    print(f"singlecard_nb: process {os.getpid()}, forked from {parent}, does not save its "
          f"records: {path} is written by the process that started the script.", file=sys.stderr)


def _inspect_options(options: argparse.Namespace) -> dict[str, Any]:
    """inspect()'s keyword arguments: every option but the command line's own, by its name."""
    return {key: value for key, value in vars(options).items()
            if key not in _OWN and value is not None}  # not given: inspect()'s default


def _run(script: str | None, module: str | None, args: list[str], agent: Any = None) -> int:
    """Run the script as python would; its exit status (1 after an error, with explanation)."""
    saved_argv, path, saved_path = sys.argv[:], sys.path, sys.path[:]
    try:
        if script is not None:
            sys.argv = [script, *args]
            where = os.path.abspath(script)  # a folder with __main__.py is itself on the path
            sys.path[0:1] = [where if os.path.isdir(where) else os.path.dirname(where)]
            runpy.run_path(where, run_name="__main__")  # __file__ absolute, as python 3.9+
        else:
            sys.argv = [module, *args]  # runpy puts the module's file name in argv[0]
            sys.path[0:1] = [os.getcwd()]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        return _exit_status(e.code)
    except KeyboardInterrupt as e:
        _print_as_python_does(e)
        return 130
    except Exception as e:
        if agent is not None:
            agent.raised(e)  # before the traceback: the first rank to fail is the one to show
        if not _print_as_python_does(e, module):
            _explain(e)
        return 1
    finally:
        # all of it, as it was: a script that emptied sys.path (or replaced it) leaves us the
        # imports the save needs
        sys.argv = saved_argv
        path[:] = saved_path
        sys.path = path


def _print_as_python_does(error: BaseException, module: str | None = None) -> bool:
    """The traceback from the script's own frames on, as python prints it (ours and runpy's
    left out, the exception itself untouched); True when nothing of the script ran (its syntax
    error, a `-m` module that is not there): then that is all python prints."""
    tb = error.__traceback__
    while tb is not None and _is_launcher(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is None and module is not None and isinstance(error, ImportError):
        print(f"{sys.executable}: {error}", file=sys.stderr)  # python -m's own words
        return True
    traceback.print_exception(type(error), error, tb)
    return tb is None


_LAUNCHERS = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))


def _is_launcher(filename: str) -> bool:
    return os.path.abspath(filename) in _LAUNCHERS or filename.startswith("<frozen runpy")


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what `sys.exit("message")` prints
    return 1


def _explain(error: Exception) -> None:
    from .diagnosis.explain import build

    try:
        explanation = build(error)
    except Exception as e:
        print(f"singlecard_nb: could not explain this error ({type(e).__name__}: {e}).",
              file=sys.stderr)
        return
    if explanation is not None:
        print(f"\n{explanation!r}", file=sys.stderr)


TOP_FINDINGS = 5


def _rows_hint(save: str | None) -> str:
    """What the trap says about the rows, on a terminal: where they will be, how to read them."""
    if save:
        return (f"The rows recorded so far are saved at exit to {save}: read them with "
                f"`import singlecard_nb as scn; scn.load({save!r})`, their findings with "
                f"`scn.findings({save!r})`.")
    return ("Run again with --save PATH to keep the rows recorded so far, then read them with "
            "`import singlecard_nb as scn; scn.load(PATH)`, their findings with "
            "`scn.findings(PATH)`.")


def _report(finder: Any) -> None:
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


def _saving_as_it_goes(finder: Any, path: str, seconds: float = 1.0) -> Any:
    """A rank's records saved every `seconds` while the script runs (a rank stopped because
    another failed or hung has no exit to save at); returns {"records": {model: steps}}."""
    import time

    last = [0.0]

    def save() -> dict[str, Any]:
        found = finder.inspectors
        if found and time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            _save(finder, path, quiet=True)
        return {"records": {name: insp.steps_recorded for name, insp in found.items()}}

    return save


def _save(finder: Any, path: str, quiet: bool = False) -> bool:
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
            f"{target.stem}.{_file_part(name)}{target.suffix}")
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
    from .inspection.finding.discovery import current

    found = dict(finder.inspectors)
    theirs = current()
    if theirs is not None and theirs is not finder:
        theirs.stop()  # the script's own finder, still looking if the script never stopped it
        known = {id(insp) for insp in found.values()}
        for name, insp in theirs.inspectors.items():
            if id(insp) not in known:
                found[name if name not in found else f"{name}#{len(found) + 1}"] = insp
    return found


def _file_part(name: str) -> str:
    """A model's name as part of a file name: a class named `a/b` or `T{x}` saves too."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
