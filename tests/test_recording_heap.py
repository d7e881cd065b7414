"""Inspection gives back the free memory a fragmented C heap holds (recording/heap.py): a loop
of large CPU tensors under `--inspect` took pytorch/examples' word_language_model to 24 GB."""

from __future__ import annotations

import pytest
from conftest import run_fresh_python

from singlecard_nb.inspection.recording.heap import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None,
                                reason="the heap read and trimmed is glibc's (2.33+)")

# The heap fragmented as the script's was: glibc's mmap threshold raised by one freed 30 MiB (it rises to at most 32)
# block, then 48 blocks of 8 MiB, written (resident), each followed by a smaller one (256 KiB) that
# stays, and the large ones freed: 384 MiB free in the heap, none of it given back, because
# each free block lies below a small one in use.
FRAGMENT = """
import ctypes, json, torch
from torch import nn
import singlecard_nb as scn
from singlecard_nb.inspection.recording import heap

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def resident_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024

libc.free(libc.malloc(30 << 20))
large, small = [], []
for _ in range(48):
    block = libc.malloc(8 << 20)
    ctypes.memset(block, 1, 8 << 20)
    large.append(block)
    small.append(libc.malloc(256 << 10))  # from the top of the heap, where no free chunk fits
for block in large:
    libc.free(block)
fragmented = resident_mb()
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
with scn.inspect(model):
    for _ in range(STEPS):
        model(torch.randn(4, 8))
print(json.dumps({"fragmented": fragmented, "after": resident_mb(), "trims": heap.HEAP.trims}))
"""


def test_a_heap_holding_hundreds_of_free_mb_is_given_back_within_8_recorded_steps():
    result, _ = run_fresh_python(FRAGMENT.replace("STEPS", "12"))
    assert result["trims"] >= 1, result
    # of the 384 MiB freed, more than half given back (the steps themselves reuse some of it)
    assert result["fragmented"] - result["after"] > 200, result


def test_a_heap_is_not_trimmed_before_the_8th_recorded_step():
    # read every 8 hand-offs: 5 steps are not enough, and the memory stays where it was
    result, _ = run_fresh_python(FRAGMENT.replace("STEPS", "5"))
    assert result["trims"] == 0 and result["fragmented"] - result["after"] < 100, result
