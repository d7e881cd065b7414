"""The command line's own options: parsed, and checked before the script runs.

Ours end at the script (or right after `-m MODULE`); an abbreviation is refused by name, so the
script's own options are never taken for ours.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..job import launched_world_size, rank

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
                        "it stands in DIR/rank<k>.json and saves its records there at its exit")
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



def refuse_abbreviations(p: argparse.ArgumentParser, ours: list[str]) -> None:
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


def check_script(p: argparse.ArgumentParser, script: str) -> None:
    """A file, or a folder (or zip) with `__main__.py`, as python runs them."""
    path = Path(script)
    if path.is_dir() and not (path / "__main__.py").is_file():
        p.error(f"can't find '__main__' module in {script!r}")
    if not path.exists():
        p.error(f"can't open file {script!r}: no such file")


def save_path(p: argparse.ArgumentParser, path: str) -> str:
    """`--save PATH` checked before the script runs, and made absolute, so a script that changes
    folder (os.chdir) still saves where the command line said."""
    from ..inspection.runs import rank_path

    try:
        rank_path(path, rank(), launched_world_size())
    except ValueError as e:
        p.error(f"argument --save: {e}")
    return os.path.abspath(path)



def inspect_options(options: argparse.Namespace) -> dict[str, Any]:
    """inspect()'s keyword arguments: every option but the command line's own, by its name."""
    return {key: value for key, value in vars(options).items()
            if key not in _OWN and value is not None}  # not given: inspect()'s default



def wants_inspection(options: argparse.Namespace) -> bool:
    """--inspect, or any option that means inspecting (each one turns --inspect on)."""
    return options.inspect or any(getattr(options, name) for name in _INSPECT_OPTIONS)
