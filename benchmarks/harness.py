"""Timing harness of the benchmark: reference hooks, variants timed round-robin, extras.

Variants of one model are timed round-robin: every repetition runs each variant once, in an
order rotated by one each repetition, so that drift and noise from other processes spread over
all variants alike. Every variant runs on its own deep copy of the model (same weights), so an
inspector can stay attached across iterations without touching the bare runs.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import models as bench_models
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------
# reference hooks: the floor (one read of every output) and a naive .item()-per-statistic hook
# --------------------------------------------------------------------------------------------


def _tensors(obj: Any):
    """Tensors inside a module output (tensor, tuple/list, dict), depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class HookSet:
    """A forward hook on every module; ``start``/``stop``/context manager like an inspector."""

    def __init__(self, model: nn.Module, fn: Callable[[torch.Tensor], Any]) -> None:
        self.model, self.fn, self.handles, self.kept = model, fn, [], []

    def _hook(self, module, args, out):
        with torch.no_grad():
            for t in _tensors(out):
                self.kept.append(self.fn(t.detach()))

    def _root_pre(self, module, args):
        self.kept.clear()  # one step's results kept, as an engine would hold them until flushed

    def start(self) -> HookSet:
        self.handles.append(self.model.register_forward_pre_hook(self._root_pre))
        self.handles += [m.register_forward_hook(self._hook) for m in self.model.modules()]
        return self

    def stop(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.kept.clear()

    def __enter__(self) -> HookSet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def floor_stat(t: torch.Tensor) -> torch.Tensor:
    """The floor: one reduction that reads every element once, kept on the device."""
    return t.sum()


def naive_stats(t: torch.Tensor) -> tuple:
    """Naive: every statistic moved to the host on its own (one .item() each)."""
    if not t.is_floating_point():
        t = t.float()
    n = t.numel()
    return (
        t.mean().item(),
        t.std().item() if n > 1 else 0.0,
        t.min().item(),
        t.max().item(),
        t.abs().max().item(),
        t.isnan().sum().item(),
        t.isinf().sum().item(),
        (t == 0).sum().item() / n,
    )


# --------------------------------------------------------------------------------------------
# timing harness
# --------------------------------------------------------------------------------------------


@dataclass
class Variant:
    key: str
    label: str
    kind: str  # "fwd" | "train"
    make: Callable[[contextlib.ExitStack], Callable[[], float]]  # setup -> one timed sample
    reps: int | None = None  # None: the model's repetitions
    warmup: int | None = None
    note: str = ""
    times: list[float] = field(default_factory=list)
    error: str | None = None
    sample: Callable[[], float] | None = None
    parked: dict = field(default_factory=dict)  # this variant's global module hooks, parked
    inspector: Any = None


# Global module hooks (nn.modules.module.register_module_forward_hook & co.) fire for *every*
# module in the process.  An engine that installs one while recording would also slow the
# other variants' models, which run between its samples.  The harness parks each variant's
# global hooks between its samples, so that every variant pays only for its own hooks.
_GLOBAL_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_hooks_always_called",
                      "_global_forward_hooks_with_kwargs", "_global_forward_pre_hooks",
                      "_global_backward_hooks", "_global_backward_pre_hooks")


def _global_dicts() -> dict[str, dict]:
    mod = nn.modules.module
    return {n: d for n in _GLOBAL_HOOK_DICTS if isinstance(d := getattr(mod, n, None), dict)}


class Parking:
    def __init__(self) -> None:
        self.baseline = {n: set(d) for n, d in _global_dicts().items()}
        self.seen = 0  # largest number of global hooks one variant held

    def unpark(self, v: Variant) -> None:
        for n, d in _global_dicts().items():
            d.update(v.parked.get(n, {}))

    def park(self, v: Variant) -> None:
        v.parked = {}
        for n, d in _global_dicts().items():
            new = {k: d[k] for k in list(d) if k not in self.baseline[n]}
            for k in new:
                del d[k]
            v.parked[n] = new
        self.seen = max(self.seen, len(v.parked.get("_global_forward_hooks", {})))


GC_OFF = False  # bench.py --gc-off: timeit-style, garbage collection off during a sample


