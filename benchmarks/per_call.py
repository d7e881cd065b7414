#!/usr/bin/env python
"""Where the microseconds of one small module call go, measured on `mlp5000` (2 500 × Linear(16,
16) + ReLU: 5 000 module calls per forward of 16×16 values).

    .venv/bin/python benchmarks/per_call.py

Each variant's forward is timed in thread CPU time (other processes on a shared machine do not
count) and the best of several rounds is kept, interleaved with bare forwards, so the figures
are close to what the code itself costs; `bench.py` reports medians of wall time instead, which
include the machine's noise. Rows, in µs added per module call over a bare forward:
- a global forward hook that does nothing: torch's hook dispatch;
- `nn.Module.__call__` wrapped by a function that does nothing: what observing each call could
  cost without that dispatch (a hook makes torch take its slow path through `_call_impl`);
- a global forward hook written in C++ (cpp_hook.cpp, built here against the installed torch,
  ~25 s once; left out, with the reason, without a compiler or torch's headers) making the
  recorder's dense row of each output: what the same work costs without Python-level tensor
  calls in the hook's body, the way further docs/speed.md describes;
- the floor: a hook taking one `x.sum()` per output;
- `inspect(model)`, full statistics, with the one-pass kernel built and without it (torch
  reductions, what the first steps pay while it builds);
- `inspect(model, every=10)` on an unrecorded step;
- the same two found by `inspect_all()` instead of handed to `inspect()` (the finder is out of
  torch's table while a model it knows runs, so these should equal the rows above).
A line: code that calls no module (tensor arithmetic) under `inspect_all()`, as a ratio. With the
C++ hook built, a table of a training step of 100 × Linear 64×64: µs per module call of its
forward row, of that row and its output gradient's row made by a C++ tensor hook (which autograd
calls without Python), beside a Python tensor hook that does nothing and the recorder's own.

Then, per model (100 × Linear(64, 64) on 32×64, 100 × LayerNorm(64), 100 × GELU, and the
5 000-module mlp5000), the three costs of a training step (SGD), in µs, best of interleaved
rounds, each step's flush included:
- forward: added per module call by `inspect(model)` (full statistics) to a forward;
- backward: added per module call by `grads=True` (output and parameter gradients) to a
  training step with forward statistics;
- params: added per parameter tensor by `params=True` to a step with `grads=True`, beside a
  plain `p.detach().clone()` of each (the copy Δw needs, the least it can cost).

Then what the garbage collector takes (`--collector`): a training step of mlp5000 (SGD) bare, with
`inspect(model)`, `grads=True` and `grads=True, params=True`, 30 steps each in turn: the mean
step (thread CPU time, so a full collection, which the best-of rounds above leave out, counts)
and, per step, the collections of the oldest generation and the ms spent in all collections.
Objects that live through a step (a gradient hook, a parameter's copy) count for the collector
as long-lived, and enough of them make it walk every object of the process.

Last, the accelerator path: torch operations dispatched per module output read on a device
(counted on "meta", which dispatches what a GPU would), with the CPU time per output on CUDA
where there is one, and the same operations' overhead on 16-value CPU tensors.

    .venv/bin/python benchmarks/per_call.py --shapes-only   # from that table on (~2 min)
    .venv/bin/python benchmarks/per_call.py --device-path   # only the accelerator path (5 s)
    .venv/bin/python benchmarks/per_call.py --collector     # only the collector's table (1 min)
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native

sys.path.insert(0, str(Path(__file__).parent))
import cpp_hook  # noqa: E402 - beside this script

_global_forward_hooks_with_kwargs: dict = getattr(
    sys.modules["torch.nn.modules.module"], "_global_forward_hooks_with_kwargs", {})
CPP_ROW = "forward hook in C++, the same dense row (cpp_hook.cpp)"

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


def best_under_global_hook(hook, fn, repeat: int = 7, with_kwargs: bool = False) -> float:
    """best_cpu_time(fn) with `hook` as torch's global forward hook, taken out after (also
    its with_kwargs flag, which torch <= 2.13's handle leaves behind)."""
    handle = register_module_forward_hook(hook, with_kwargs=with_kwargs)
    try:
        return best_cpu_time(fn, repeat)
    finally:
        handle.remove()
        _global_forward_hooks_with_kwargs.pop(handle.id, None)


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
        return lambda: best_under_global_hook(hook, lambda: (model(x), kept.clear()))

    def called_through_patch():
        # what observing every module call could cost without torch's hook dispatch: a
        # do-nothing wrapper of nn.Module.__call__ (the class attribute, given back after)
        original = nn.Module.__call__

        def wrapper(module, *args, **kwargs):
            return original(module, *args, **kwargs)

        nn.Module.__call__ = wrapper
        try:
            return best_cpu_time(lambda: model(x))
        finally:
            nn.Module.__call__ = original

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

    def hooked_in_cpp(built):
        # the forward hook's dense path written in C++ (cpp_hook.cpp): the same kernel and
        # checks, a row of the same metadata, no Python-level tensor calls
        def run():
            for index, module in enumerate(model.modules()):
                built.add_target(module, index)
            try:
                return best_under_global_hook(built.hook, lambda: (built.next_step(), model(x)),
                                              with_kwargs=True)
            finally:
                assert built.rows() == CALLS + 1, built.rows()  # every call made its row
                built.forget()
        return run

    variants = {
        "global forward hook doing nothing (torch's dispatch)": hooked(nothing),
        "nn.Module.__call__ wrapped, doing nothing": called_through_patch,
        "floor: x.sum() per output": hooked(floor),
        "inspect(model), one-pass kernel": inspected(True),
        "inspect(model), torch reductions": inspected(False),
        "inspect(model, every=10)": inspected(True, every=10),
        "inspect_all(), the model found": found(),
        "inspect_all(every=10), the model found": found(every=10),
    }
    built = cpp_hook.build()
    if isinstance(built, str):
        print(f"(no row for a hook in C++: {built})")
    else:
        variants[CPP_ROW] = hooked_in_cpp(built)
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
    if not isinstance(built, str):
        gradients_in_cpp(built)


