"""The findings corpora of issue 37: training scripts in the shape of real code, run as the README's
flow runs them, and what a user then reads.

    result = run_job(HEALTHY["healthy_nanogpt"], steps=300)
    result.pointer          # the first thing a person reads: the trap's explanation, else the
                            # first finding of the first model with one; None: nothing stands out
    result.models[0].exit_line   # "singlecard_nb: GPT: 300 steps recorded; nothing stands out ..."

`run_job` runs one script IN THIS PROCESS as `%inspect all --grads --params` + `%run script.py
--steps N` does: `scn.inspect_all(grads=True, params=True)` around `runpy.run_path(script,
run_name="__main__")`. It then reads, per model found, `insp.findings()` rows as text, the
summary's text and the terminal's exit line (`cli.at_exit.report`, the function
`python -m singlecard_nb --inspect` calls as the script ends, called on the same inspector), and
of an exception the script raised (the trap's NonFiniteError, DDP's own errors) the explanation
`python -m singlecard_nb` prints under the traceback (`diagnosis.explain.build`).

Nothing stays behind: the finder is stopped in `finally`, a process group the script left is
destroyed, `sys.argv`, `os.environ`, torch's thread count and its random state are put back.
A DDP script runs as a world of one: the scripts default RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT when they are not set (as a plain `python script.py` launch needs); here MASTER_PORT
is set to a free port first, so two test workers never meet on one port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import runpy
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Union

import torch

import singlecard_nb as scn
from singlecard_nb.cli import at_exit
from singlecard_nb.diagnosis.explain import build

CORPUS = Path(__file__).with_name("scripts") / "corpus"
HEALTHY = {p.stem: p for p in sorted(CORPUS.glob("healthy_*.py"))}
BUGS = {p.stem: p for p in sorted(CORPUS.glob("bug_*.py"))}
HEALTHY_STEPS = (5, 300)  # a short run and a long one: both must say nothing stands out
BUG_STEPS = 100  # where a job says nothing else
# (steps, trap) of the bug jobs that need other than (BUG_STEPS, False)
BUG_RUNS: dict[str, tuple[int, bool]] = {
    "bug_trap_after_lr_group": (100, True),
    "bug_loss_not_decreasing": (300, False),
    "bug_ddp_unused_parameters": (5, False),
    "bug_nan_in_data": (30, False),
}
NOTHING = "nothing stands out"


def bug_run(job: str) -> tuple[int, bool]:
    """(steps, trap) a bug job runs with."""
    return BUG_RUNS.get(job, (BUG_STEPS, False))


@dataclasses.dataclass
class ModelResult:
    """What one model found by inspect_all shows a user."""

    name: str
    steps: int  # steps recorded
    findings: list[str]  # insp.findings() rows, `row.text()`, likeliest cause first
    heads: list[str]  # each row's `path (kind...)`, what the row is about
    summary: str  # repr(insp.summary()): the findings above the per-module table
    exit_line: str  # what `python -m singlecard_nb --inspect` prints for it at exit
    notes: list[str]  # insp.notes: what could not be recorded as asked (also in the summary)


@dataclasses.dataclass
class Result:
    job: str
    steps: int
    trap: bool
    models: list[ModelResult]
    error: Optional[str] = None  # "NonFiniteError: 3 NaN and ..." (first line), or None
    explanation: Optional[str] = None  # repr(Explanation), as the terminal prints it
    banner: Optional[str] = None  # the explanation's one line (headline: hint)
    stdout: str = ""  # what the script printed (its losses)

    @property
    def pointer(self) -> Optional[str]:
        """The first thing a person reads: the trap's (or the error's) explanation, else the
        first finding of the first model that has one; None when nothing stands out."""
        if self.error is not None:
            return self.banner or self.error
        for model in self.models:
            if model.findings:
                return model.findings[0]
        return None

    @property
    def pointer_head(self) -> Optional[str]:
        """What the pointer is about: a finding's `path (kind)`, an explanation's headline."""
        if self.error is not None:
            return (self.banner or self.error).split(" (details under")[0]
        for model in self.models:
            if model.heads:
                return model.heads[0]
        return None


Words = Union[str, tuple]  # a word, or alternatives of which one must be there


def as_expected(result: Result, about: Optional[Words], words: list[Words]) -> bool:
    """The pointer is about `about` (in its head; None: whatever it is about) and contains every
    word (case-insensitive)."""
    head, text = result.pointer_head, result.pointer
    if head is None or text is None:
        return False
    return (about is None or _has(head, about)) and all(_has(text, w) for w in words)


def left_behind() -> list[str]:
    """What a job would have left in this process: our owners, torch's global module hooks, a
    process group; [] when nothing."""
    import torch.distributed as dist
    from torch.nn.modules import module as module_globals

    from singlecard_nb import borrow

    left = [f"owner {o}" for o in borrow.active_owners()]
    if module_globals._global_forward_pre_hooks or module_globals._global_forward_hooks:
        left.append("a global module hook")
    if dist.is_available() and dist.is_initialized():
        left.append("a process group")
    return left


def _has(text: str, word: Words) -> bool:
    options = word if isinstance(word, tuple) else (word,)
    return any(o.lower() in text.lower() for o in options)


def run_job(script: Union[str, Path], steps: int, trap: bool = False, seed: int = 0) -> Result:
    """Run `script --steps N` under inspect_all(grads=True, params=True[, trap=True]) in this
    process; what a user then reads, per model found."""
    script = str(script)
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    saved_threads, saved_rng = torch.get_num_threads(), torch.random.get_rng_state()
    torch.set_num_threads(1)  # tiny models: one thread is faster, and the corpus shares 2 cores
    torch.manual_seed(seed)
    os.environ["MASTER_PORT"] = str(_free_port())
    out = io.StringIO()
    error: Optional[BaseException] = None
    finder = scn.inspect_all(grads=True, params=True, trap=trap)
    try:
        sys.argv = [script, "--steps", str(steps)]
        try:
            with contextlib.redirect_stdout(out), _gloo_threads_get_the_gil():
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                error = e
        except Exception as e:
            error = e
    finally:
        finder.stop()
        _destroy_process_group()
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)
        torch.random.set_rng_state(saved_rng)
    result = Result(Path(script).stem, steps, trap,
                    [_model_result(name, insp) for name, insp in finder.inspectors.items()],
                    stdout=out.getvalue())
    if error is not None:
        result.error = _first_line(error)
        explanation = build(error) if isinstance(error, Exception) else None
        if explanation is not None:
            result.explanation = repr(explanation)
            result.banner = explanation.banner().text
    return result


def _model_result(name: str, insp: Any) -> ModelResult:
    rows = insp.findings()
    said = io.StringIO()
    with contextlib.redirect_stderr(said):  # the terminal's lines for this one model
        at_exit.report(_Found({name: insp}))
    return ModelResult(name, insp.steps_recorded, [r.text() for r in rows],
                       [_head(r.text()) for r in rows], repr(insp.summary()),
                       said.getvalue().strip(), list(insp.notes))


@dataclasses.dataclass
class _Found:
    """What `at_exit.report` reads of a finder: its inspectors."""

    inspectors: dict


def _head(text: str) -> str:
    match = re.match(r"^(.*?\))(: |$)", text)
    return match[1] if match else text


def _first_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _gloo_threads_get_the_gil():
    """`dist.destroy_process_group()` lets the GIL go for 5 ms first, while a corpus job runs,
    as single-card mode's own does (`groups.let_finished_works_go`, which says why): these jobs
    form real gloo worlds of one, without single-card mode. The full suite hung in this file
    twice (bug_no_zero_grad, bug_lr_too_high, torch 2.13), main() returning after the destroy;
    200 such jobs in one process without singlecard_nb hung 2 of 3 runs, none of 4 with this."""
    import torch.distributed as dist

    from singlecard_nb.parallel.groups import let_finished_works_go

    original = dist.destroy_process_group

    def destroy(*args, **kwargs):
        let_finished_works_go()
        return original(*args, **kwargs)

    dist.destroy_process_group = destroy
    try:
        yield
    finally:
        dist.destroy_process_group = original


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
