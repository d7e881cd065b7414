#!/usr/bin/env python
"""What each flag costs a user on real-shaped training scripts, run as the terminal form runs
them: `python -m singlecard_nb [--device cpu] [--inspect [--grads --params]] script.py --steps N`.

    .venv/bin/python benchmarks/real_scripts.py                 # 5 rounds, 2-core CPU, ~8 min
    .venv/bin/python benchmarks/real_scripts.py --rounds 1 --scale 0.1   # a smoke run
    .venv/bin/python benchmarks/real_scripts.py --corpus DIR --scripts healthy_nanogpt
    .venv/bin/python benchmarks/real_scripts.py --against ../before   # before and after, ~16 min

`--against CHECKOUT` runs every command a second time with another checkout's singlecard_nb
(a commit before a change: `git worktree add --detach ../before HEAD~1`), in the same rounds,
and prints its tables too: a before and after measured side by side, under the same load. Its
plain column runs the same command as this tree's, which shows how far two runs of one command
differ.

The scripts: the corpus's (tests/scripts/corpus/) GPT in nanoGPT's shape, tiny Llama trained the
way HF's Trainer does (many small modules), accelerate-style loop of a 4-module MLP with a
stand-in Accelerator, and word_language_model LSTM; and benchmarks/scripts/'s same MLP loop with
the real `accelerate.Accelerator` and a tiny Llama trained by the real `transformers.Trainer`
(each left out, with the reason printed, where its library is not importable). Each runs
unchanged, in a fresh process, one intra-op thread (OMP_NUM_THREADS=1), under `step_clock.py`, which notes the process's CPU time after every optimizer step (one
thread does the work: it is the wall time less what other processes take). The intervals
between steps, the first tenth (at least 5) left out as warm-up, give two measures: their
mean, everything an iteration costs, the work that comes every few steps (a full garbage
collection) included, and their median, the typical iteration, which a disturbed second of
the run moves least. Start-up (imports, the kernel's load) is outside both, and so is what
runs after the last step (the terminal form's findings), which the last column shows on its
own, in wall time.

Runs are interleaved (every round runs each variant of each script once, in a rotated order)
and each figure is the minimum over the rounds: another process on a shared machine only ever
adds time to a run, so the fastest run is the best estimate of the undisturbed one. On the
shared 2-core runner that still leaves a few per cent: the same command's figure differed by
5-9 % between two checkouts' columns of one sitting (docs/speed.md).

An earlier version took (min T(3N) - min T(N)) / 2N from whole runs; its start-ups, 2-3 s that
vary by a few 0.1 s, left ±0.5-1 ms on steps of 0.6-5 ms (docs/speed.md).

Columns: plain (`python script.py`), single-card mode (`--device cpu`: pinned to the CPU, what
`%singlecard cpu` does), `--inspect`, `--inspect --grads --params` (both with `--device cpu`), the
last two as ratios to single-card mode, and the time from the last step to the process's end.
Targets: `--inspect` <= 1.15x, `--inspect --grads --params` <= 1.30x.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "scripts" / "corpus"
OWN = Path(__file__).resolve().parent / "scripts"  # not in the corpus: the tests run all of it
CLOCK = Path(__file__).resolve().parent / "step_clock.py"
# script -> (what it is, steps a run, its folder, the module it needs): a run's steps take
# 1-1.5 s plain on the 2-core runner
SCRIPTS = {
    "healthy_nanogpt": ("nanoGPT-shaped GPT (train.py's loop)", 450, CORPUS, None),
    "healthy_hf_llama": ("tiny Llama, HF Trainer-style (many small modules)", 300, CORPUS, None),
    "hf_trainer_llama": ("tiny Llama, real transformers.Trainer", 100, OWN, "transformers"),
    "healthy_accelerate_loop": ("accelerate loop, 4-module MLP, stand-in Accelerator", 2000,
                                CORPUS, None),
    "accelerate_mlp_loop": ("accelerate loop, 4-module MLP, real accelerate.Accelerator", 1500,
                            OWN, "accelerate"),
    "healthy_lstm_lm": ("word_language_model LSTM LM", 900, CORPUS, None),
}
VARIANTS = {
    "plain": None,
    "single-card mode": ["--device", "cpu"],
    "--inspect": ["--device", "cpu", "--inspect"],
    "--inspect --grads --params": ["--device", "cpu", "--inspect", "--grads", "--params"],
}
TARGETS = {"--inspect": 1.15, "--inspect --grads --params": 1.30}


def command(script: Path, flags: list[str] | None, steps: int, times: str) -> list[str]:
    clocked = [sys.executable, str(CLOCK), times]
    if flags is None:
        return [*clocked, str(script), "--steps", str(steps)]
    return [*clocked, "-m", "singlecard_nb", *flags, str(script), "--steps", str(steps)]


def run_once(cmd: list[str], times: str, tree: Path) -> dict[str, float]:
    """{"mean", "median"}: CPU seconds an iteration; "exit": wall seconds from the last step to
    the end; with `tree`'s singlecard_nb. Raises if the run fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    with open(times) as f:
        noted = json.load(f)
    at = noted["cpu"]
    first = max(5, len(at) // 10)  # warm-up: the first steps allocate and compile kernels
    if len(at) < first + 2:
        raise RuntimeError(f"{' '.join(cmd)}: {len(at)} optimizer steps, too few to time")
    intervals = [b - a for a, b in zip(at[first:], at[first + 1:])]
    return {"mean": statistics.fmean(intervals), "median": statistics.median(intervals),
            "exit": noted["end_wall"] - noted["wall"][-1]}


def load() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.2f}"
    except OSError:
        return "load average unknown"


