#!/usr/bin/env python
"""What each flag costs a user on real-shaped training scripts, run as the terminal form runs
them: `python -m singlecard_nb [--device cpu] [--inspect [--grads --params]] script.py --steps N`.

    .venv/bin/python benchmarks/real_scripts.py                 # ~25 min (3 rounds), 2-core CPU
    .venv/bin/python benchmarks/real_scripts.py --rounds 1 --scale 0.2   # a smoke run
    .venv/bin/python benchmarks/real_scripts.py --corpus DIR --scripts healthy_nanogpt

The scripts are the corpus's (tests/scripts/corpus/): a GPT in nanoGPT's shape, a tiny Llama
trained the way HF's Trainer does (many small modules), an accelerate-style loop of a 4-module
MLP, and the word_language_model LSTM. Each runs with N and with 3N steps, one intra-op thread
(OMP_NUM_THREADS=1), in a fresh process; the cost of one iteration is the difference over 2N,
so start-up (imports, the kernel's load, the findings printed at exit) cancels. Runs are
interleaved (every round runs each variant of each script once, in a rotated order) and the
median over rounds is kept. Two measures: wall time, what a user waits, and the children's CPU
time (user + system), which other processes on a shared machine disturb less.

Columns: plain (`python script.py`), single-card mode (`--device cpu`: pinned to the CPU, what
`%singlecard cpu` does), `--inspect`, `--inspect --grads --params` (both with `--device cpu`), the
last three as ratios to single-card mode. Targets: `--inspect` <= 1.15x, `--inspect --grads
--params` <= 1.30x.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "scripts" / "corpus"
# script -> (what it is, N): N steps take 1-2 s plain on the 2-core runner, several times the
# spread of start-up (a few 0.1 s), which the N and 3N runs cancel only on average
SCRIPTS = {
    "healthy_nanogpt": ("nanoGPT-shaped GPT (train.py's loop)", 450),
    "healthy_hf_llama": ("tiny Llama, HF Trainer-style (many small modules)", 450),
    "healthy_accelerate_loop": ("accelerate loop, 4-module MLP", 4500),
    "healthy_lstm_lm": ("word_language_model LSTM LM", 900),
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


def measure(corpus: Path, names: list[str], rounds: int, scale: float,
            verbose: bool) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(script, variant) -> {"wall": [s per iteration, per round], "cpu": [...]}."""
    jobs = [(name, variant) for name in names for variant in VARIANTS]
    per_iteration: dict[tuple[str, str], dict[str, list[float]]] = {
        job: {"wall": [], "cpu": []} for job in jobs}
    for r in range(rounds):
        order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]  # rotated: drift hits all alike
        for name, variant in order:
            n = steps(name, scale)
            script = corpus / f"{name}.py"
            short = run_once(command(script, VARIANTS[variant], n))
            long = run_once(command(script, VARIANTS[variant], 3 * n))
            kept = per_iteration[(name, variant)]
            kept["wall"].append((long[0] - short[0]) / (2 * n))
            kept["cpu"].append((long[1] - short[1]) / (2 * n))
            if verbose:
                print(f"  round {r + 1}: {name} {variant}: {kept['wall'][-1] * 1e3:.2f} ms wall, "
                      f"{kept['cpu'][-1] * 1e3:.2f} ms CPU per iteration ({load()})",
                      file=sys.stderr, flush=True)
    return per_iteration


def steps(name: str, scale: float) -> int:
    return max(2, round(SCRIPTS[name][1] * scale))


def table(per_iteration, names: list[str], measure_name: str, scale: float) -> list[str]:
    header = ["script", "N", "plain per iteration", *list(VARIANTS)[1:]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    verdicts = []
    for name in names:
        median = {v: statistics.median(per_iteration[(name, v)][measure_name]) for v in VARIANTS}
        base = median["single-card mode"]
        cells = [SCRIPTS[name][0], str(steps(name, scale)), f"{median['plain'] * 1e3:.2f} ms"]
        for variant in list(VARIANTS)[1:]:
            ratio = median[variant] / base if base > 0 else float("nan")
            cell = (f"{median[variant] * 1e3:.2f} ms" if variant == "single-card mode"
                    else f"{ratio:.2f}x")
            if variant in TARGETS:
                met = ratio <= TARGETS[variant]
                cell += "" if met else " **(over)**"
                verdicts.append(met)
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    met = sum(verdicts)
    lines.append(f"\ntargets (--inspect <= 1.15x, --inspect --grads --params <= 1.30x of "
                 f"single-card mode): {met} of {len(verdicts)} met ({measure_name} time)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="the folder of the scripts (default: tests/scripts/corpus)")
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="N times this")
    parser.add_argument("-v", "--verbose", action="store_true")
    options = parser.parse_args()
    print(f"torch threads 1 (OMP_NUM_THREADS=1), {options.rounds} interleaved rounds, "
          f"N x {options.scale}; at start: {load()}", flush=True)
    per_iteration = measure(options.corpus, options.scripts, options.rounds, options.scale,
                            options.verbose)
    for measure_name in ("wall", "cpu"):
        print(f"\nPer iteration, {measure_name} time (median of {options.rounds}; "
              f"(T(3N) - T(N)) / 2N), ratios to single-card mode:\n")
        print("\n".join(table(per_iteration, options.scripts, measure_name, options.scale)))
    print(f"\nat end: {load()}")


if __name__ == "__main__":
    main()
