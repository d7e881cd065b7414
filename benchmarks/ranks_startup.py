"""Start-up time of N ranks: `RankJob(plan(N, "cpu", ...)).run()` of a script that only forms
its gloo world and leaves, from the call to its return (every rank started, joined, exited and
stopped), then a look for any process of the run left behind.

    python benchmarks/ranks_startup.py 2 4 --repeat 3

Run it from a folder outside the repository with each venv's python, so that each one imports
its own singlecard_nb (docs/ranks.md gives the numbers before and after torch elastic's engine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

SCRIPT = ("import torch.distributed as dist\n"
          "dist.init_process_group('gloo')\n"
          "dist.destroy_process_group()\n")


def _left(folder: str) -> list[int]:
    """Processes whose command line names the run's folder (every rank has it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def once(ranks: int) -> tuple[float, list[int]]:
    from singlecard_nb.ranks import launch
    from singlecard_nb.ranks.run import RankJob

    with tempfile.TemporaryDirectory(prefix="ranks-startup-") as folder:
        script = os.path.join(folder, "trivial.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        run = os.path.join(folder, "run")
        os.mkdir(run)
        plan = launch.plan(ranks, "cpu", run, [script])
        start = time.perf_counter()
        RankJob(plan, run, echo=lambda *line: None, say=lambda text: None).run()
        took = time.perf_counter() - start
        return took, _left(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranks", type=int, nargs="+")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch  # noqa: F401 (a notebook has it: its import is not the ranks' start)

    import singlecard_nb

    print(f"singlecard_nb from {os.path.dirname(singlecard_nb.__file__)}, python {sys.executable}")
    for n in args.ranks:
        times, left = [], []
        for _ in range(args.repeat):
            took, pids = once(n)
            times.append(took)
            left += pids
        print(f"{n} ranks: median {statistics.median(times):.2f} s of "
              f"{', '.join(f'{t:.2f}' for t in times)}; left running: {left or 'none'}",
              flush=True)


if __name__ == "__main__":
    main()
