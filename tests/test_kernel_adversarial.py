"""Tensors chosen to break the one-read kernel: it must read every value, honour torch's lazy
negation, and never read memory a tensor does not have."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native
from singlecard_nb.inspection.kernel.stats import StepStats

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def kernels():
    if not native.wait(timeout=180):
        pytest.skip(f"the one-pass kernel could not be built here: {native.status()}")
    return native.kernels()


def _values(t: torch.Tensor, kernels) -> dict[str, float]:
    stats = StepStats(kernels=kernels)
    slot = stats.add(t, tuple(t.shape), immediate=True)
    return dict(zip(("mean", "std", "min", "max", "absmax", "nan", "inf", "zeros"),
                    stats.table([slot])[0]))


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_a_nan_in_the_last_value_of_a_split_tensor_is_seen(kernels, threads):
    # n // threads a multiple of the kernel's 4096-value block, n % threads left over: the
    # split over the OpenMP team once dropped those last values (and the NaN with them)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = threads * 4096 * 64 + 1
        x = torch.zeros(n)
        x[-1] = float("nan")
        assert _values(x, kernels)["nan"] == 1
        x[-1] = 7.0
        got = _values(x, kernels)
        assert got["max"] == 7.0 and got["zeros"] == pytest.approx((n - 1) / n)
    finally:
        torch.set_num_threads(before)


def test_the_trap_fires_on_a_nan_in_the_last_value(kernels):
    n = 2 * 4096 * 64 + 1
    x = torch.zeros(n)
    x[-1] = float("nan")
    with pytest.raises(scn.NonFiniteError), scn.inspect(nn.Identity(), trap=True) as insp:
        insp.model(x)


def test_a_lazily_negated_view_has_its_true_sign(kernels):
    x = torch.arange(1.0, 20001.0)
    negated = torch._neg_view(x)  # contiguous, negative bit set: memory holds +x
    assert negated.is_neg() and negated.is_contiguous()
    got = _values(negated, kernels)
    assert (got["min"], got["max"]) == (-20000.0, -1.0)
    assert got["mean"] == pytest.approx(-10000.5)


def test_the_imaginary_part_of_a_conjugate_has_its_true_sign(kernels):
    z = torch.complex(torch.zeros(30000), torch.arange(1.0, 30001.0))
    imag = z.conj().imag  # what a user's module may return
    got = _values(imag, kernels)
    assert (got["min"], got["max"]) == (-30000.0, -1.0)


def test_a_zero_tensor_output_is_recorded_without_reading_memory():
    # A ZeroTensor (data_ptr() == 0) once made the kernel read address 0 and killed the
    # process; run it in a child so a crash fails this test instead of the suite.
    code = (
        "import torch, warnings\n"
        "from torch import nn\n"
        "import singlecard_nb as scn\n"
        "from singlecard_nb.inspection.kernel import native\n"
        "assert native.wait(180), native.status()\n"
        "class Zeros(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch._efficientzerotensor(x.shape)\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    with scn.inspect(Zeros(), trap=True) as insp:\n"
        "        insp.model(torch.ones(50000))\n"
        "row = insp.frame().iloc[-1]\n"
        "print(row['min'], row['max'], row['zeros'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0.0", "0.0", "1.0"]


def _precision_cases():
    g = torch.Generator().manual_seed(0)
    return {
        "1e8 values, mean 1": 1 + 0.01 * torch.randn(100_000_000, generator=g),
        "a strided half of 8e6 values": (torch.randn(16_000_000, generator=g) + 3)[::2],
        "values of +-9e17": torch.tensor([9e17, -9e17] * 50_000),
        "a transposed 300x300 of 1e-20": (torch.rand(300, 300, generator=g) * 1e-20).t(),
    }


@pytest.mark.slow
@pytest.mark.parametrize("path", ["torch", "kernel"])
def test_both_paths_meet_the_stated_precision(kernels, path):
    # The README's promise: std within 1e-4 relative, mean within 1e-5 of the spread
    for name, t in _precision_cases().items():
        got = _values(t, {} if path == "torch" else kernels)
        exact = t.double()
        std, mean = exact.std().item(), exact.mean().item()
        assert got["std"] == pytest.approx(std, rel=1e-4), name
        assert abs(got["mean"] - mean) <= 1e-5 * std, name
        assert (got["min"], got["max"]) == (exact.min().item(), exact.max().item()), name


@pytest.mark.parametrize("path", ["torch", "kernel"])
@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e300, 1e-300])
@pytest.mark.parametrize("n", [100, 100_000])
def test_float64_beyond_the_range_of_squares_has_its_true_std(kernels, path, scale, n):
    # squares of 1e200 overflow float64 and those of 1e-200 vanish: std was NaN or 0
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, dtype=torch.float64, generator=g) * scale
    got = _values(x, {} if path == "torch" else kernels)
    scaled = x / scale  # exact: a power of ten is not, but the reference only needs 1e-12
    assert got["std"] == pytest.approx((scaled.std() * scale).item(), rel=1e-9)
    assert got["mean"] == pytest.approx((scaled.mean() * scale).item(), rel=1e-9, abs=scale * 1e-9)
    assert (got["min"], got["max"]) == (x.min().item(), x.max().item())
    assert got["zeros"] == 0.0 and got["nan"] == 0 and got["inf"] == 0


def test_float64_beyond_the_range_of_squares_in_a_deferred_step(kernels):
    # not read at once: the row is finished with the step, by table()
    x = torch.randn(64, dtype=torch.float64) * 1e250
    stats = StepStats(kernels=kernels)
    slot = stats.add(x, tuple(x.shape))
    got = dict(zip(("mean", "std"), stats.table([slot])[0][:2]))
    assert got["std"] == pytest.approx(((x / 1e250).std() * 1e250).item(), rel=1e-9)
