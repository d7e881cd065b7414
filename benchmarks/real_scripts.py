#!/usr/bin/env python
"""What each flag costs a user on real-shaped training scripts, run as the terminal form runs
them: `python -m singlecard_nb [--device cpu] [--inspect [--grads --params]] script.py --steps N`.

    .venv/bin/python benchmarks/real_scripts.py                 # 5 rounds, 2-core CPU (long)
    .venv/bin/python benchmarks/real_scripts.py --rounds 1 --scale 0.1   # a smoke run
    .venv/bin/python benchmarks/real_scripts.py --corpus DIR --scripts healthy_nanogpt

The scripts: the corpus's (tests/scripts/corpus/) GPT in nanoGPT's shape, tiny Llama trained the
way HF's Trainer does (many small modules), accelerate-style loop of a 4-module MLP with a
stand-in Accelerator, and word_language_model LSTM; and benchmarks/scripts/'s same MLP loop with
the real `accelerate.Accelerator` (left out, with the reason printed, where accelerate is not
importable). Each runs with N and with 3N steps, one intra-op thread (OMP_NUM_THREADS=1), in a
fresh process; the cost of one iteration is the difference over 2N, so start-up (imports, the
kernel's load, the findings printed at exit) cancels. Runs are interleaved (every round runs each
variant of each script once, in a rotated order). Two measures: wall time, what a user waits,
and the children's CPU time (user + system), which other processes on a shared machine disturb
less.

The estimate is (min T(3N) − min T(N)) / 2N over the rounds, not the median of each round's
difference: another process on a shared machine only ever adds time to a run, so the fastest of
several runs of one command is the best estimate of its undisturbed time, while one round's
difference carries the disturbance of both its runs (the single-card step of one script moved
0.9-1.9 ms from round to round that way, docs/speed.md). More rounds at half the N of the first
version (5 rounds, N steps about 0.5-1 s plain) give each minimum more runs to come from for
about the same total time.

Columns: plain (`python script.py`), single-card mode (`--device cpu`: pinned to the CPU, what
`%singlecard cpu` does), `--inspect`, `--inspect --grads --params` (both with `--device cpu`), the
last three as ratios to single-card mode. Targets: `--inspect` <= 1.15x, `--inspect --grads
--params` <= 1.30x.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "scripts" / "corpus"
OWN = Path(__file__).resolve().parent / "scripts"  # not in the corpus: the tests run all of it
# script -> (what it is, N, its folder, the module it needs): N steps take 0.5-1 s plain on the
# 2-core runner, a few times the spread of start-up (a few 0.1 s), which the minimums of the N
# and 3N runs cancel
SCRIPTS = {
    "healthy_nanogpt": ("nanoGPT-shaped GPT (train.py's loop)", 225, CORPUS, None),
    "healthy_hf_llama": ("tiny Llama, HF Trainer-style (many small modules)", 225, CORPUS, None),
    "healthy_accelerate_loop": ("accelerate loop, 4-module MLP, stand-in Accelerator", 2250,
                                CORPUS, None),
    "accelerate_mlp_loop": ("accelerate loop, 4-module MLP, real accelerate.Accelerator", 450,
                            OWN, "accelerate"),
    "healthy_lstm_lm": ("word_language_model LSTM LM", 450, CORPUS, None),
}
VARIANTS = {
    "plain": None,
    "single-card mode": ["--device", "cpu"],
    "--inspect": ["--device", "cpu", "--inspect"],
    "--inspect --grads --params": ["--device", "cpu", "--inspect", "--grads", "--params"],
}
TARGETS = {"--inspect": 1.15, "--inspect --grads --params": 1.30}


def command(script: Path, flags: list[str] | None, steps: int) -> list[str]:
    if flags is None:
        return [sys.executable, str(script), "--steps", str(steps)]
    return [sys.executable, "-m", "singlecard_nb", *flags, str(script), "--steps", str(steps)]


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; raises if it fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


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


def measure(corpus: Path, names: list[str], rounds: int, scale: float,
            verbose: bool) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(script, variant) -> {"wall N": [s, per round], "wall 3N": [...], "cpu N", "cpu 3N"}."""
    jobs = [(name, variant) for name in names for variant in VARIANTS]
    runs: dict[tuple[str, str], dict[str, list[float]]] = {
        job: {f"{m} {k}": [] for m in ("wall", "cpu") for k in ("N", "3N")} for job in jobs}
    for r in range(rounds):
        order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]  # rotated: drift hits all alike
        for name, variant in order:
            n = steps(name, scale)
            folder = corpus if SCRIPTS[name][2] == CORPUS else SCRIPTS[name][2]
            script = folder / f"{name}.py"
            kept = runs[(name, variant)]
            for k, count in (("N", n), ("3N", 3 * n)):
                wall, cpu = run_once(command(script, VARIANTS[variant], count))
                kept[f"wall {k}"].append(wall)
                kept[f"cpu {k}"].append(cpu)
            if verbose:
                this = {m: (kept[f"{m} 3N"][-1] - kept[f"{m} N"][-1]) / (2 * n) * 1e3
                        for m in ("wall", "cpu")}
                print(f"  round {r + 1}: {name} {variant}: {this['wall']:.2f} ms wall, "
                      f"{this['cpu']:.2f} ms CPU per iteration this round ({load()})",
                      file=sys.stderr, flush=True)
    return runs