def gradients_in_cpp(built) -> None:
    """A training step of 100 × Linear 64×64 (batch 32): µs per module call over a bare step,
    with the C++ hook's rows (forward; forward and its output's gradient, from a C++ tensor
    hook) beside a Python tensor hook that does nothing and the recorder's own."""
    model, x = shape_models()["Linear 64x64"]
    calls = sum(1 for _ in model.modules())
    for index, module in enumerate(model.modules()):
        built.add_target(module, index)

    def step() -> None:
        built.next_step()
        model(x).sum().backward()
        for p in model.parameters():
            p.grad = None

    def with_hook(hook, with_kwargs: bool = False, grads: bool = False):
        def run():
            built.record_grads(grads)
            return best_under_global_hook(hook, step, 15, with_kwargs)
        return run

    def python_tensor_hook(module, args, output):
        if type(output) is torch.Tensor and output.requires_grad:
            output.register_hook(lambda grad: None)

    def inspected(**options):
        def run():
            with scn.inspect(model, max_rows=10**7, **options):
                step()
                return best_cpu_time(step, 15)
        return run

    variants = {
        "bare": lambda: best_cpu_time(step, 15),
        "global forward hook doing nothing": with_hook(lambda module, args, output: None),
        "C++: the forward row": with_hook(built.hook, True),
        "C++: the forward row and its gradient's row": with_hook(built.hook, True, True),
        "Python tensor hook doing nothing, on each output": with_hook(python_tensor_hook),
        "inspect(model)": inspected(),
        "inspect(model, grads=True) (+2 parameter gradients)": inspected(grads=True),
    }
    best = {name: float("inf") for name in variants}
    for _ in range(ROUNDS):
        for name, run in variants.items():
            best[name] = min(best[name], run())
    built.forget()
    print(f"training step of 100 × Linear 64x64, batch 32 ({best['bare'] * 1e3:.2f} ms bare): "
          "µs added per module call")
    for name in list(variants)[1:]:
        print(f"  {name:<54} {(best[name] - best['bare']) / calls * 1e6:6.2f}")


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


def shape_models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    def linear() -> nn.Module:
        layer = nn.Linear(64, 64)
        nn.init.normal_(layer.weight, std=64 ** -0.5)  # the scale stays: no denormals
        return layer

    return {
        "Linear 64x64": (nn.Sequential(*(linear() for _ in range(100))), torch.randn(32, 64)),
        "LayerNorm(64)": (nn.Sequential(*(nn.LayerNorm(64) for _ in range(100))),
                          torch.randn(32, 64)),
        "GELU": (nn.Sequential(*(nn.GELU() for _ in range(100))),
                 torch.randn(32, 64, requires_grad=True)),
        "mlp5000": mlp5000(),
    }