def _timed(fn: Callable[[], Any]) -> float:
    # By default the collector stays on: an engine that allocates Python objects per row pays
    # for the collections it causes, as it would in a training loop.  gc.collect() runs,
    # untimed, at the start of every repetition, so one variant's garbage does not land on
    # another's samples.
    gc_was = gc.isenabled()
    if GC_OFF:
        gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        if gc_was:
            gc.enable()


def _step_of(insp: Any) -> Callable[[], Any]:
    step = getattr(insp, "step", None)
    return step if callable(step) else (lambda: None)


def _loss(out: Any) -> torch.Tensor:
    t = next(_tensors(out))
    return t.float().square().mean()


def build_variants(name: str, model: nn.Module, x: torch.Tensor, engine: Callable, args) -> list:
    quick = args.quick

    def copy_model() -> nn.Module:
        return copy.deepcopy(model)

    def attached_copy(stack: contextlib.ExitStack, attach, make) -> tuple[nn.Module, Callable]:
        """A fresh copy of the model, with `attach(copy)` entered on `stack` when given."""
        m = copy_model()
        if attach is None:
            return m, lambda: None
        insp = stack.enter_context(attach(m))
        make.inspector = insp  # the harness reads the steps it recorded
        return m, _step_of(insp)

    def fwd(attach: Callable[[nn.Module], Any] | None, block: int = 1):
        def make(stack: contextlib.ExitStack) -> Callable[[], float]:
            m, step = attached_copy(stack, attach, make)

            def once():
                m(x)
                step()

            def run():
                out = m(x)
                step()
                return out

            if block == 1:
                return lambda: _timed(run)

            def blocked():  # mean of `block` consecutive steps: exactly one is recorded
                return _timed(lambda: [once() for _ in range(block)]) / block

            return blocked

        return make

    def train(attach: Callable[[nn.Module], Any] | None):
        def make(stack: contextlib.ExitStack) -> Callable[[], float]:
            m, step = attached_copy(stack, attach, make)
            opt = torch.optim.SGD(m.parameters(), lr=1e-4)

            def run():
                opt.zero_grad(set_to_none=True)
                loss = _loss(m(x))
                loss.backward()
                opt.step()
                step()

            return lambda: _timed(run)

        return make

    def torchinfo_make(stack):
        import torchinfo

        m = copy_model()
        return lambda: _timed(lambda: torchinfo.summary(m, input_data=x, verbose=0))

    def torchlens_make(stack):
        import torchlens
        from torchlens.options import CaptureOptions

        m = copy_model()
        opts = CaptureOptions(unwrap_when_done=True)

        def run():
            tr = torchlens.trace(m, x, capture=opts)
            del tr

        return lambda: _timed(run)

    engine_label = "inspect"
    v = [
        Variant("bare", "bare forward", "fwd", fwd(None)),
        Variant("floor", "floor: x.sum() per output", "fwd",
                fwd(lambda m: HookSet(m, floor_stat))),
        Variant("naive", "naive hook: 8×.item()", "fwd", fwd(lambda m: HookSet(m, naive_stats))),
        Variant("full", f"{engine_label}(model)", "fwd", fwd(lambda m: engine(m))),
        Variant("every10", f"{engine_label}(model, every=10)", "fwd",
                fwd(lambda m: engine(m, every=10), block=10), note="mean of 10 steps per sample"),
        Variant("torchinfo", "torchinfo.summary", "fwd", torchinfo_make,
                note="own forward, eval()+no_grad"),
        Variant("torchlens", "torchlens.trace (log_forward_pass)", "fwd", torchlens_make),
        Variant("train", "bare training step", "train", train(None)),
        Variant("train_full", f"train + {engine_label}(model)", "train",
                train(lambda m: engine(m)), note="forward statistics in a training step"),
        Variant("train_grads", f"train + {engine_label}(model, grads=True)", "train",
                train(lambda m: engine(m, grads=True)),
                note="+ output and parameter gradients: about twice the tensors"),
    ]
    tl = next(x for x in v if x.key == "torchlens")
    if quick:  # one block of 10 steps (its first step is the recorded one), no warm-up
        ev = next(x for x in v if x.key == "every10")
        ev.reps, ev.warmup, ev.note = 1, 0, "1 block of 10 steps"
    if name not in PEER_MODELS:  # the peer comparison stays on the models of issue 4
        tl.reps, tl.warmup, tl.note = 0, 0, "not run on this model (see benchmarks/README.md)"
    elif quick:  # a few seconds per call on the transformer
        tl.reps, tl.warmup = (1, 0) if name == "resnet" else (0, 0)
        tl.note = "1 rep, no warm-up" if name == "resnet" else "skipped in --quick"
    elif name == "mlp5000":  # ~15 s per call on this model
        tl.reps, tl.warmup, tl.note = 2, 0, "~15 s/call: 2 reps, no warm-up"
    else:
        tl.reps, tl.warmup, tl.note = 5, 1, "slow: 5 reps"
    if args.skip:
        v = [x for x in v if x.key not in args.skip]
    return v