def per_iteration(kept: dict[str, list[float]], measure_name: str, n: int) -> float:
    """Seconds per iteration: the fastest 3N run less the fastest N run, over 2N."""
    return (min(kept[f"{measure_name} 3N"]) - min(kept[f"{measure_name} N"])) / (2 * n)


def steps(name: str, scale: float) -> int:
    return max(2, round(SCRIPTS[name][1] * scale))


def table(runs, names: list[str], measure_name: str, scale: float) -> list[str]:
    header = ["script", "N", "plain per iteration", *list(VARIANTS)[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    verdicts, unjudged = [], 0
    for name in names:
        n = steps(name, scale)
        each = {v: per_iteration(runs[(name, v)], measure_name, n) for v in VARIANTS}
        base = each["single-card mode"]
        cells = [SCRIPTS[name][0], str(n), f"{each['plain'] * 1e3:.2f} ms"]
        for variant in list(VARIANTS)[1:]:
            if variant == "single-card mode":
                cells.append(f"{base * 1e3:.2f} ms")
                continue
            if base <= 0 or each[variant] <= 0:  # start-up spread over 2N iterations' time
                cells.append("n/a (N too small)")
                unjudged += variant in TARGETS
                continue
            ratio = each[variant] / base
            cell = f"{ratio:.2f}x"
            if variant in TARGETS:
                met = ratio <= TARGETS[variant]
                cell += "" if met else " **(over)**"
                verdicts.append(met)
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    met = sum(verdicts)
    lines.append(f"\ntargets (--inspect <= 1.15x, --inspect --grads --params <= 1.30x of "
                 f"single-card mode): {met} of {len(verdicts)} met ({measure_name} time)"
                 + (f", {unjudged} not judged (N too small)" if unjudged else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="the folder of the corpus's scripts (default: tests/scripts/corpus); "
                        "benchmarks/scripts/'s are read from there")
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="N times this")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args()
    print(f"torch threads 1 (OMP_NUM_THREADS=1), {options.rounds} interleaved rounds, "
          f"N x {options.scale}; at start: {load()}", flush=True)
    names = runnable(options.scripts)
    runs = measure(options.corpus, names, options.rounds, options.scale, options.verbose)
    for measure_name in ("wall", "cpu"):
        print(f"\nPer iteration, {measure_name} time ((min T(3N) - min T(N)) / 2N over "
              f"{options.rounds} rounds), ratios to single-card mode:\n")
        print("\n".join(table(runs, names, measure_name, options.scale)))
    print(f"\nat end: {load()}")


if __name__ == "__main__":
    main()
