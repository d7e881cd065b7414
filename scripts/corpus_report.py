"""Issue 37's two numbers, measured on the findings corpora (tests/scripts/corpus/):

    .venv/bin/python scripts/corpus_report.py            # every job
    .venv/bin/python scripts/corpus_report.py lstm gan   # jobs whose name has one of these

Runs every healthy job at 5 and 300 steps and every bug job at its steps (with the trap where
tests/findings_corpus.py says), each as `%inspect all --grads --params` + `%run` runs it, and
prints per run the first pointer a person reads (a trap's explanation, else the first finding;
"nothing stands out" when none) and whether it is as expected: nothing on a healthy run, on a
bug what tests/test_findings_bugs.py's EXPECTED says. Then: false alarms on health (k of N runs)
and the first-pointer rate on bugs (k of N jobs).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0:0] = [str(ROOT / "tests"), str(ROOT)]  # this checkout's package, not an installed one

from findings_corpus import (  # noqa: E402 - after the tests folder is on the path
    BUGS,
    HEALTHY,
    HEALTHY_STEPS,
    as_expected,
    bug_run,
    run_job,
)
from test_findings_bugs import EXPECTED  # noqa: E402

WIDTH = 160


def _cut(text: str | None) -> str:
    text = "nothing stands out" if text is None else " ".join(text.split())
    return text if len(text) <= WIDTH else text[:WIDTH - 1] + "…"


def main(patterns: list[str]) -> int:
    warnings.simplefilter("ignore")  # the scripts' and torch's warnings: not what is measured
    wanted = (lambda job: any(p in job for p in patterns)) if patterns else (lambda job: True)
    print(f"{'job':34} {'steps':>5}  {'ok':3} first pointer")
    false_alarms, healthy_runs, named, bugs = 0, 0, 0, 0
    started = time.perf_counter()
    for job in (j for j in HEALTHY if wanted(j)):
        for steps in HEALTHY_STEPS:
            result = run_job(HEALTHY[job], steps)
            quiet = result.pointer is None
            healthy_runs += 1
            false_alarms += not quiet
            print(f"{job:34} {steps:>5}  {'yes' if quiet else 'NO':3} {_cut(result.pointer)}")
    for job in (j for j in BUGS if wanted(j)):
        steps, trap = bug_run(job)
        result = run_job(BUGS[job], steps, trap=trap)
        about, words = EXPECTED[job]
        good = as_expected(result, about, words)
        bugs += 1
        named += good
        mark = "yes" if good else ("NO" if result.pointer is not None else "NO!")
        print(f"{job + (' (trap)' if trap else ''):34} {steps:>5}  {mark:3} {_cut(result.pointer)}")
    print()
    print(f"false alarms on health: {false_alarms} of {healthy_runs} runs")
    print(f"first pointer names the cause on bugs: {named} of {bugs} jobs "
          "(NO!: nothing stands out on a bug)")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