def runnable(names: list[str]) -> list[str]:
    """The scripts whose module is importable here; the others said and left out."""
    kept = []
    for name in names:
        needs = SCRIPTS[name][3]
        if needs and importlib.util.find_spec(needs) is None:
            print(f"{name}: left out, `{needs}` is not importable (pip install {needs})")
        else:
            kept.append(name)
    return kept


def measure(corpus: Path, names: list[str], trees: list[Path], rounds: int, scale: float,
            verbose: bool) -> dict[tuple[str, str, Path], dict[str, list[float]]]:
    """(script, variant, tree) -> {"mean": [s an iteration, per round], "median", "exit"}."""
    jobs = [(name, variant, tree) for name in names for variant in VARIANTS for tree in trees]
    runs: dict[tuple[str, str, Path], dict[str, list[float]]] = {
        job: {k: [] for k in ("mean", "median", "exit")} for job in jobs}
    with tempfile.TemporaryDirectory() as scratch:
        times = os.path.join(scratch, "times.json")
        for r in range(rounds):
            order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]  # rotated: drift hits all alike
            for name, variant, tree in order:
                folder = corpus if SCRIPTS[name][2] == CORPUS else SCRIPTS[name][2]
                cmd = command(folder / f"{name}.py", VARIANTS[variant], steps(name, scale),
                              times)
                for k, seconds in run_once(cmd, times, tree).items():
                    runs[(name, variant, tree)][k].append(seconds)
                if verbose:
                    kept = runs[(name, variant, tree)]
                    print(f"  round {r + 1}: {tree.name} {name} {variant}: {kept['mean'][-1] * 1e3:.2f} ms "
                          f"mean, {kept['median'][-1] * 1e3:.2f} ms median per iteration, "
                          f"{kept['exit'][-1]:.2f} s after the last step ({load()})",
                          file=sys.stderr, flush=True)
    return runs


def steps(name: str, scale: float) -> int:
    return max(12, round(SCRIPTS[name][1] * scale))


def table(runs, names: list[str], tree: Path, measure_name: str, scale: float) -> list[str]:
    header = ["script", "steps", "plain per iteration", *list(VARIANTS)[1:],
              "after the last step, wall (plain / single-card / --inspect / all three)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    verdicts = []
    for name in names:
        each = {v: min(runs[(name, v, tree)][measure_name]) for v in VARIANTS}
        base = each["single-card mode"]
        cells = [SCRIPTS[name][0], str(steps(name, scale)), f"{each['plain'] * 1e3:.2f} ms",
                 f"{base * 1e3:.2f} ms"]
        for variant in TARGETS:
            ratio = each[variant] / base
            met = ratio <= TARGETS[variant]
            verdicts.append(met)
            cells.append(f"{ratio:.2f}x" + ("" if met else " **(over)**"))
        cells.append(" / ".join(f"{min(runs[(name, v, tree)]['exit']) * 1e3:.0f}"
                                for v in VARIANTS) + " ms")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\ntargets (--inspect <= 1.15x, --inspect --grads --params <= 1.30x of "
                 f"single-card mode): {sum(verdicts)} of {len(verdicts)} met "
                 f"({measure_name} of the intervals)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="the folder of the corpus's scripts (default: tests/scripts/corpus); "
                        "benchmarks/scripts/'s are read from there")
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="each script's steps times this")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="another checkout of this repository (a commit before a change): "
                        "its singlecard_nb runs the same commands, interleaved with this one's, "
                        "and gets its own tables")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args()
    print(f"torch threads 1 (OMP_NUM_THREADS=1), {options.rounds} interleaved rounds, "
          f"steps x {options.scale}; at start: {load()}", flush=True)
    names = runnable(options.scripts)
    trees = [ROOT] + ([options.against.resolve()] if options.against else [])
    runs = measure(options.corpus, names, trees, options.rounds, options.scale, options.verbose)
    for measure_name in ("mean", "median"):
        for tree in trees:
            print(f"\nPer iteration, CPU time: the {measure_name} interval between optimizer "
                  f"steps, warm-up left out, the fastest of {options.rounds} rounds; ratios "
                  f"to single-card mode; singlecard_nb of {tree}:\n")
            print("\n".join(table(runs, names, tree, measure_name, options.scale)))
    print(f"\nat end: {load()}")


if __name__ == "__main__":
    main()