def per_shape(rounds: int = 3) -> None:
    """Per model: µs added per module call (forward, backward) and per parameter tensor."""
    print(f"{'model':<16} {'calls':>6} {'params':>6} {'forward µs/call':>16} "
          f"{'backward µs/call':>17} {'params µs/tensor':>17} {'clone µs/tensor':>16}")
    us = 1e6
    for name, (model, x) in shape_models().items():
        calls = sum(1 for _ in model.modules())
        params = list(model.parameters())
        best = shape_costs(model, x, params, rounds)
        forward = (best["fwd inspected"] - best["fwd bare"]) / calls * us
        backward = (best["grads"] - best["forward"]) / calls * us
        if params:
            per_param = f"{(best['params'] - best['grads']) / len(params) * us:17.2f}"
            clone = f"{best['clone'] / len(params) * us:16.2f}"
        else:
            per_param, clone = f"{'-':>17}", f"{'-':>16}"
        print(f"{name:<16} {calls:>6} {len(params):>6} {forward:16.2f} {backward:17.2f} "
              f"{per_param} {clone}", flush=True)


def training_step(model: nn.Module, opt: torch.optim.Optimizer | None, x: torch.Tensor) -> None:
    """One SGD step of the per-model tables (backward alone without an optimiser)."""
    if opt is not None:
        opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    if opt is not None:
        opt.step()


def shape_costs(model: nn.Module, x: torch.Tensor, params: list, rounds: int) -> dict:
    """Best thread CPU time of each variant's training step (and of forwards, clones)."""
    variants = {"bare": None, "forward": {}, "grads": {"grads": True}}
    if params:
        variants["params"] = {"grads": True, "params": True}
    copies = {key: copy.deepcopy(model) for key in [*variants, "fwd"]}
    optimizers = {key: torch.optim.SGD(m.parameters(), lr=1e-6) if params else None
                  for key, m in copies.items()}

    def step(key: str) -> None:
        training_step(copies[key], optimizers[key], x)

    def forward(key: str) -> None:
        copies[key](x)

    def clone() -> None:
        for p in params:
            p.detach().clone()

    best = {key: float("inf") for key in [*variants, "fwd bare", "fwd inspected", "clone"]}
    inspectors = [scn.inspect(copies[key], max_rows=10**7, **options)  # started
                  for key, options in variants.items() if options is not None]
    try:
        for key in variants:
            step(key)  # the first step: probes go, the kernel's buffers exist
        for _ in range(rounds):  # interleaved
            for key in variants:
                best[key] = min(best[key], best_cpu_time(functools.partial(step, key), 5))
            with torch.no_grad():
                best["fwd bare"] = min(best["fwd bare"],
                                       best_cpu_time(functools.partial(forward, "bare"), 5))
                with scn.inspect(copies["fwd"], max_rows=10**7):
                    forward("fwd")
                    best["fwd inspected"] = min(
                        best["fwd inspected"], best_cpu_time(functools.partial(forward, "fwd"), 5))
            best["clone"] = min(best["clone"], best_cpu_time(clone, 5))
    finally:
        for insp in inspectors:
            insp.stop()
    return best


def collector(steps: int = 30) -> None:
    """Mean training step of mlp5000 per variant, with the collector's work per step."""
    print(f"the garbage collector, mlp5000 training steps (SGD), mean of {steps}")
    print(f"{'variant':<24} {'step ms':>8} {'full collections/step':>22} "
          f"{'ms collecting/step':>19} {'µs/call over bare':>18}")
    model, x = mlp5000()
    calls = sum(1 for _ in model.modules())
    spent = [0, 0.0]  # full collections, seconds in any collection
    began = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.thread_time()
        else:
            spent[0] += info["generation"] == 2
            spent[1] += time.thread_time() - began[0]

    bare_ms = None
    for label, options in (("bare", None), ("inspect", {}), ("grads=True", {"grads": True}),
                           ("grads, params=True", {"grads": True, "params": True})):
        m = copy.deepcopy(model)
        step = functools.partial(training_step, m, torch.optim.SGD(m.parameters(), lr=1e-6), x)
        insp = scn.inspect(m, max_rows=10**6, **options) if options is not None else None
        try:
            for _ in range(3):
                step()
            gc.collect()
            spent[:] = [0, 0.0]
            gc.callbacks.append(timed)
            try:
                start = time.thread_time()
                for _ in range(steps):
                    step()
                ms = (time.thread_time() - start) / steps * 1e3
            finally:
                gc.callbacks.remove(timed)
        finally:
            if insp is not None:
                insp.stop()
        bare_ms = ms if bare_ms is None else bare_ms
        added = "-" if options is None else f"{(ms - bare_ms) / calls * 1e3:.2f}"
        print(f"{label:<24} {ms:8.1f} {spent[0] / steps:22.2f} {spent[1] / steps * 1e3:19.1f} "
              f"{added:>18}", flush=True)


