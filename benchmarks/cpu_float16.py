#!/usr/bin/env python
"""How much slower a training step runs in float16 on the CPU than in float32 (and bfloat16):
the factor `%singlecard cpu` quotes when a script picks float16 (parallel/cpu_amp.py).

    .venv/bin/python benchmarks/cpu_float16.py

A 4-layer 256-wide MLP (Linear + GELU), batch 64, under torch.autocast("cpu", dtype), one
thread, SGD; thread CPU time, best of 3 interleaved rounds of 10 steps.
"""

import time

import torch
from torch import nn


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.GELU())])
    x = torch.randn(64, 256)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(dtype):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = model(x).float().square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    best: dict = {}
    for _ in range(3):
        for dtype in (None, torch.bfloat16, torch.float16):
            step(dtype)
            start = time.thread_time()
            for _ in range(10):
                step(dtype)
            best[dtype] = min(best.get(dtype, float("inf")), (time.thread_time() - start) / 10)
    for dtype, seconds in best.items():
        name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
        print(f"{name:<9} {seconds * 1e3:7.2f} ms per step  {seconds / best[None]:5.1f}x float32")


if __name__ == "__main__":
    main()
