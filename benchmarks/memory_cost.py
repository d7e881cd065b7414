"""What `memory=True` costs: a training step (forward + backward) with `inspect(model)` and with
`inspect(model, memory=True)`, timed round-robin on the benchmark models (target: <= 1.05x).

    .venv/bin/python benchmarks/memory_cost.py            # about 2 min on an idle 2-core CPU
    .venv/bin/python benchmarks/memory_cost.py --quick    # fewer repetitions; indicative only
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models as bench_models  # noqa: E402

import singlecard_nb as scn  # noqa: E402
from singlecard_nb.inspection.kernel import native  # noqa: E402

MODELS = ("resnet", "transformer", "gpt", "vgg", "mlp5000")


def _step(model, x) -> None:
    out = model(x)
    out = out if isinstance(out, torch.Tensor) else out[0]
    out.float().sum().backward()


def measure(name: str, reps: int) -> tuple[float, float]:
    """Median thread CPU seconds of a step with inspect(model) and with inspect(model, memory=True)."""
    torch.manual_seed(0)
    model, x = getattr(bench_models, name)()
    variants = {}
    for key, memory in (("plain", False), ("memory", True)):
        copy_ = copy.deepcopy(model)
        variants[key] = (copy_, scn.inspect(copy_, memory=memory))
    times: dict[str, list[float]] = {key: [] for key in variants}
    try:
        for m, insp in variants.values():  # warm up: allocator, kernels
            for _ in range(2):
                _step(m, x)
                insp.flush()
        for rep in range(reps):
            order = list(variants)[rep % 2:] + list(variants)[:rep % 2]
            for key in order:
                m, insp = variants[key]
                gc.collect()
                start = time.thread_time()  # CPU time of this thread: other processes' load
                _step(m, x)                  # does not count (backward runs here on the CPU)
                insp.flush()
                times[key].append(time.thread_time() - start)
                m.zero_grad(set_to_none=True)
    finally:
        for _, insp in variants.values():
            insp.stop()
    return statistics.median(times["plain"]), statistics.median(times["memory"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    native.start()
    native.wait(120)  # the one-pass kernel, as bench.py does: the steady state
    reps = 5 if args.quick else 15
    print("| model | inspect step (ms) | memory=True step (ms) | ratio |")
    print("|---|---|---|---|")
    for name in args.models.split(","):
        plain, memory = measure(name, reps)
        print(f"| {name} | {plain * 1e3:.1f} | {memory * 1e3:.1f} | {memory / plain:.3f}x |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