def _device_step(xs: list, shape: tuple, device: str) -> None:
    """One step's reads of `xs` on the accelerator path, and its collection."""
    from singlecard_nb.inspection.kernel.stats import StepStats

    step_stats = StepStats(kernels={})
    for x in xs:
        step_stats.add(x, shape)
    try:
        step_stats.collect()
    except NotImplementedError:  # meta: no data to move to the host; the rest ran
        pass
    if device == "cuda":
        torch.cuda.synchronize()


def device_path(rounds: int = 5) -> None:
    """What reading one module output costs the CPU on an accelerator: torch operations
    that launch a kernel (views launch none) per tensor, for a step of 100 outputs (the step's
    collection included), and on
    CUDA where there is one the CPU time per tensor (synchronised, with the transfer to the
    host). Each operation is a kernel launch, a few µs of CPU time whatever the tensor's size;
    the "meta" device dispatches the same operations without a GPU, so the count is taken
    there on every machine."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from singlecard_nb.inspection.kernel.reductions import DeviceRows

    class Counted(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view  # a view (detach) launches no kernel
            return func(*args, **(kwargs or {}))

    devices = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])
    tensors = 100
    print(f"the accelerator path, a step of {tensors} module outputs read "
          "(StepStats.add, then the step's collection)")
    print(f"{'device':<6} {'output':<24} {'launches/tensor':>15} {'µs/tensor':>10}")
    for device in devices:
        for label, shape in (("large (8×64×128 float32)", (8, 64, 128)),
                             ("small (64×64, staged)", (64, 64))):
            xs = [torch.randn(shape, device=device) for _ in range(tensors)]

            step = functools.partial(_device_step, xs, shape, device)
            step()
            with Counted() as counted:
                step()
            # meta's kernels are partly Python (torch._meta_registrations): its time is no
            # stand-in for a launch's, its count of operations is
            per_tensor = "-" if device == "meta" else (
                f"{min(best_cpu_time(step, repeat=3) for _ in range(rounds)) / tensors * 1e6:.2f}")
            print(f"{device:<6} {label:<24} {counted.ops / tensors:15.2f} {per_tensor:>10}")
    # the same operations (DeviceRows, as StepStats runs them for an accelerator's tensor) on
    # 16-value CPU tensors, where only their overhead counts: a CPU-time stand-in for a GPU's
    tiny = [torch.randn(16) for _ in range(tensors)]
    zero = torch.zeros((), dtype=torch.float64)  # StepStats keeps one per device

    def overhead():
        rows = DeviceRows(False, zero)
        for slot, x in enumerate(tiny):
            rows.add(x, 16, slot)
        rows.table()

    with Counted() as counted:
        overhead()
    best = min(best_cpu_time(overhead, repeat=3) for _ in range(rounds))
    print(f"{'cpu':<6} {'16 values, overhead only':<24} {counted.ops / tensors:15.2f} "
          f"{best / tensors * 1e6:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes-only", action="store_true",
                        help="leave out the first table (the per-model table of forward, "
                        "backward and params costs, the collector's and the accelerator path)")
    parser.add_argument("--device-path", action="store_true",
                        help="only the table of the accelerator path (a minute or less)")
    parser.add_argument("--collector", action="store_true",
                        help="only the table of the garbage collector's work (a minute)")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    torch.set_num_threads(1)
    if options.device_path:  # reads no CPU tensor: no kernel to wait for
        device_path()
        sys.exit()
    native.wait(120)
    if options.collector:
        collector()
        sys.exit()
    if not options.shapes_only:
        main()
    per_shape(options.rounds)
    collector()
    device_path()
