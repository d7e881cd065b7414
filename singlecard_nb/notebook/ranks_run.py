"""`%singlecard cpu --ranks N`: the next `%run script.py args` runs the script as N ranks.

Only parses, calls the ranks wing and renders. The setting lives per shell with one owner that
wraps `%run` (the real callable behind IPython's lazy placeholder, as `%inspect all` does; the
two wrappers compose in either order: each passes through when it has nothing to do) and gives
it back at `--ranks 1`, `%singlecard off` and `%unload_ext`. Under `%inspect all` (or a Python
`scn.inspect_all()`) the ranks are inspected with its options; what the cell shows meanwhile is
ranks_progress's; after the run their records are read back: `scn.inspectors()` holds
`GPT[rank 0]`, `GPT[rank 1]`, ..., `scn.inspector()` is rank 0's and `scn.compare_ranks()`
compares them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError

from .. import job, session
from ..borrow import Borrowed
from . import lazy_magics
from .ranks_progress import Progress, SideBySide

DEFAULT_HANG_AFTER = 60.0
MIN_HANG_AFTER = 1.0  # two of the ranks' status beats (ranks/agent.py's INTERVAL, 0.5 s)
MAX_RANKS = 256  # more is a typo (`--ranks 100000`), not a job one card can hold
_CLI_FLAGS = {"grads": "--grads", "params": "--params", "trap": "--trap", "memory": "--memory"}
_CLI_VALUES = {"every": "--every", "max_rows": "--max-rows"}
_CLI_LISTS = {"include": "--include", "exclude": "--exclude"}


@dataclass
class Setting:
    ranks: int
    hang_after: float
    owner: Borrowed


_settings: dict[int, Setting] = {}  # id(shell) -> its setting, while ranks > 1


def current(shell: Any) -> Setting | None:
    return _settings.get(id(shell))


def describe(shell: Any) -> str:
    """The line `%singlecard status` adds."""
    setting = current(shell)
    if setting is None:
        return "Ranks: 1 (%run runs in this process; `%singlecard cpu --ranks N` for N ranks)."
    return (f"Ranks: {setting.ranks} (the next %run starts {setting.ranks} processes on the "
            f"pinned device; the hang doctor stops them after {setting.hang_after:g} s without "
            "progress; `--ranks 1` for a world of one). See docs/ranks.md.")


def configure(shell: Any, ranks: int, hang_after: float | None) -> str:
    """Set the ranks of the next `%run` (checked by the caller); returns what to say."""
    setting = current(shell)
    if ranks == 1:
        if setting is not None:
            setting.owner.restore()
            return "Ranks: 1 again: %run runs the script in this process, a world of one."
        return ""
    hang_after = DEFAULT_HANG_AFTER if hang_after is None else hang_after
    if setting is not None:
        setting.ranks, setting.hang_after = ranks, hang_after
    else:
        _settings[id(shell)] = Setting(ranks, hang_after, _wrap_run(shell))
    said = (f"Ranks: {ranks}: the next %run starts the script as {ranks} processes on this "
            f"device (RANK, WORLD_SIZE, ... as torchrun sets them); the hang doctor stops them "
            f"after {hang_after:g} s without progress.")
    cores = _cores()
    if ranks > cores:
        said += (f"\nsinglecard_nb: {ranks} ranks on this machine's {cores} CPU cores: they "
                 f"take turns, so each step takes about {ranks / cores:.1f}× as long as with a "
                 "core each, and a busy rank may look stalled to the others; see docs/ranks.md.")
    return said


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's)
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def forget(shell: Any) -> None:
    """`%singlecard off`: back to a world of one."""
    setting = current(shell)
    if setting is not None:
        setting.owner.restore()


def _wrap_run(shell: Any) -> Borrowed:
    def wrapper_for(original: Any) -> Any:
        def run(parameter_s: str = "", *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841
            setting = current(shell)
            if setting is None or setting.ranks < 2:
                return original(parameter_s, *args, **kwargs)
            return run_ranks(shell, parameter_s, setting)

        return run

    owner = Borrowed("%singlecard --ranks: %run starts N ranks")
    lazy_magics.wrap_line_magic(shell, "run", wrapper_for, owner, "%run wrapper (ranks)")
    owner.on_restore(lambda: _settings.pop(id(shell), None), "the ranks setting")
    return owner


# --- one run ------------------------------------------------------------------------------------
def _program(line: str) -> list[str]:
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"%run under --ranks: {e} in {line!r}") from None
    if not words:
        raise UsageError("%run under --ranks: give the script to run (%run script.py args).")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError("%run -m: give the module to run.")
        return words
    if words[0].startswith("-"):
        raise UsageError(f"%run {words[0]} under --ranks: the ranks are processes of "
                         "their own, so %run's options for this process (-i, -d, -t, -p, -e, "
                         "-n) do not apply; accepted: `%run script.py args` or `%run -m "
                         "module args`, or `%singlecard cpu --ranks 1` first.")
    from IPython.utils.path import get_py_filename

    try:  # as a plain %run finds it: `~` expanded, `.py` added
        words[0] = get_py_filename(words[0])
    except OSError:
        raise UsageError(f"%run: no such file {words[0]!r} (in {os.getcwd()}).") from None
    _refuse_own_spawn(words[0])
    return words


def _refuse_own_spawn(script: str) -> None:
    """A script that starts its ranks itself (`mp.spawn(main, nprocs=world_size)`): each of N
    ranks would start the whole job again (every copy rank 0, on one port)."""
    import ast

    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return  # the rank says what is wrong with it
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in ("spawn", "start_processes") \
                and ast.unparse(func.value).endswith(("mp", "multiprocessing")):
            name = os.path.basename(script)
            raise UsageError(
                f"%run under --ranks: {name} starts its own ranks ({ast.unparse(func)} at "
                f"{name}:{node.lineno}), so each of the N ranks would start the whole job "
                "again; run it as written with `%singlecard cpu --ranks 1` (mp.spawn's rank 0 "
                "runs in this process), or call its worker without mp.spawn under --ranks N "
                "(docs/ranks.md).")


def _target() -> tuple[str, dict[str, str]]:
    """What every rank pins, and the notebook's environment before its own pin."""
    state = session.current()
    if state is None:
        raise UsageError("%run under --ranks needs a pinned device: `%singlecard cpu --ranks N` "
                         "or `%singlecard GPU --ranks N`.")
    environ = dict(os.environ)
    for name, value in state.env_before.items():  # each rank pins itself, as the notebook did
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    if state.gpu is None:
        return "cpu", environ
    return (state.mig.uuid if state.mig is not None else state.gpu.uuid), environ