REPS = {"resnet": 30, "transformer": 15, "mlp5000": 20, "vgg": 20, "gpt": 12, "mobilenetv2": 20,
        "lstm_lm": 20, "hf_gpt2": 15, "hf_bert": 15}
PEER_MODELS = ("resnet", "transformer", "mlp5000")  # torchlens runs on these only


def run_model(name: str, engine: Callable, args) -> tuple[list[Variant], dict]:
    torch.manual_seed(0)
    model, x = bench_models.MODELS[name]()
    variants = build_variants(name, model, x, engine, args)
    reps = args.reps or (2 if args.quick else REPS[name])
    warm = 1 if args.quick else 2
    extra: dict = {}
    parking = Parking()
    with contextlib.ExitStack() as stack:
        for v in variants:
            try:
                v.sample = v.make(stack)
                v.inspector = getattr(v.make, "inspector", None)
            except Exception as e:  # noqa: BLE001 - report, keep benchmarking the rest
                v.error = f"{type(e).__name__}: {e}"
            parking.park(v)
        for v in variants:  # warm-up, in order
            for _ in range(warm if v.warmup is None else v.warmup):
                _sample(v, parking, record=False)
        n_max = max([reps] + [v.reps or 0 for v in variants])
        for r in range(n_max):
            gc.collect()
            active = [v for v in variants if r < (reps if v.reps is None else v.reps)]
            k = r % len(active) if active else 0
            for v in active[k:] + active[:k]:  # rotated round-robin
                _sample(v, parking, record=True)
            if args.verbose:
                print(f"  {name} rep {r + 1}/{n_max}", file=sys.stderr, flush=True)
        for v in variants:
            v.parked = {}  # parked hooks are not in the global dicts; stop() finds none
    # the stack is closed: inspectors are stopped and have moved their last step to the host
    extra["global_hooks"] = parking.seen
    for v in variants:  # what the engine says it recorded (sanity check of the timing)
        insp = v.inspector
        recorded = getattr(insp, "steps_recorded", None)
        if not isinstance(recorded, int):
            continue
        calls = (len(v.times) + (warm if v.warmup is None else v.warmup))
        calls *= 10 if v.key == "every10" else 1
        errs = getattr(insp, "errors", None)
        extra.setdefault("steps", []).append(
            f"{name}/{v.key}: {calls} steps run, {recorded} recorded"
            + (f"; {len(errs)} inspector errors, first: {errs[0]}" if errs else ""))
    return variants, extra


def _sample(v: Variant, parking: Parking, record: bool) -> None:
    if v.error or v.sample is None:
        return
    parking.unpark(v)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dt = v.sample()
    except Exception as e:  # noqa: BLE001
        v.error = f"{type(e).__name__}: {e}"
        return
    finally:
        parking.park(v)
    if record:
        v.times.append(dt)


# --------------------------------------------------------------------------------------------
# extra measurements: import time, attach+detach, reductions
# --------------------------------------------------------------------------------------------

IMPORTS = {
    "import torch": "import torch",
    "import singlecard_nb": "import singlecard_nb",
    "import singlecard_nb; singlecard_nb.inspect": "import singlecard_nb; singlecard_nb.inspect",
}


