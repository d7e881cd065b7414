#!/usr/bin/env python
"""Runs a command line as `python` would, with a clock on every optimizer step:

    python benchmarks/step_clock.py TIMES.json script.py --steps 100
    python benchmarks/step_clock.py TIMES.json -m singlecard_nb --inspect script.py --steps 100

torch's global step post-hook (every `torch.optim.Optimizer`, wrapped ones such as accelerate's
included) notes the wall and the process CPU time after each step; when the process ends, the
notes and the wall time of its end go to TIMES.json. The script itself is run unchanged. Timing
between steps leaves out what a run's start-up costs (imports, the kernel's load), which varies
by a few 0.1 s from run to run, and `end` less the last step is what the run does after its
training (the terminal form's findings), so `real_scripts.py` can tell the two apart.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    wall: list[float] = []
    cpu: list[float] = []

    def note(*_: object) -> None:
        wall.append(time.perf_counter())
        cpu.append(time.process_time())

    def write() -> None:  # registered first, so it runs after every exit handler of the run
        with open(out, "w") as f:
            json.dump({"wall": wall, "cpu": cpu, "end_wall": time.perf_counter()}, f)

    atexit.register(write)
    # every script measured imports torch anyway; where its import happens is not timed
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(note)
    if argv[0] == "-m":
        sys.argv = argv[1:]  # argv[0] becomes the module's file, as `python -m` has it
        sys.path[0] = os.getcwd()  # as `python -m` puts it
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python script.py` puts it
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
