"""Has the CUDA driver been started in this process?

CUDA reads CUDA_VISIBLE_DEVICES once, in `cuInit`. After that, changing the variable hides
nothing, so pinning must know whether `cuInit` already ran. `torch.cuda.is_initialized()` is not
enough: `torch.cuda.is_available()` calls `cudaGetDeviceCount`, which runs `cuInit` while torch
still reports "not initialised". So we ask the driver itself: `cuDeviceGetCount` answers
CUDA_ERROR_NOT_INITIALIZED until `cuInit` has run, and the probe never calls `cuInit`.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4

_LIBCUDA_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


@dataclass(frozen=True)
class DriverState:
    started: bool
    how: str  # how we know, in words for the status display


def _torch_initialised() -> bool:
    # Never import torch (or torch.cuda) just to ask: only look if the user already has it.
    cuda = sys.modules.get("torch.cuda")
    return cuda is not None and bool(cuda.is_initialized())


def _load_libcuda() -> Any:
    for name in _LIBCUDA_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def probe_libcuda(lib: Any = None) -> DriverState:
    """Ask libcuda's `cuDeviceGetCount` (never `cuInit`). `lib` is injectable for tests."""
    lib = _load_libcuda() if lib is None else lib
    if lib is None:
        return DriverState(False, "libcuda cannot be loaded in this process (no NVIDIA driver "
                                  "library), so the CUDA driver cannot have been started")
    count = ctypes.c_int(0)
    code = lib.cuDeviceGetCount(ctypes.byref(count))
    if code == CUDA_ERROR_NOT_INITIALIZED:
        return DriverState(False, "cuDeviceGetCount says CUDA_ERROR_NOT_INITIALIZED: cuInit has "
                                  "not run in this process")
    if code == CUDA_SUCCESS:
        return DriverState(True, f"cuDeviceGetCount succeeds ({count.value} device(s) visible): "
                                 "cuInit has already run in this process")
    # Any other answer means cuInit ran (and perhaps failed or shut down); its visible-device
    # set is fixed either way, so treating it as started keeps us from claiming a hard pin.
    return DriverState(True, f"cuDeviceGetCount returned CUDA error {code}: cuInit has already "
                             "run in this process (and may have failed)")


def driver_state() -> DriverState:
    """Whether CUDA_VISIBLE_DEVICES can still take effect in this process."""
    if _torch_initialised():
        return DriverState(True, "torch.cuda.is_initialized() is True")
    return probe_libcuda()
