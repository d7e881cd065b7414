"""Importing, loading, listing GPUs, pinning and status must never start CUDA.

In a fresh process every CUDA-initialising torch entry point is replaced by a trap that records
the call (and raises), libcuda is replaced by a fake that records `cuInit`, and then the whole
user path runs. Any recorded call fails the test.
"""

from __future__ import annotations

from pathlib import Path

from conftest import run_fresh_python

ROOT = Path(__file__).parent.parent
FOUR_GPUS = Path(__file__).parent / "machines" / "four_gpus.json"

SCRIPT = r'''
import json, sys
import torch
import torch.cuda

calls = []

def trap(name):
    def called(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"test trap: {name} would start CUDA")
    return called

ENTRY_POINTS = [
    "is_available", "device_count", "init", "_lazy_init", "current_device", "set_device",
    "get_device_properties", "get_device_name", "get_device_capability", "mem_get_info",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "synchronize", "empty_cache",
    "current_stream", "default_stream", "device_memory_used", "get_device_uuid",
]
for name in ENTRY_POINTS:
    if hasattr(torch.cuda, name):
        setattr(torch.cuda, name, trap(f"torch.cuda.{name}"))
# torch's own modules hold their own reference to _lazy_init
for module_name, module in list(sys.modules.items()):
    if module_name.startswith("torch.cuda.") and hasattr(module, "_lazy_init"):
        module._lazy_init = trap(f"{module_name}._lazy_init")
for name in ("_cuda_getDeviceCount", "_cuda_init", "_cuda_setDevice", "_cuda_getDevice"):
    if hasattr(torch._C, name):
        setattr(torch._C, name, trap(f"torch._C.{name}"))


class FakeLibcuda:
    """A driver that was never started; records whether anyone starts it."""
    def __init__(self):
        self.calls = []
    def cuDeviceGetCount(self, pointer):
        self.calls.append("cuDeviceGetCount")
        return 3  # CUDA_ERROR_NOT_INITIALIZED
    def cuInit(self, flags):
        self.calls.append("cuInit")
        return 0

libcuda = FakeLibcuda()

import singlecard_nb
from singlecard_nb.pinning import driver
driver._load_libcuda = lambda: libcuda

from IPython.core.interactiveshell import InteractiveShell

singlecard_nb.gpus()._repr_html_()
repr(singlecard_nb.gpus())

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "singlecard_nb")  # SINGLECARD_NB_DEVICE=auto pins here
errors = []
for line in ["%singlecard list", "%singlecard status", "%singlecard 1", "%singlecard status",
             "%singlecard GPU-8a1b --default-device", "%singlecard MIG-5c3b", "%singlecard 3",
             "%singlecard auto --no-single-card", "%singlecard single-card on",
             "%singlecard single-card off", "%singlecard cpu", "%singlecard status",
             "%singlecard off", "%singlecard"]:
    result = ip.run_cell(line)
    if result.error_in_exec is not None:
        errors.append(f"{line}: {result.error_in_exec!r}")

state = singlecard_nb.pin(0)
singlecard_nb.device()
status = singlecard_nb.status()
repr(status); status._repr_html_()
singlecard_nb.release()
singlecard_nb.device()
ip.run_line_magic("unload_ext", "singlecard_nb")

result = {"calls": list(calls), "driver": list(libcuda.calls), "errors": errors,
          "mode": state.mode}
# The traps must be live, or this test proves nothing.
try:
    torch.cuda.is_available()
except RuntimeError:
    pass
result["trap_works"] = calls[-1:] == ["torch.cuda.is_available"]
print(json.dumps(result))
'''


def test_no_cuda_entry_point_is_called():
    out, printed = run_fresh_python(SCRIPT, SINGLECARD_NB_MACHINE=str(FOUR_GPUS),
                                    SINGLECARD_NB_DEVICE="auto")
    assert out["trap_works"]
    assert out["calls"] == [], f"CUDA-initialising calls: {out['calls']}"
    assert "cuInit" not in out["driver"] and "cuDeviceGetCount" in out["driver"]
    assert out["errors"] == []
    assert out["mode"] == "hard"
    assert "Pinned (hard): GPU 2" in printed  # SINGLECARD_NB_DEVICE=auto at load
