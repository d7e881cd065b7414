#!/usr/bin/env python
"""What the live view costs a training loop: step time with and without `insp.live()`.

    .venv/bin/python benchmarks/live_cost.py [--steps 60] [--rounds 3]

A GPT of benchmarks/models.py at toy width (d 64, context 64, batch 8), deep enough for 156 and
996 modules, trains (forward, backward, SGD step) while inspected, with and without a live view,
interleaved round by round. The view draws into a display handle that serialises each bundle to
JSON, as the kernel does before sending it; the browser's share of the work is not the kernel's.
Printed: median step time of both, their ratio, how many draws, and the median time per draw.
Target (issue 21): the ratio at most 1.05 at 1 000 modules on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from IPython.core.interactiveshell import InteractiveShell

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import GPT  # noqa: E402

import singlecard_nb as scn  # noqa: E402
from singlecard_nb.inspection.views import live  # noqa: E402

# One thread: on a shared 2-core runner, two threads per process mostly wait on each other.
torch.set_num_threads(1)


class Handle:
    """A display handle that does what the kernel does with an update: serialise it."""

    display_id = "bench"

    def __init__(self) -> None:
        self.bytes = 0

    def update(self, bundle, raw=False) -> None:
        self.bytes = len(json.dumps(bundle))


def train(model, steps: int, with_view: bool) -> tuple[list[float], list[float], int]:
    """Step times (ms) of `steps` inspected steps; draw times (ms) and the last bundle's size."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 512, (8, 64))
    handle = Handle()
    draws: list[float] = []
    times = []
    with scn.inspect(model) as insp:
        if with_view:
            view = live.LiveView(insp, shell=InteractiveShell.instance())
            render = view._render

            def timed() -> None:
                start = time.perf_counter()
                render()
                draws.append((time.perf_counter() - start) * 1e3)

            view._render = timed
            view._handle = handle
            insp.add_listener(view._on_step)
        for _ in range(steps):
            start = time.perf_counter()
            loss = model(idx).float().logsumexp(-1).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            times.append((time.perf_counter() - start) * 1e3)
        if with_view:
            insp.remove_listener(view._on_step)
    return times[3:], draws, handle.bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| modules | step, no view (ms) | step, live view (ms) | ratio | drawing ÷ step time "
          "| draws / step | ms per draw | bundle (kB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in (15, 99):
        torch.manual_seed(0)
        model = GPT(vocab=512, context=64, d=64, heads=4, layers=layers)
        modules = sum(1 for _ in model.named_modules())
        train(model, 6, True)  # warm: the C kernel, dynamo's import, the allocator
        bare, viewed, draws, size = [], [], [], 0
        for _ in range(args.rounds):  # interleaved
            bare += train(model, args.steps, False)[0]
            ms, drawn, size = train(model, args.steps, True)
            viewed += ms
            draws += drawn
        b, v = statistics.median(bare), statistics.median(viewed)
        # The share is the robust figure on a busy machine: draws happen inside the steps.
        print(f"| {modules} | {b:.1f} | {v:.1f} | {v / b:.3f} | {sum(draws) / sum(viewed):.1%} | "
              f"{len(draws) / len(viewed):.2f} | {statistics.median(draws):.1f} | "
              f"{size / 1e3:.0f} |")


if __name__ == "__main__":
    main()