def _finder(shell: Any) -> tuple[Any, bool]:
    """`%inspect all`'s finder, or else a Python `scn.inspect_all()` still looking (None:
    neither), and whether it asked for the live view."""
    magics = shell.magics_manager.registry.get("InspectMagics")
    finder = getattr(magics, "finder", None)
    if finder is not None and finder.active:
        return finder, bool(getattr(magics, "finder_live", False))
    from ..inspection.finding import current

    finder = current()
    return (finder, False) if finder is not None and finder.active else (None, False)


def cli_options(options: dict[str, Any]) -> list[str]:
    """`%inspect all`'s options as `python -m singlecard_nb` takes them."""
    words: list[str] = []
    for key, value in options.items():
        if key in _CLI_FLAGS and value:
            words.append(_CLI_FLAGS[key])
        elif key in _CLI_VALUES and value is not None and not (key == "every" and value == 1):
            words += [_CLI_VALUES[key], str(value)]
        elif key in _CLI_LISTS and value:
            for glob in value:
                words += [_CLI_LISTS[key], str(glob)]
    return words


def run_ranks(shell: Any, line: str, setting: Setting) -> None:
    """Run the script as `setting.ranks` processes; raises RankFailed / RanksHang.

    1. Plan: the script's command line and the pinned target, each rank's command and
       torchrun's variables (`ranks.launch.plan`: pure, nothing starts); under `%inspect all`
       each rank inspects with the notebook's options and saves to the run's folder.
    2. Start and watch: `ranks.run.RankJob.run()` starts the ranks (torch elastic's
       `start_processes`, what torchrun runs), echoes `[rank k]`, reads their status files
       (`ranks.rank_status`) for the cell's progress, and ends when all exit 0, one fails,
       none moves for `hang_after` seconds, or on Ctrl-C, every rank stopped by torchrun's
       own `PContext.close()`.
    3. Read back, in `finally`: the ranks' last statuses (a job that never formed a process
       group is said), their records joined to `scn.inspectors()` and remembered for
       `scn.compare_ranks()` (`job.LAST_RANKS_RUN`), and the run's folder removed.
    """
    __tracebackhide__ = True  # noqa: F841
    from ..ranks import doctor, launch
    from ..ranks.run import RankJob

    program = _program(line)
    target, environ = _target()
    finder, live = _finder(shell)
    folder = tempfile.mkdtemp(prefix="singlecard_nb-ranks-")
    options = []
    if finder is not None:
        options = [*cli_options(finder.options), "--save", os.path.join(folder, "records.db")]
        finder.reset()  # a new run: the previous run's models are forgotten
    ranks = launch.plan(setting.ranks, target, folder, program, options, environ=environ)
    progress = None if finder is None else (SideBySide if live else Progress)(setting.ranks)
    job.LAST_RANKS_RUN.remember("the last `%run` of ranks recorded nothing: turn `%inspect "
                                "all --params` on before `%run`, so each rank records its "
                                "models" if finder is None else None)
    ended, note = "stopped", None
    try:
        RankJob(ranks, folder, setting.hang_after,
                on_status=progress.update if progress is not None else None).run()
        ended = "finished"
    finally:
        try:
            statuses = _statuses(folder, setting.ranks)
            if ended == "finished" and (note := doctor.never_grouped(statuses)):
                print(f"singlecard_nb: {note}", flush=True)
            if progress is not None:  # the ranks' last words: their final steps
                progress.update(statuses, ended, note)
            if finder is not None:
                _read_back(finder, folder, statuses, note)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _statuses(folder: str, ranks: int) -> dict[int, Any]:
    from ..ranks import rank_status

    return {rank: rank_status.read(folder, rank) for rank in range(ranks)}