def import_times(n: int) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out: dict[str, list[float]] = {k: [] for k in IMPORTS}
    keys = list(IMPORTS)
    for r in range(n):
        k = r % len(keys)
        for key in keys[k:] + keys[:k]:
            code = ("import time; t0 = time.perf_counter(); " + IMPORTS[key]
                    + "; print(time.perf_counter() - t0)")
            p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
            if p.returncode == 0:
                out[key].append(float(p.stdout.strip().splitlines()[-1]))
            else:
                out[key] = []
                out[key + " error"] = p.stderr.strip().splitlines()[-1:]  # type: ignore[assignment]
    return out


def attach_detach(engine: Callable, n: int) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model, _ = bench_models.mlp5000()
    att, det = [], []
    for i in range(n + 1):
        gc.collect()
        t0 = time.perf_counter()
        insp = engine(model)
        insp.start()
        t1 = time.perf_counter()
        insp.stop()
        t2 = time.perf_counter()
        if i:  # first one is the warm-up
            att.append(t1 - t0)
            det.append(t2 - t1)
    return att, det


_RAW_ROW = (ctypes.c_double * 8)()


def one_pass(t: torch.Tensor) -> Any:
    """The one-pass kernel call inspect makes for a CPU tensor (all statistics, written as one
    RAW row); raises KeyError when the kernel is not built (no C compiler)."""
    from singlecard_nb.inspection.kernel import native

    native.kernels()[t.dtype](t.data_ptr(), t.numel(), False, ctypes.addressof(_RAW_ROW))


REDUCTIONS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda t: t.sum(),
    "aminmax": lambda t: torch.aminmax(t),
    "std_mean": lambda t: torch.std_mean(t),
    "var_mean": lambda t: torch.var_mean(t),
    "linalg.vector_norm": lambda t: torch.linalg.vector_norm(t),
    "count_nonzero": lambda t: torch.count_nonzero(t),
    "(x==0).sum()": lambda t: (t == 0).sum(),
    "isnan().sum()": lambda t: t.isnan().sum(),
    "isinf().sum()": lambda t: t.isinf().sum(),
    "abs().amax()": lambda t: t.abs().amax(),
    "amin() + amax()": lambda t: (t.amin(), t.amax()),
    "dot(x, x) (sum of squares)": lambda t: torch.dot(t.reshape(-1), t.reshape(-1)),
    "dot(sign(x), sign(x)) (nonzeros)": lambda t: (lambda s: torch.dot(s, s))(t.reshape(-1).sign()),
    "stack 5 scalars": None,  # filled per tensor below
    "one-pass kernel (inspect, all statistics)": one_pass,
}
# the tensors the reduction table is timed on: (model, which output)
REDUCTION_COLUMNS = (("resnet", "typical"), ("resnet", "largest"), ("transformer", "typical"),
                     ("transformer", "largest"), ("mlp5000", "typical"), ("gpt", "largest"),
                     ("hf_bert", "typical"))


