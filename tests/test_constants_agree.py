"""Constants the C kernel and the Python side must agree on, tied together.

`onepass.c` and `onepass_module.c` are compiled on the user's machine; they cannot import
Python's constants, so each is written twice. A change to one side alone fails here.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from singlecard_nb.inspection.kernel import native, reductions

KERNEL_DIR = Path(native.__file__).parent


def _define(source: str, name: str) -> float:
    """The value of `#define NAME value` in a C file (a number or a simple shift)."""
    text = (KERNEL_DIR / source).read_text()
    match = re.search(rf"^#define {name} (.+?)\s*(?:/\*.*)?$", text, re.MULTILINE)
    assert match is not None, f"no #define {name} in {source}"
    value = match[1].strip()
    shift = re.fullmatch(r"\(?(\d+)\s*<<\s*(\d+)\)?", value)
    return int(shift[1]) << int(shift[2]) if shift else float(value)


def test_the_cancellation_limit_is_the_same_in_c_and_python():
    assert _define("onepass.c", "CANCELLATION_LIMIT") == reductions.CANCELLATION_LIMIT


def test_the_gil_release_size_is_the_same_for_both_builds():
    # the extension module and the ctypes build release the GIL from the same size on
    assert _define("onepass_module.c", "GIL_RELEASE_NUMEL") == native.GIL_RELEASE_NUMEL


def test_the_kernel_writes_the_raw_row_in_the_order_python_reads_it():
    if not native.wait(timeout=180):
        pytest.skip(f"the one-pass kernel could not be built here: {native.status()}")
    x = torch.tensor([0.0, 0.0, 1.0, 2.0, 5.0])
    out = (ctypes.c_double * len(reductions.RAW))()
    native.kernels()[torch.float32](x.data_ptr(), x.numel(), False, ctypes.addressof(out))
    row = dict(zip(reductions.RAW, out))
    mean = float(x.mean())
    # the kernel's documented row: the shift is the mean, so s1 (sum of x - shift) is 0
    assert row["min"] == 0.0 and row["max"] == 5.0
    assert row["shift"] == pytest.approx(mean) and row["s1"] == pytest.approx(0.0, abs=1e-6)
    assert row["s2"] == pytest.approx(float(((x - mean) ** 2).sum()))
    assert (row["nan"], row["inf"], row["nonzero"]) == (0.0, 0.0, 3.0)
    got = dict(zip(reductions.VALUES, reductions.finish(np.array([list(out)]), np.array([5.0]))[0]))
    assert got["std"] == pytest.approx(float(x.std()))
    assert got["zeros"] == pytest.approx(0.4)
