#!/usr/bin/env python
"""What `singlecard_nb.explain` costs: nothing while the model runs, a few ms once it has failed.

    .venv/bin/python benchmarks/explain_cost.py

1. A forward pass with the extension loaded in a real IPython shell (the explanation's only
   attachment is a post_run_cell callback) against the same pass with no extension: the module
   hooks installed are counted, and both are timed, interleaved.
2. The time to build an explanation after a failure, on models of growing size (the path search
   walks `named_modules()` of each module on the stack).
"""

from __future__ import annotations

import statistics
import time

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn
from torch.nn.modules import module as module_globals

import singlecard_nb as scn

torch.set_num_threads(2)


def hooks(model: nn.Module) -> int:
    return (len(module_globals._global_forward_hooks) + len(module_globals._global_forward_pre_hooks)
            + sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def forward_cost() -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(200)])
    x = torch.randn(32, 64)
    shell = InteractiveShell.instance()
    bare, loaded = [], []
    for _ in range(15):  # interleaved: load, time, unload, time
        shell.run_line_magic("load_ext", "singlecard_nb")
        installed = hooks(model)
        with torch.no_grad():
            loaded.append(median_ms(lambda: model(x), 5))
        shell.run_line_magic("unload_ext", "singlecard_nb")
        with torch.no_grad():
            bare.append(median_ms(lambda: model(x), 5))
    print(f"forward, 400 modules: module hooks with the extension loaded: {installed}; "
          f"median {statistics.median(bare):.2f} ms bare, {statistics.median(loaded):.2f} ms loaded")


def build_cost() -> None:
    class Deep(nn.Module):
        def __init__(self, blocks: int):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU())
                                        for _ in range(blocks))
            self.head = nn.Linear(32, 2)  # the mistake: 16 features arrive

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    for blocks in (10, 1_000, 5_000):
        model = Deep(blocks)
        try:
            model(torch.randn(4, 16))
        except RuntimeError as e:
            error = e
        ms = median_ms(lambda error=error: scn.explain(error), 7)
        modules = sum(1 for _ in model.modules())
        print(f"explain() after a failure, {modules} modules: {ms:.2f} ms")


if __name__ == "__main__":
    forward_cost()
    build_cost()