def model_outputs(name: str) -> list[torch.Tensor]:
    """Copies of every module output of one forward of a benchmark model, in call order (what
    the floor's hooks see: a container's output again after its last child's)."""
    torch.manual_seed(0)
    model, x = bench_models.MODELS[name]()
    seen: list[torch.Tensor] = []

    def keep(mod, a, o):
        seen.extend(t.detach().clone() for t in _tensors(o))

    hs = [m.register_forward_hook(keep) for m in model.modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    return seen


def typical_activations(names: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Per model: the output of median size ("typical") and the largest output of a forward."""
    acts: dict[str, dict[str, torch.Tensor]] = {}
    for name in names:
        seen = [t for t in model_outputs(name) if t.is_floating_point() and t.numel() > 0]
        seen.sort(key=lambda t: t.numel())
        acts[name] = {"typical": seen[len(seen) // 2], "largest": seen[-1]}
    return acts


def _best_of(fn: Callable[[], Any], quick: bool, budget: float = 0.002) -> float:
    """Seconds per call: best of short loops. A scheduler stall (other processes on a 2-core
    machine stall a 2-thread op by a whole time slice) spoils one loop, not the estimate."""
    with torch.no_grad():
        fn()
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        inner = max(1, min(500, int((budget / 4 if quick else budget) / max(once, 1e-7))))
        samples = []
        for _ in range(3 if quick else 15):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return min(samples)


def time_reductions(names: Sequence[str], quick: bool) -> tuple[dict, dict]:
    columns = [(n, w) for n, w in REDUCTION_COLUMNS if n in names]
    acts = typical_activations(sorted({n for n, _ in columns}))
    res: dict[tuple[str, str], dict[str, float]] = {}
    for name, which in columns:
        t = acts[name][which]
        scalars = [t.sum() for _ in range(5)]
        per: dict[str, float] = {}
        for op, fn in REDUCTIONS.items():
            f = fn if fn is not None else (lambda _t, s=scalars: torch.stack(s))
            try:
                per[op] = _best_of(lambda f=f, t=t: f(t), quick)
            except (KeyError, RuntimeError):  # no kernel for this dtype, or none built
                per[op] = math.nan
        res[(name, which)] = per
    shapes = {c: tuple(acts[c[0]][c[1]].shape) for c in columns}
    return res, shapes


# --------------------------------------------------------------------------------------------
# single-card mode: what device remapping and the world-of-one DDP cost (issue 8)
# --------------------------------------------------------------------------------------------
# Self-contained: its own models, its own timing loop, single-card mode turned on and off
# around the samples that need it. Variants are interleaved round-robin like the model rows.


class _DeviceRewriteMode(torch.overrides.TorchFunctionMode):
    """The alternative to targeted patches: see every torch call and rewrite `device=`.

    A lower bound of what a remapping mode would cost: it only reads one keyword (a real one
    would also look at the positional device of .to(), .cuda(), ...).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and isinstance(device, str) and device.startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _per_call_us(fn: Callable[[], Any], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6


def _interleaved(variants: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Each variant's sample function called `repeat` times, rotated round-robin."""
    keys = list(variants)
    out: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(repeat):
        gc.collect()
        k = r % len(keys)
        for key in keys[k:] + keys[:k]:
            out[key].append(variants[key]())
    return out


Figures = dict[str, tuple[float, float]]  # variant -> (median, min)


def single_card_costs(quick: bool) -> list[tuple[str, Figures]]:
    """(measurement, {variant: (median, min)}) rows: µs per call, or ms per training step.

    Variants: "bare" (single-card mode off), "patched" (single-card mode on with the CPU pinned,
    code naming only the device it is on: the path a hard GPU pin takes for code that only
    says cuda:0), "remapping" (code says "cuda", remapped to the CPU), "mode" (the
    `_DeviceRewriteMode` above, single-card mode off), "DDP" (the real DDP over a world of one
    single-card mode builds), "pass-through" (the former DDP stand-in: the bare module).
    """
    import singlecard_nb.parallel.single_card as single_card

    # One intra-op thread: these rows compare Python overheads of a few µs, which a 2-thread op
    # stalled by another process (a whole scheduler slice) would drown.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _single_card_rows(quick, single_card)
    finally:
        torch.set_num_threads(threads)


def _single_card_rows(quick: bool, single_card: Any) -> list[tuple[str, Figures]]:
    repeat, number = (3, 300) if quick else (15, 3000)
    steps = 5 if quick else 40
    x = torch.randn(32, 20)
    small = torch.randn(16)

    def with_state(state: str, fn: Callable[[], Any], number: int, per: float = 1e6) -> float:
        # One sample: `fn` run `number` times in `state` (after one untimed call there);
        # µs per call (per=1e6) or ms per call (per=1e3).
        context: Any = contextlib.nullcontext()
        if state == "mode":
            context = _DeviceRewriteMode()
        elif state in ("patched", "remapping"):
            context = _single_card_on(single_card)
        with context:
            fn()
            return _per_call_us(fn, number) / 1e6 * per

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def training_step(device: str) -> Callable[[], None]:
        def step() -> None:  # what a script's loop does: move the batch, make a tensor, step
            source, target = x.to(device), x[:, :1].to(device)
            noise = torch.zeros(1, device=device)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(source) + noise, target).backward()
            optimizer.step()

        return step

    rows: list[tuple[str, Figures]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notices of the "remapping" variant
        calls = {
            "x.to(device) (µs per call)": (lambda d: (lambda: x.to(d)), number),
            "torch.zeros(16, device=...) (µs per call)":
                (lambda d: (lambda: torch.zeros(16, device=d)), number),
            "a + b, 16 elements: any op that names no device (µs per call)":
                (lambda d: (lambda: small + small), number),
            "training step, MLP 20-64-1, batch 32 (ms)": (training_step, steps),
        }
        for label, (make, n) in calls.items():
            per = 1e3 if label.endswith("(ms)") else 1e6
            variants = {
                "bare": lambda make=make, n=n, per=per: with_state("bare", make("cpu"), n, per),
                "patched": lambda make=make, n=n, per=per: with_state("patched", make("cpu"), n,
                                                                      per),
                "remapping": lambda make=make, n=n, per=per: with_state("remapping",
                                                                        make("cuda"), n, per),
                "mode": lambda make=make, n=n, per=per: with_state("mode", make("cpu"), n, per),
            }
            if label.startswith("a + b"):
                del variants["remapping"]  # no device named: nothing to remap
            for v in variants.values():
                v()  # warm-up
            rows.append((label, _median_and_min(_interleaved(variants, repeat))))
        rows += _ddp_costs(quick, single_card)
    return rows


@contextlib.contextmanager
def _single_card_on(single_card: Any):
    single_card.enable("cpu")
    try:
        yield
    finally:
        single_card.disable()


def _median_and_min(times: dict[str, list[float]]) -> Figures:
    return {k: (statistics.median(t), min(t)) for k, t in times.items()}


def _ddp_costs(quick: bool, single_card: Any) -> list[tuple[str, Figures]]:
    """Training step: the bare module (what the pass-through ran) vs single-card's real DDP."""
    from torch.nn.parallel import DistributedDataParallel

    repeat, steps = (3, 3) if quick else (25, 10)
    rows = []
    single_card.enable("cpu")
    try:
        for label, width, depth in (("MLP 20-64-1", 64, 1), ("MLP 512×4", 512, 4)):
            torch.manual_seed(0)
            layers: list[nn.Module] = [nn.Linear(20, width), nn.ReLU()]
            for _ in range(depth - 1):
                layers += [nn.Linear(width, width), nn.ReLU()]
            bare = nn.Sequential(*layers, nn.Linear(width, 1))
            wrapped = DistributedDataParallel(copy.deepcopy(bare))
            x, y = torch.randn(64, 20), torch.randn(64, 1)
            params = sum(p.numel() for p in bare.parameters())

            def sampler(net: nn.Module, x: torch.Tensor = x, y: torch.Tensor = y
                        ) -> Callable[[], float]:
                optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

                def step() -> None:
                    optimizer.zero_grad()
                    nn.functional.mse_loss(net(x), y).backward()
                    optimizer.step()

                return lambda: _per_call_us(step, steps) / 1e3

            variants = {"pass-through": sampler(bare), "DDP": sampler(wrapped)}
            for v in variants.values():
                v()
            rows.append((f"training step, {label} ({params:,} parameters), batch 64 (ms)",
                         _median_and_min(_interleaved(variants, repeat))))
    finally:
        single_card.disable()
    return rows


def statistics_alone(names: Sequence[str], quick: bool) -> dict[str, dict[str, float]]:
    """Per model: seconds to take the statistics of all outputs of one forward, without hooks
    or forward: the floor (one sum each), inspect's statistics (StepStats with the kernel), and
    the same with torch reductions only (before the kernel is built, or without a compiler)."""
    from singlecard_nb.inspection.kernel.stats import StepStats

    def engine(outputs, kernels):
        step = StepStats(kernels=kernels)
        for t in outputs:
            step.add(t, tuple(t.shape))
        return step.table(range(len(outputs)))

    out: dict[str, dict[str, float]] = {}
    for name in names:
        outputs = model_outputs(name)
        out[name] = {
            "floor": _best_of(lambda o=outputs: [t.sum() for t in o], quick, 0.02),
            "kernel": _best_of(lambda o=outputs: engine(o, None), quick, 0.02),
            "torch": _best_of(lambda o=outputs: engine(o, {}), quick, 0.02),
        }
    return out
