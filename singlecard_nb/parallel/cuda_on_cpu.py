"""`%singlecard cpu`: the CUDA calls of CUDA-minded scripts answered by a one-GPU machine whose
GPU happens to be the CPU.

Each decision, and why (also in the README, "Multi-GPU code on one card"):

- `torch.cuda.synchronize()`: returns at once. CPU operations have finished when they return,
  so there is nothing to wait for; that is what synchronize promises.
- `torch.cuda.manual_seed(n)` / `manual_seed_all(n)`: seed the CPU generator, which is the one
  that draws the numbers for tensors the script meant for the GPU. (torch's own calls of these,
  from `torch.manual_seed`, are left as they are: torch seeds the CPU itself.)
- memory counters (`memory_allocated`, `max_memory_allocated`, `memory_reserved`, ...,
  `memory_stats`, `reset_peak_memory_stats`, ...): report 0 / `{}` (CUDA's allocator holds
  nothing) and resets do nothing, instead of failing; said once, pointing to
  `%singlecard watch` for the process memory. `memory_summary()` says the same in words.
  `mem_get_info()` reports the host's available and total memory (the device is the host).
- `torch.autocast("cuda", dtype)` and `torch.cuda.amp.autocast`: autocast on the CPU with the
  same dtype (float16 when none is given, as on a GPU), instead of torch's "CUDA is not
  available, disabling".
- `torch.amp.GradScaler("cuda")` and `torch.cuda.amp.GradScaler`: a CPU GradScaler that really
  scales, instead of a disabled one.
- `torch.cuda.Event(enable_timing=True)` (cpu_streams.py): records the CPU's clock, so `elapsed_time` times
  the work between two records (CPU work is done when its call returns; `synchronize`, `wait`,
  `query` have nothing to wait for). Streams (`Stream`, `current_stream`, `default_stream`,
  `with torch.cuda.stream(s)`, `wait_stream`, `record_event`) run in order on the CPU: nothing
  to wait for either.
- `get_rng_state` / `set_rng_state` (and `_all`), `initial_seed`, `seed`: the CPU generator's,
  as `manual_seed` above; a GPU's saved state (another size) is not forced into it, said once.
- `current_device()` is 0, the one device of this machine, which device references then map to
  the CPU; `get_device_name()` says it is the CPU.
- Any other call that needs a real GPU (`get_device_properties`, `get_device_capability`,
  `ipc_collect`...) fails with a message that names it and says what to change: guard it with
  `torch.cuda.is_available()` or pin a GPU. The error is both a RuntimeError and an
  AssertionError, the two types torch raises there, so code that catches either still does.
- Not changed: `torch.cuda.empty_cache()` (already does nothing while CUDA is not started),
  `torch.backends.cudnn` flags (accepted; there is no cuDNN on the CPU), and
  `torch.cuda.is_available()` / `device_count()`, which keep saying False / 0 so that libraries
  (Lightning, Hugging Face, accelerate) take their CPU paths; scripts that derive a world size
  from `device_count()` get one from `mp.spawn` (spawn.py) and `init_process_group` (a world of
  one), with a notice.

Every answer is said once per kind and counted in `%singlecard status`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from . import cpu_streams

_ZERO_COUNTERS = ("memory_allocated", "max_memory_allocated", "memory_reserved",
                  "max_memory_reserved", "memory_cached", "max_memory_cached")
_RESETS = ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats")
_MEMORY_NOTE = ("singlecard_nb: torch.cuda.{}() under `%singlecard cpu`: CUDA's allocator holds "
                "nothing here, so its counters read 0 and resets do nothing; "
                "`%singlecard watch on` shows this process's memory after each cell.")


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """Answer CUDA-minded calls for `device` (the CPU), owned by `owner`."""
    _patch(owner, "synchronize", lambda original: _synchronize(notices))
    for name in ("manual_seed", "manual_seed_all"):
        _patch(owner, name, lambda original, name=name: _seed(original, name, notices))
    for name in _ZERO_COUNTERS:
        _patch(owner, name, lambda original, name=name: _counter(name, 0, notices))
    _patch(owner, "memory_stats", lambda original: _counter("memory_stats", {}, notices, dict))
    for name in _RESETS:
        _patch(owner, name, lambda original, name=name: _counter(name, None, notices))
    _patch(owner, "memory_summary", lambda original: _summary(notices))
    _patch(owner, "mem_get_info", lambda original: _mem_get_info(notices))
    _patch_autocast(owner, device, notices)
    _patch_grad_scaler(owner, device, notices)
    cpu_streams.install(owner, notices)
    _patch_rng_state(owner, notices)
    _patch(owner, "current_device", lambda original: _current_device(notices))
    _patch(owner, "get_device_name", lambda original: _device_name())
    _patch(owner, "_lazy_init", _needs_a_gpu)


def _patch(owner: Borrowed, name: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(torch.cuda, name, None)
    if original is None:  # an older torch without this call
        return
    label = ("torch.cuda memory counters" if name.startswith(("memory", "max_memory", "reset"))
             else "torch.cuda random state" if "seed" in name or "rng" in name
             else f"torch.cuda.{name}")
    owner.set_attr(torch.cuda, name, wrap_like(original, make(original)), label)


def _synchronize(notices: Notices) -> Callable:
    def synchronize(device: Any = None) -> None:
        notices.say("synchronize", "singlecard_nb: torch.cuda.synchronize() under `%singlecard "
                    "cpu` returns at once: CPU operations have finished when they return.")

    return synchronize


def _seed(original: Callable, name: str, notices: Notices) -> Callable:
    def seed(seed: int) -> None:
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
            return original(seed)  # torch.manual_seed seeds the CPU generator itself
        notices.say("manual_seed", lambda: (
            f"singlecard_nb: torch.cuda.{name}({seed!r}) under `%singlecard cpu` seeds the CPU "
            "generator, which draws the numbers for the tensors meant for the GPU."))
        torch.default_generator.manual_seed(int(seed))

    return seed


def _counter(name: str, value: Any, notices: Notices, make: Callable | None = None) -> Callable:
    def counter(*args: Any, **kwargs: Any) -> Any:
        notices.say("memory", _MEMORY_NOTE.format(name))
        return make() if make is not None else value

    return counter


def _summary(notices: Notices) -> Callable:
    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        notices.say("memory", _MEMORY_NOTE.format("memory_summary"))
        return ("singlecard_nb: no CUDA memory to summarise: `%singlecard cpu` runs this code on "
                "the CPU (`%singlecard watch on` shows the process memory).")

    return memory_summary


def _mem_get_info(notices: Notices) -> Callable:
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        notices.say("mem_get_info", "singlecard_nb: torch.cuda.mem_get_info() under `%singlecard "
                    "cpu` reports the host's available and total memory: the device is the host.")
        return _host_memory()

    return mem_get_info


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        kib = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if k in
               ("MemAvailable", "MemTotal")}
        return kib["MemAvailable"], kib["MemTotal"]
    except (OSError, KeyError, ValueError):  # not Linux: total only, from sysconf
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total


def _patch_autocast(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            users, level = _users_frame(sys._getframe())
            dtype = torch.float16 if dtype is None else dtype  # CUDA's default autocast dtype
            notices.say("autocast", lambda: (
                f"singlecard_nb: torch.autocast('cuda', {dtype}) under `%singlecard cpu` runs "
                f"as torch.autocast('{device.type}', {dtype})."), stacklevel=level)
            with _warnings_at(users):  # torch's "not supported" is about the user's line
                original(self, device.type, dtype=dtype, enabled=enabled,
                         cache_enabled=cache_enabled)
            return
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__),
                   "torch.autocast")


def _patch_grad_scaler(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.GradScaler
    original = cls.__init__

    pinned = device

    def __init__(self, device: str = "cuda", *args, **kwargs):
        if device == "cuda":
            users, level = _users_frame(sys._getframe())
            notices.say("GradScaler", lambda: (
                "singlecard_nb: torch.amp.GradScaler('cuda') under `%singlecard cpu` scales on "
                f"the {pinned.type} (GradScaler('{pinned.type}'))."), stacklevel=level)
            with _warnings_at(users):
                original(self, pinned.type, *args, **kwargs)
            return
        original(self, device, *args, **kwargs)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__),
                   "torch.amp.GradScaler")


def _users_frame(ours: Any) -> tuple[Any, int]:
    """The first frame outside torch and this package above `ours` (the frame of a patched
    function: torch.cuda.amp's classes call it through super()), and the stacklevel of that
    frame for a notice said in `ours`."""
    frame, level = ours, 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
            ("torch.", "singlecard_nb", "typing_extensions")):  # its @deprecated wraps amp's
        frame, level = frame.f_back, level + 1
    return frame, level


@contextlib.contextmanager
def _warnings_at(frame: Any) -> Any:
    """torch's own warnings from the call inside shown at the user's `frame`, not at ours."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        warnings.warn_explicit(w.message, w.category, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__"),
                               registry=frame.f_globals.setdefault("__warningregistry__", {}))