def _read_back(finder: Any, folder: str, statuses: dict[int, Any],
               note: str | None = None) -> None:
    """Each rank's models join `scn.inspectors()` (`GPT[rank 1]`, `Sequential#2[rank 1]`: the
    names the ranks gave them); one job per model is kept for `compare_ranks()`, and rank 0's
    model is what `scn.inspector()` answers with."""
    from ..inspection.engine import recorded_elsewhere
    from ..inspection.runs import from_folder, load, model_part
    from ..ranks.rank_status import RECORDS

    named = {model_part(name): name for status in statuses.values()
             for name in ((status or {}).get(RECORDS) or {})}
    found = {}
    for key, recorded in from_folder(folder).items():
        model, _, rank = key.rpartition("[rank ")
        recorded.name = f"{named.get(model, model)}[rank {rank}"
        found[recorded.name] = recorded
    finder.adopt(found)
    if not found:
        job.LAST_RANKS_RUN.remember("the last `%run` of ranks recorded nothing: no rank "
                                    "called a model with parameters")
        return
    jobs: dict[str, list[str]] = {}
    for name, recorded in found.items():
        jobs.setdefault(name.rsplit("[rank ", 1)[0], []).append(str(recorded.path))
    job.LAST_RANKS_RUN.remember({model: load(paths) for model, paths in jobs.items()}, note)
    rank_0 = [r for r in found.values() if r.rank == 0] or list(found.values())
    recorded_elsewhere(max(rank_0, key=lambda r: r.steps_recorded))
