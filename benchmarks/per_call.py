#!/usr/bin/env python
"""Where the microseconds of one small module call go, measured on `mlp5000` (2 500 × Linear(16,
16) + ReLU: 5 000 module calls per forward of 16×16 values).

    .venv/bin/python benchmarks/per_call.py

Each variant's forward is timed in thread CPU time (other processes on a shared machine do not
count) and the best of several rounds is kept, interleaved with bare forwards, so the figures
are close to what the code itself costs; `bench.py` reports medians of wall time instead, which
include the machine's noise. Rows, in µs added per module call over a bare forward:
- a global forward hook that does nothing: torch's hook dispatch;
- the floor: a hook taking one `x.sum()` per output;
- `inspect(model)`, full statistics, with the one-pass kernel built and without it (torch
  reductions, what the first steps pay while it builds);
- `inspect(model, every=10)` on an unrecorded step;
- the same two found by `inspect_all()` instead of handed to `inspect()` (the finder is out of
  torch's table while a model it knows runs, so these should equal the rows above).
A last line: code that calls no module (tensor arithmetic) under `inspect_all()`, as a ratio.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native

CALLS = 5000
ROUNDS = 5


def mlp5000() -> tuple[nn.Module, torch.Tensor]:
    layers: list[nn.Module] = []
    for _ in range(CALLS // 2):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers), torch.randn(16, 16)


def best_cpu_time(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)  # one thread: the per-call path, not the thread pool, is measured
    native.wait(120)
    model, x = mlp5000()
    kept: list[torch.Tensor] = []

    def nothing(module, args, output):
        pass

    def floor(module, args, output):
        kept.append(output.sum())

    def hooked(hook):
        def run():
            handle = register_module_forward_hook(hook)
            try:
                best = best_cpu_time(lambda: (model(x), kept.clear()))
            finally:
                handle.remove()
            return best
        return run

    def inspected(kernels: bool, every: int = 1):
        def run():
            saved = dict(native._kernels)
            if not kernels:
                native._kernels.clear()  # torch reductions, as before the kernel is built
            try:
                with scn.inspect(model, every=every, max_rows=10**7):
                    model(x)  # the first step: probes go, the kernel's buffers exist
                    return best_cpu_time(lambda: model(x))
            finally:
                native._kernels.update(saved)
        return run

    def found(every: int = 1):
        def run():
            with scn.inspect_all(every=every, max_rows=10**7) as finder:
                model(x)  # found at its first call
                assert list(finder.inspectors) == ["Sequential"]
                return best_cpu_time(lambda: model(x))
        return run

    variants = {
        "global forward hook doing nothing (torch's dispatch)": hooked(nothing),
        "floor: x.sum() per output": hooked(floor),
        "inspect(model), one-pass kernel": inspected(True),
        "inspect(model), torch reductions": inspected(False),
        "inspect(model, every=10)": inspected(True, every=10),
        "inspect_all(), the model found": found(),
        "inspect_all(every=10), the model found": found(every=10),
    }
    best = {name: float("inf") for name in ["bare", *variants]}
    with torch.no_grad():
        model(x)
        for _ in range(ROUNDS):  # interleaved: a slow moment hits every variant alike
            best["bare"] = min(best["bare"], best_cpu_time(lambda: model(x)))
            for name, run in variants.items():
                best[name] = min(best[name], run())
    print(f"mlp5000 bare forward: {best['bare'] * 1e3:.1f} ms CPU time for {CALLS} module calls;"
          f" statistics: {native.status()}")
    print(f"{'variant':<56} µs added per module call")
    for name in variants:
        print(f"{name:<56} {(best[name] - best['bare']) / CALLS * 1e6:6.2f}")
    no_module()


def no_module() -> None:
    """Tensor code that calls no module, bare and under inspect_all(): the ratio of times."""
    a = torch.randn(64, 64)

    def arithmetic():
        y = a
        for _ in range(2000):
            y = y * 0.5 + a
        return y

    bare = looking = float("inf")
    for _ in range(ROUNDS):
        bare = min(bare, best_cpu_time(arithmetic))
        with scn.inspect_all():
            looking = min(looking, best_cpu_time(arithmetic))
    print(f"{'code calling no module, inspect_all() / bare':<56} {looking / bare:6.2f}x")


if __name__ == "__main__":
    main()