# --- random state: the CPU generator's, as manual_seed --------------------------------------
def _patch_rng_state(owner: Borrowed, notices: Notices) -> None:
    def say(stacklevel: int = 3) -> None:  # 3: the user's line calling the function below
        notices.say("rng_state", "singlecard_nb: torch.cuda's random state under `%singlecard "
                    "cpu` is the CPU generator's, which draws the numbers for the tensors meant "
                    "for the GPU (saving and restoring it round-trips).", stacklevel=stacklevel)

    def restore(state: torch.Tensor) -> None:
        if state.numel() != torch.get_rng_state().numel():
            notices.say("rng_state_gpu", "singlecard_nb: torch.cuda.set_rng_state() under "
                        "`%singlecard cpu` got a GPU generator's state (a checkpoint saved on a "
                        "GPU), which cannot seed the CPU generator: the CPU generator is left "
                        "as it was.", stacklevel=4)
            return
        torch.set_rng_state(state)

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        say()
        return torch.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        say()
        restore(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        say()
        return [torch.get_rng_state()]  # one device

    def set_rng_state_all(new_states: Sequence[torch.Tensor]) -> None:
        say()
        if len(new_states):  # saved on several GPUs: the first is this machine's one device
            restore(new_states[0])

    def seed() -> None:
        say()
        torch.default_generator.seed()

    def initial_seed() -> int:
        say()
        return torch.initial_seed()

    for name, fn in (
            ("get_rng_state", get_rng_state), ("set_rng_state", set_rng_state),
            ("get_rng_state_all", get_rng_state_all), ("set_rng_state_all", set_rng_state_all),
            ("seed", seed), ("seed_all", seed), ("initial_seed", initial_seed)):
        _patch(owner, name, lambda original, fn=fn: fn)


# --- the device itself ----------------------------------------------------------------------
def _current_device(notices: Notices) -> Callable:
    def current_device() -> int:
        notices.say("current_device", "singlecard_nb: torch.cuda.current_device() under "
                    "`%singlecard cpu` is 0, this session's one device, which is the CPU: "
                    "device references to it land on the CPU.")
        return 0

    return current_device


def _device_name() -> Callable:  # a new function each time: _patch gives it torch's name
    def get_device_name(device: Any = None) -> str:
        return "CPU (singlecard_nb: %singlecard cpu)"

    return get_device_name


class NoGpuError(RuntimeError, AssertionError):
    """A torch.cuda call that needs a real GPU, under `%singlecard cpu`. Both types torch raises
    there, so code that catches either (RuntimeError on a CUDA build, AssertionError on a CPU
    build) still does."""


def _needs_a_gpu(original: Callable) -> Callable:
    def _lazy_init() -> None:
        try:
            original()
        except (AssertionError, RuntimeError) as e:
            call = _outermost_cuda_call(sys._getframe(1))
            raise NoGpuError(
                f"singlecard_nb: torch.cuda.{call}() needs a GPU, and this session runs on the "
                "CPU (`%singlecard cpu`), where it has no answer. Guard it with `if "
                "torch.cuda.is_available():` (False here), or pin a GPU (`%singlecard auto`, "
                f"in a fresh kernel). torch said: {e}") from e

    return _lazy_init


def _outermost_cuda_call(frame: Any) -> str:
    """The torch.cuda function the user called (get_device_capability, not the
    get_device_properties it calls in turn)."""
    name = frame.f_code.co_name
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch.cuda"):
        name = frame.f_code.co_name
        frame = frame.f_back
    return name
