#!/usr/bin/env python
"""The fixed part of a recorded step: what the terminal form's `--inspect` (and `--inspect
--grads --params`) adds to one training step of a tiny model, in thread CPU time, in process.

    .venv/bin/python benchmarks/step_cost.py                  # about a minute
    .venv/bin/python benchmarks/step_cost.py --model lstm
    .venv/bin/python benchmarks/step_cost.py --inside         # the fixed part's own time

The models are the corpus's short steps (tests/scripts/corpus/): the accelerate loop's 4-module
MLP (Linear, GELU, LayerNorm, Linear on 16×16, AdamW) and the word_language_model LSTM LM (2 ×
64, 20×8 tokens). Their steps make a handful of module calls, so what inspection adds there is
mostly per step: the hand-off of the step's statistics, the model input's channel statistics,
the loss, the optimiser's rows, and the garbage collector's share of what a step keeps.
`inspect_all()` finds the model, as `python -m singlecard_nb --inspect` does. Per variant: the
best of 5 chunks of `--steps`/5 steps (other processes on a shared machine add to a chunk, never
take away), after 50 steps of warm-up; one torch thread. Collections of the garbage collector
during the timed steps are counted and timed too (`gc.callbacks`).

`--inside` times, per step, only the fixed part's two places (best of the same 5 chunks, each
place on its own): the model's pre-hook (`CallTracker.on_root_pre`: the previous step's
hand-off to the host, the model input's row and channel statistics) and the loss
(`Recorder.record_loss`). The whole step's added time moves between runs by more than a change
to those places on a shared runner; their own time does not.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import time

import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native

VARIANTS = {"bare": None, "--inspect": {}, "--inspect --grads --params": {"grads": True,
                                                                        "params": True}}


def mlp():
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
    xs = [torch.randn(16, 16) for _ in range(64)]
    ys = [torch.randn(16, 1) for _ in range(64)]

    def loss(i):
        return nn.functional.mse_loss(model(xs[i % 64]), ys[i % 64])
    return model, loss


class _LM(nn.Module):
    def __init__(self, tokens: int = 200, width: int = 64):
        super().__init__()
        self.encoder = nn.Embedding(tokens, width)
        self.rnn = nn.LSTM(width, width, 2)
        self.drop = nn.Dropout(0.2)
        self.decoder = nn.Linear(width, tokens)

    def forward(self, x):
        out, _ = self.rnn(self.drop(self.encoder(x)))
        return self.decoder(self.drop(out))


def lstm():
    model = _LM()
    xs = [torch.randint(0, 200, (20, 8)) for _ in range(64)]

    def loss(i):
        out = model(xs[i % 64])
        return nn.functional.cross_entropy(out.view(-1, 200), xs[(i + 1) % 64].view(-1))
    return model, loss


def measure(make, options, steps: int) -> tuple[float, int, float]:
    """(µs per step, collections, ms collecting) of one variant, on a fresh model."""
    torch.manual_seed(0)
    model, loss = make()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collecting = [0, 0.0, 0.0]

    def timed(phase, info):
        if phase == "start":
            collecting[2] = time.perf_counter()
        else:
            collecting[0] += 1
            collecting[1] += time.perf_counter() - collecting[2]

    def run(n, offset):
        for i in range(offset, offset + n):
            loss(i).backward()
            optimizer.step()
            optimizer.zero_grad()

    finder = scn.inspect_all(**options) if options is not None else None
    try:
        run(50, 0)
        gc.callbacks.append(timed)
        try:
            chunk = steps // 5
            best = min(_cpu(run, chunk, 50 + r * chunk) for r in range(5)) / chunk
        finally:
            gc.callbacks.remove(timed)
    finally:
        if finder is not None:
            finder.stop()
    return best * 1e6, collecting[0], collecting[1] * 1e3


def inside(make, options, steps: int) -> dict[str, float]:
    """µs per step spent in each of the fixed part's places (`--inside`), on a fresh model."""
    from singlecard_nb.inspection.recording import calls, recorder

    places = {"on_root_pre": calls.CallTracker, "record_loss": recorder.Recorder}
    spent: collections.Counter = collections.Counter()
    originals = {name: getattr(owner, name) for name, owner in places.items()}

    def timed(name, method):
        @functools.wraps(method)
        def run_timed(*args, **kwargs):
            start = time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.thread_time_ns() - start
        return run_timed

    for name, owner in places.items():
        setattr(owner, name, timed(name, originals[name]))
    try:
        torch.manual_seed(0)
        model, loss = make()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        finder = scn.inspect_all(**options)
        try:
            best: dict[str, float] = {}
            chunk = steps // 5
            for r in range(-1, 5):  # -1: 50 steps of warm-up
                spent.clear()
                offset, n = (0, 50) if r < 0 else (50 + r * chunk, chunk)
                for i in range(offset, offset + n):
                    loss(i).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                if r >= 0:
                    for name in places:
                        best[name] = min(best.get(name, float("inf")), spent[name] / n / 1e3)
        finally:
            finder.stop()
    finally:
        for name, owner in places.items():
            setattr(owner, name, originals[name])
    return best


def _cpu(run, n: int, offset: int) -> float:
    start = time.thread_time()
    run(n, offset)
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "lstm"), default="mlp")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--inside", action="store_true",
                        help="time the fixed part's two places only (see above)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    native.start()
    native.wait(120)
    make = {"mlp": mlp, "lstm": lstm}[options.model]
    if options.inside:
        print(f"{options.model}: µs per step in each place (thread CPU time, best of 5 chunks "
              f"of {options.steps // 5} steps)")
        for name, variant in VARIANTS.items():
            if variant is not None:
                places = inside(make, variant, options.steps)
                print(f"{name:<28} " + "  ".join(f"{place} {us:6.1f} µs"
                                                 for place, us in places.items()))
        return
    results = {name: measure(make, variant, options.steps) for name, variant in VARIANTS.items()}
    bare = results["bare"][0]
    print(f"{options.model}: µs per step (thread CPU time, best of 5 chunks of "
          f"{options.steps // 5} steps), added to a bare step; garbage collections while timed")
    for name, (us, count, ms) in results.items():
        added = "" if name == "bare" else f"  +{us - bare:7.1f} µs ({us / bare:.2f}x)"
        print(f"{name:<28} {us:8.1f} µs{added}  gc: {count} collections, {ms:.1f} ms")


if __name__ == "__main__":
    main()
