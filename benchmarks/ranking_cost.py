#!/usr/bin/env python
"""What the ranking costs against a training step, on the benchmark models.

    .venv/bin/python benchmarks/ranking_cost.py [--steps 12] [--models resnet,transformer,gpt]

Each model of benchmarks/models.py trains (forward, backward, SGD step) inspected with
grads=True and params=True (every series the ranking reads: outputs, inputs per channel,
parameters, their gradients and updates, the optimiser's groups). Then, as a live view does on
each draw, the ranking reads the newest step (`Tracks.feed`, incremental) and ranks every series
(`ranking.rank`). Printed per model: median step time, median ranking time (feed of one step +
rank), and their ratio. Target (issue 30): the ranking at most 2 % of a step; a view ranks at
most once per draw (4 per second, backing off), the terminal once at exit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

import singlecard_nb as scn  # noqa: E402
from singlecard_nb.inspection.views import ranking  # noqa: E402

torch.set_num_threads(1)  # a shared 2-core runner: two threads per process mostly wait


def _loss(out) -> torch.Tensor:
    return (out if isinstance(out, torch.Tensor) else out[0]).float().pow(2).mean()


def measure(name: str, steps: int) -> tuple[float, float, int]:
    model, x = getattr(models, name)()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    step_ms, rank_ms = [], []
    tracks = ranking.Tracks()
    with scn.inspect(model, grads=True, params=True) as insp:
        for _ in range(steps):
            started = time.perf_counter()
            optimizer.zero_grad()
            _loss(model(x)).backward()
            optimizer.step()
            insp.flush()  # the step's statistics reach the host, as the next step would do
            step_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            tracks.feed(insp._store.snapshot())  # what the live view does on a draw
            rows = ranking.rank(tracks)
            rank_ms.append((time.perf_counter() - started) * 1e3)
    series = len(tracks.by_path) + len(tracks.params) + len(tracks.grads) + len(tracks.updates)
    warm = slice(2, None)  # the first steps build the kernel's caches
    assert rows, "nothing ranked"
    return statistics.median(step_ms[warm]), statistics.median(rank_ms[warm]), series


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--models", default="resnet,transformer,gpt,vgg")
    args = parser.parse_args()
    print(f"{'model':<12} {'series':>7} {'step ms':>9} {'rank ms':>9} {'ratio':>7}")
    for name in args.models.split(","):
        step, cost, series = measure(name, args.steps)
        print(f"{name:<12} {series:>7} {step:>9.1f} {cost:>9.2f} {cost / step:>7.2%}")


if __name__ == "__main__":
    main()
