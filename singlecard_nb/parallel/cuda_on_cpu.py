"""`%singlecard cpu`: the CUDA calls of CUDA-minded scripts answered by a one-GPU machine whose
GPU happens to be the CPU; and `under_cpu(device)`, which every module of the wing asks
whether this is the case.

Each decision, and why (also in the README, "Multi-GPU code on one card"):

- `torch.cuda.synchronize()`: returns at once. CPU operations have finished when they return,
  so there is nothing to wait for; that is what synchronize promises.
- `torch.cuda.manual_seed(n)` / `manual_seed_all(n)` (cpu_random.py): seed the CPU generator,
  which is the one that draws the numbers for tensors the script meant for the GPU. (torch's
  own calls of these, from `torch.manual_seed`, are left as they are: torch seeds the CPU
  itself.)
- memory counters (cpu_memory.py: `memory_allocated`, `max_memory_allocated`,
  `memory_reserved`, ..., `memory_stats`, `reset_peak_memory_stats`, ...): report 0 / `{}`
  (CUDA's allocator holds nothing) and resets do nothing, instead of failing; said once,
  pointing to `%singlecard watch` for the process memory. `memory_summary()` says the same in
  words. `mem_get_info()` reports the host's available and total memory (the device is the
  host).
- `torch.autocast("cuda", dtype)` and `torch.cuda.amp.autocast` (cpu_amp.py): autocast on the
  CPU with the same dtype (float16 when none is given, as on a GPU), instead of torch's "CUDA
  is not available, disabling".
- `torch.amp.GradScaler("cuda")` and `torch.cuda.amp.GradScaler` (cpu_amp.py): a CPU GradScaler
  that really scales, instead of a disabled one.
- `torch.cuda.Event(enable_timing=True)` (cpu_streams.py): records the CPU's clock, so
  `elapsed_time` times the work between two records (CPU work is done when its call returns;
  `synchronize`, `wait`, `query` have nothing to wait for). Streams (`Stream`,
  `current_stream`, `default_stream`, `with torch.cuda.stream(s)`, `wait_stream`,
  `record_event`) run in order on the CPU: nothing to wait for either.
- `get_rng_state` / `set_rng_state` (and `_all`), `initial_seed`, `seed` (cpu_random.py): the
  CPU generator's, as `manual_seed` above; a GPU's saved state (another size) is not forced
  into it, said once.
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

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..borrow import Borrowed
from ..notices import Notices
from . import cpu_amp, cpu_memory, cpu_random, cpu_streams
from .cuda_patch import patch_cuda


def under_cpu(device: torch.device) -> bool:
    """Whether `device`, the device single-card mode follows, is the CPU rather than a card:
    the wing's one answer (DDP and DataParallel then get no device ids, process groups use
    gloo, `.cuda()` means "the device"), so its modules cannot disagree on which case it is."""
    return device.type != "cuda"


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """Answer CUDA-minded calls for `device` (the CPU), owned by `owner`."""
    patch_cuda(owner, "synchronize", lambda original: _synchronize(notices))
    cpu_random.patch_seeds(owner, notices)
    cpu_memory.install(owner, notices)
    cpu_amp.install(owner, device, notices)
    cpu_streams.install(owner, notices)
    cpu_random.patch_rng_state(owner, notices)
    patch_cuda(owner, "current_device", lambda original: _current_device(notices))
    patch_cuda(owner, "get_device_name", lambda original: _device_name())
    patch_cuda(owner, "_lazy_init", _needs_a_gpu)


def _synchronize(notices: Notices) -> Callable:
    def synchronize(device: Any = None) -> None:
        notices.say("synchronize", "singlecard_nb: torch.cuda.synchronize() under `%singlecard "
                    "cpu` returns at once: CPU operations have finished when they return.")

    return synchronize


# --- the device itself ----------------------------------------------------------------------
def _current_device(notices: Notices) -> Callable:
    def current_device() -> int:
        notices.say("current_device", "singlecard_nb: torch.cuda.current_device() under "
                    "`%singlecard cpu` is 0, this session's one device, which is the CPU: "
                    "device references to it land on the CPU.")
        return 0

    return current_device


def _device_name() -> Callable:  # a new function each time: patch_cuda gives it torch's name
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
