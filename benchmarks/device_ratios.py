"""The benchmark's ratios on an accelerator, for scripts/gpu_check.py (also runs on a CPU).

    ratios("resnet", torch.device("cuda"), reps=20)   # {variant: median seconds, ...}
    syncs_per_step("resnet", torch.device("cuda"))    # device->host synchronisations, one step

The variants are bench.py's (bare and floor forwards, full statistics, every=10, training steps
with forward statistics and with grads=True), timed round-robin on their own copies of the
model. On CUDA every sample ends with `torch.cuda.synchronize()`, so a sample is the time until
the GPU has finished, and queued work cannot leak into the next variant's sample.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
for path in (str(HERE.parent), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import models as bench_models  # noqa: E402
import torch  # noqa: E402
from harness import HookSet, _loss, floor_stat  # noqa: E402

import singlecard_nb  # noqa: E402

VARIANTS = ("bare", "floor", "full", "every10", "train", "train_full", "train_grads")


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def ratios(name: str, device: torch.device, reps: int = 20, warmup: int = 3) -> dict[str, Any]:
    """Median seconds per sample of every variant, and ratios like bench.py's.

    Returns {"median": {variant: s}, "ratio": {variant: x}, "floor_target": x} where a forward
    variant's ratio is to the bare forward and a training variant's to the bare step.
    """
    torch.manual_seed(0)
    model, x = bench_models.MODELS[name]()
    model, x = model.to(device), x.to(device)
    sync = _synchronizer(device)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with contextlib.ExitStack() as stack:
        runs = {v: _variant(v, model, x, stack) for v in VARIANTS}
        for _ in range(warmup):
            for run in runs.values():
                run()
        sync()
        for r in range(reps):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for v in order:  # rotated round-robin, as in bench.py
                start = time.perf_counter()
                runs[v]()
                sync()
                samples[v].append(time.perf_counter() - start)
    median = {v: statistics.median(s) for v, s in samples.items()}
    ratio = {v: median[v] / median["train" if v.startswith("train") else "bare"]
             for v in VARIANTS}
    ratio["full/floor"] = median["full"] / median["floor"]
    return {"median": median, "ratio": ratio}


def _variant(key: str, model: torch.nn.Module, x: torch.Tensor,
             stack: contextlib.ExitStack) -> Callable[[], Any]:
    m = copy.deepcopy(model)
    step: Callable[[], Any] = lambda: None  # noqa: E731
    if key == "floor":
        stack.enter_context(HookSet(m, floor_stat))
    elif key != "bare" and key != "train":
        options = {"every10": {"every": 10}, "train_grads": {"grads": True}}.get(key, {})
        insp = stack.enter_context(singlecard_nb.inspect(m, **options))
        step = insp.step
    if key.startswith("train"):
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)

        def train() -> None:
            opt.zero_grad(set_to_none=True)
            _loss(m(x)).backward()
            opt.step()
            step()

        return train
    if key == "every10":
        def ten_steps() -> None:  # one sample: 10 steps, exactly one of them recorded
            for _ in range(10):
                m(x)
                step()

        return ten_steps

    def forward() -> None:
        m(x)
        step()

    return forward


def syncs_per_step(name: str, device: torch.device) -> int:
    """Device->host synchronisations during one inspected forward step, after a first step
    (whose statistics then move to the host), counted by torch's sync debug mode."""
    torch.manual_seed(0)
    model, x = bench_models.MODELS[name]()
    model, x = model.to(device), x.to(device)
    with singlecard_nb.inspect(model) as insp:
        model(x)  # step 0
        insp.step()
        model(x)
        if device.type != "cuda":
            return 0  # nothing to count on a CPU: a read is not a synchronisation
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                insp.step()  # ends step 1: its statistics cross to the host
                model(x)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)
