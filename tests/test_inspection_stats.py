"""Statistics: the one-pass kernel and the torch path agree with float64 references, the
precision cases of issue 9 hold, and the kernel is built in the background, never waited for."""

from __future__ import annotations

import math
import textwrap
import threading

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_fresh_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native, readable, reductions, stats
from singlecard_nb.inspection.kernel.reductions import RAW, VALUES, DeviceRows, finish


@pytest.fixture(scope="module")
def kernels():
    if not native.wait(120):
        pytest.skip(f"no one-pass kernel here: {native.status()}")
    return native.kernels()


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    """Run a test once with the kernel built and once with torch reductions only."""
    if request.param == "kernel":
        request.getfixturevalue("kernels")
    else:
        monkeypatch.setattr(native, "kernels", lambda: {})
    return request.param


def reference(x: torch.Tensor) -> list[float]:
    """VALUES in float64 with torch, the slow and obvious way."""
    d = x.detach().double().reshape(-1)
    nan, inf = int(torch.isnan(d).sum()), int(torch.isinf(d).sum())
    lo, hi = (math.nan, math.nan) if nan else (d.min().item(), d.max().item())
    std = d.std().item() if d.numel() > 1 and nan + inf == 0 else math.nan
    return [d.mean().item(), std, lo, hi, max(abs(lo), abs(hi)), nan, inf,
            float((d == 0).sum()) / d.numel()]


def taken(x: torch.Tensor, **kwargs) -> list[float]:
    """VALUES as the engine records them for `x` (one StepStats, one slot)."""
    step = stats.StepStats(**kwargs)
    slot = step.add(x, tuple(x.shape))
    return step.table([slot])[0].tolist()


def assert_close(got: list[float], want: list[float], rel: float = 1e-6) -> None:
    names = VALUES
    for name, g, w in zip(names, got, want):
        if math.isnan(w):
            assert math.isnan(g), f"{name}: {g} instead of NaN"
        elif name in ("min", "max", "absmax", "nan", "inf", "zeros"):
            assert g == w, f"{name}: {g} instead of exactly {w}"
        else:
            assert g == pytest.approx(w, rel=rel, abs=1e-12), f"{name}: {g} instead of {w}"


def values(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(n, dtype=torch.float64) * 3 + 0.5
    x[3::7] = 0.0
    x[5::11] = -0.0  # a zero too
    return x.to(dtype)


SIZES = [1, 31, 4097, stats.SMALL_NUMEL + 1, 100_003, 300_001]  # 300_001: split over threads


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_statistics_equal_float64_references(path, n, dtype):
    x = values(n, dtype)
    # half types: the reference sums the same rounded values in float64
    assert_close(taken(x), reference(x), rel=1e-5)


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "sliced", "expanded"])
def test_any_memory_layout(path, layout):
    torch.manual_seed(3)
    base = torch.randn(4, 8, 40, 40)
    x = {"channels_last": base.to(memory_format=torch.channels_last),
         "transposed": base.transpose(1, 3),
         "sliced": base[:, :, ::2],
         "expanded": base[:1].expand(4, -1, -1, -1)}[layout]
    assert readable.one_block(x) == (layout in ("channels_last", "transposed"))
    assert_close(taken(x), reference(x), rel=1e-5)


@pytest.mark.parametrize("n", [100, 100_003])
def test_nan_and_inf_are_counted_on_both_paths(path, n):
    x = values(n, torch.float32)
    x[5], x[9], x[n - 1] = math.nan, math.inf, -math.inf
    got = taken(x)
    assert got[5:7] == [1, 2] and math.isnan(got[0]) and math.isnan(got[1])
    assert math.isnan(got[2]) and math.isnan(got[3])  # torch's min/max with a NaN inside
    y = values(n, torch.float32)
    y[3] = math.inf
    got = taken(y)
    assert got[5:7] == [0, 1] and got[3] == math.inf and got[0] == math.inf


# --- issue 9: std that overflowed, cancelled, or was not 0 for a constant ---------------------
def frame_row(x: torch.Tensor, **kwargs):
    model = nn.Sequential(nn.Identity())
    with scn.inspect(model, **kwargs) as insp:
        model(x)
    return insp.frame().query("module == '0' and io == 'output'").iloc[0]


@pytest.mark.parametrize("trap", [False, True])
@pytest.mark.parametrize("n", [1000, 100_000])
def test_std_of_float32_values_near_1e20_is_finite_and_right(path, n, trap):
    torch.manual_seed(0)
    x = torch.randn(n) * 1e20
    row = frame_row(x, trap=trap)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-5)
    assert row["mean"] == pytest.approx(x.double().mean().item(), rel=1e-4)


@pytest.mark.parametrize("n", [1000, 100_000])
def test_std_of_tiny_values_does_not_underflow(path, n):
    torch.manual_seed(0)
    x = torch.randn(n) * 1e-25  # vanishing gradients: squares below float32's range
    row = frame_row(x)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-5, abs=0)


@pytest.mark.parametrize("n", [1000, 100_000])
def test_std_of_bfloat16_with_mean_far_above_std(path, n):
    torch.manual_seed(0)
    x = (torch.randn(n) + 100).bfloat16()
    row = frame_row(x)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-4)


@pytest.mark.parametrize("mean", [1e3, 1e4, 1e6])
@pytest.mark.parametrize("n", [5000, 100_000, 300_000])
def test_std_when_the_mean_is_far_above_the_std(path, n, mean):
    torch.manual_seed(1)
    x = torch.randn(n) + mean
    row = frame_row(x)
    assert row["std"] == pytest.approx(x.double().std().item(), rel=1e-4)
    assert row["mean"] == pytest.approx(x.double().mean().item(), rel=1e-6)


@pytest.mark.parametrize("trap", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1000, 16384, 100_000])
def test_constant_tensors_have_zero_std_and_their_value_as_mean(path, n, dtype, trap):
    x = torch.full((n,), 7.1, dtype=dtype)
    row = frame_row(x, trap=trap)
    assert row["std"] == 0.0
    assert row["mean"] == x[0].item()


def test_exact_std_agrees_with_the_two_pass_formula(path):
    torch.manual_seed(2)
    x = torch.randn(200_000) * 0.01 + 3
    got = taken(x, exact_std=True)
    assert got[1] == pytest.approx(x.double().std().item(), rel=1e-6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                               st.sampled_from([0.0, -0.0, 1.0, -1.0])),
                     min_size=1, max_size=600),
       repeat=st.integers(1, 60))
def test_both_paths_agree_with_float64_on_random_values(kernels, data, repeat):
    x = torch.tensor(data * repeat, dtype=torch.float32)
    want = reference(x)
    for got in (taken(x), taken(x, kernels={})):
        for name, g, w in zip(VALUES, got, want):
            if math.isnan(w):
                assert math.isnan(g), name
            else:
                spread = 1e-6 * (abs(want[0]) + abs(want[1]))  # float32 sums' resolution
                assert g == pytest.approx(w, rel=1e-4, abs=spread), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [5, 17, 4097, 70_001])
def test_min_max_and_zeros_are_exact_on_subnormals_and_signed_zeros(path, dtype, n):
    # the kernel compares values as read (float lanes) and counts zeros in integers: the
    # extremes and the count must be torch's exactly, tails of a lane group and of a block too
    torch.manual_seed(n)
    tiny = torch.finfo(dtype).smallest_normal
    x = ((torch.rand(n) - 0.5) * tiny).to(dtype)  # subnormal, within +-tiny / 2
    x[::7] = 0.0
    x[3::7] = -0.0
    x[n // 2] = -3 * tiny / 4  # the smallest value, a subnormal, mid-block
    x[-1] = tiny / 3  # the largest, in the tail no full lane group reads
    got = dict(zip(VALUES, taken(x)))
    assert got["min"] == x.min().item() == x[n // 2].item() < 0
    assert got["max"] == x.max().item()
    assert got["absmax"] == x.abs().max().item()
    assert got["zeros"] == float((x == 0).sum()) / n


def test_kernel_is_safe_from_several_threads(kernels):
    # sizes on both sides of GIL_RELEASE_NUMEL: calls that keep the GIL and calls that drop it
    tensors = [values(60_000 + 2_000 * i, torch.float32, seed=i) for i in range(8)]
    wanted = [reference(x) for x in tensors]
    failures = []

    def work(i):
        for _ in range(20):
            got = taken(tensors[i])
            try:
                assert_close(got, wanted[i], rel=1e-5)
            except AssertionError as e:
                failures.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_finish_turns_raw_rows_into_values():
    raw = np.array([[1.0, 5.0, 3.0, 0.0, 8.0, 0, 0, 3],  # mean 3, centred squares 8 over n=3
                    [2.0, 2.0, 1.9, 0.3, 0.01, 0, 0, 4]])  # constant: exactly 2 and 0
    got = finish(raw, np.array([3, 4]))
    assert got[0].tolist() == [3.0, 2.0, 1.0, 5.0, 5.0, 0.0, 0.0, 0.0]
    assert got[1].tolist() == [2.0, 0.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0]


def device_row(x: torch.Tensor, exact_std: bool = False) -> torch.Tensor:
    """RAW of `x` read alone by the accelerator path (run here on the CPU: the same
    operations)."""
    rows = DeviceRows(exact_std, torch.zeros((), dtype=torch.float64))
    rows.add(x, x.numel(), 0)
    return rows.table()[1][0]


def test_accelerator_formulas_agree_with_the_cpu_path():
    # The GPU path (all counts on the device, float64 sums) runs here on CPU tensors: same values.
    torch.manual_seed(5)
    x = torch.randn(300, 500) * 4 - 1
    x[:3] = 0.0
    x[5, 5] = math.nan
    x[6, 6] = math.inf
    n = np.array([x.numel()])

    def values(raw):
        return finish(np.array([raw], dtype=np.float64), n)[0].tolist()

    on_device = values(device_row(x).tolist())
    on_cpu = values(reductions.reduce_cpu(x, x.numel(), exact_std=False))
    finite = x[torch.isfinite(x)].double()
    assert on_device[5:7] == [1.0, 1.0] and on_cpu[5:7] == [1, 1]
    assert on_device[7] == pytest.approx(on_cpu[7]) == pytest.approx(1500 / x.numel())
    clean = torch.where(torch.isfinite(x), x, torch.zeros(()))
    for exact_std in (False, True):
        on_device = values(device_row(clean, exact_std).tolist())
        assert on_device[0] == pytest.approx(clean.double().mean().item(), rel=1e-9)
        assert on_device[1] == pytest.approx(clean.double().std().item(), rel=1e-9)
        assert on_device[2:5] == [finite.min().item(), finite.max().item(),
                                  finite.abs().max().item()]


@pytest.mark.parametrize("exact_std", [False, True])
def test_a_steps_accelerator_rows_are_made_together_each_its_own_tensors(exact_std):
    # A step's rows on a device are made at its end, all at once: each must still be the row of
    # its own tensor, in the order of its slot, whatever the dtypes (stacked together), with
    # the staged small tensors' table after them.
    torch.manual_seed(1)
    tensors = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = (torch.randn(20_001, dtype=torch.float64) * 3 + 0.5).to(dtype)
        x[::7] = 0
        broken = x.clone()
        broken[3], broken[4] = math.nan, -math.inf
        tensors += [x, broken, torch.full((5,), 2.5, dtype=dtype)]
    rows = DeviceRows(exact_std, torch.zeros((), dtype=torch.float64))
    slots = [3 * i + 10 for i in range(len(tensors))]
    for slot, x in zip(slots, tensors):
        rows.add(x, x.numel(), slot)
    small = torch.randn(2, 16)
    rows.tables.append(([0, 1], reductions.reduce_rows(small)))
    got_slots, table = rows.table()
    assert got_slots == [*slots, 0, 1]
    want = torch.stack([device_row(x, exact_std) for x in tensors]
                       + list(reductions.reduce_rows(small)))
    assert table.dtype == torch.float64 and table.shape == (len(tensors) + 2, len(RAW))
    # the same to the bit (NaN where NaN)
    assert ((table.view(torch.int64) == want.view(torch.int64)) | (table.isnan() & want.isnan())
            ).all()


def test_an_accelerator_read_stopped_by_ctrl_c_leaves_the_steps_other_rows(monkeypatch):
    # Ctrl-C lands inside a module's hook: that output has no row, and every other row of the
    # step is still its own tensor's (a read half kept would shift or break them all)
    x0, x1, x2 = (torch.randn(20_000) + i for i in range(3))
    rows = DeviceRows(False, torch.zeros((), dtype=torch.float64))
    rows.add(x0, x0.numel(), 0)
    norm = torch.linalg.vector_norm

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.linalg, "vector_norm", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rows.add(x1, x1.numel(), 1)
    monkeypatch.setattr(torch.linalg, "vector_norm", norm)
    rows.add(x2, x2.numel(), 2)
    slots, table = rows.table()
    assert slots == [0, 2]
    assert torch.equal(table, torch.stack([device_row(x0), device_row(x2)]))


def test_reading_an_accelerator_tensor_launches_eight_operations_and_its_step_a_few():
    # Each torch operation but a view is a kernel launch, microseconds of the CPU's time on a
    # GPU whatever the tensor's size: this is what a module call with a large output costs
    # there. The "meta" device dispatches what a GPU would, without one. Rows made one by one
    # took 15.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counted(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view  # a view (detach) launches no kernel
            return func(*args, **(kwargs or {}))

    outputs = [torch.empty(8, 64, 128, device="meta") for _ in range(50)]
    with Counted() as counted:
        step = stats.StepStats(kernels={})
        for x in outputs:
            step.add(x, tuple(x.shape))
        with pytest.raises(NotImplementedError):  # meta: the one transfer has no data to move
            step.collect()
    assert counted.ops <= 8 * len(outputs) + 16, counted.ops  # and a few for the step's table


def test_a_step_never_shows_an_earlier_steps_statistics(kernels):
    """Each step's kernel writes its RAW rows where a step two before wrote its own (the
    recorder hands the chunk on): a tensor without statistics (an empty one) reads NaN in its
    step, never the values an earlier step left in that row."""
    model = nn.Sequential(nn.Identity())
    batches = [torch.full((4, 4), 3.0), torch.full((4, 4), 5.0), torch.empty(0, 4),
               torch.empty(0, 4), torch.full((4, 4), 7.0)]
    with scn.inspect(model) as insp:
        for x in batches:
            model(x)
    frame = insp.frame()
    means = frame[frame["io"] == "output"].groupby("step")["mean"].apply(list).to_dict()
    assert {step: [v if v == v else None for v in values] for step, values in means.items()} \
        == {0: [3.0, 3.0], 1: [5.0, 5.0], 2: [None, None], 3: [None, None], 4: [7.0, 7.0]}

# --- the build: in the background, said once when it fails, off on request ---------------------
LARGE_STEPS = textwrap.dedent("""
    import json, time, warnings, torch
    from torch import nn
    import singlecard_nb as scn
    from singlecard_nb.inspection.kernel import native
    torch.manual_seed(0)
    x = torch.randn(64, 4096) * 2 + 1
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with scn.inspect(model) as insp:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                model(x)
                insp.step()
                times.append(time.perf_counter() - start)
            building = native.status()
            ready = native.wait(120)
            model(x)
    frame = insp.frame()
    row = frame.query("module == '1'").iloc[-1]
    y = model(x).detach().double()
    print(json.dumps({"times": times, "building": building, "ready": ready,
                      "status": native.status(), "rows": len(frame),
                      "singlecard_status": repr(scn.status()),
                      "warnings": [str(w.message) for w in caught],
                      "std_error": abs(row["std"] - y.std().item()) / y.std().item(),
                      "threads": [t.name for t in __import__("threading").enumerate()]}))
""")


def test_the_kernel_is_an_extension_module_where_python_headers_are(kernels):
    if native._python_headers() is None:
        pytest.skip("this Python has no headers (Python.h): the kernel loads through ctypes")
    # a C function of our module: a call costs ~0.1 us, against ~0.5 us through ctypes
    assert type(kernels[torch.float32]).__name__ == "builtin_function_or_method"


@pytest.mark.slow
def test_without_python_headers_the_kernel_loads_through_ctypes(kernels, monkeypatch):
    monkeypatch.setattr(native, "_python_headers", lambda: None)
    through_ctypes, differences = native._build()
    assert set(through_ctypes) == set(kernels)
    assert type(through_ctypes[torch.float32]).__name__ == "function"  # the ctypes wrapper
    for dtype in kernels:
        for n in (5, 4097, 100_003):  # both sides of GIL_RELEASE_NUMEL
            x = values(n, dtype, seed=n)
            assert taken(x, kernels=through_ctypes) == taken(x, kernels=kernels)
    assert set(differences) == set(native.differences()) == {torch.float32}
    for n in (5, 4097, 100_003):
        a, b = values(n, torch.float32, seed=n), values(n, torch.float32, seed=n + 1)
        assert (difference_taken(a, b, through_ctypes, differences[torch.float32])
                == difference_taken(a, b, kernels, native.differences()[torch.float32]))


def difference_taken(a: torch.Tensor, b: torch.Tensor, kernels, difference) -> list[float]:
    """VALUES of a - b as the difference kernel reads it, without torch making a - b."""
    step = stats.StepStats(kernels=kernels)
    slot = step.add_difference(a, b.data_ptr(), a.numel(), difference)
    return step.table([slot])[0].tolist()


@pytest.mark.parametrize("n", SIZES)
def test_the_difference_kernel_reads_a_minus_b_as_torch_makes_it_to_the_bit(kernels, n):
    # a parameter's update since its copy (params=True's "update" row), with the values that
    # make subtraction interesting: zeros of both signs, equal values (a zero difference),
    # denormals, NaN and Inf, at every size the kernel treats its own way
    a, b = values(n, torch.float32, seed=n), values(n, torch.float32, seed=n + 1)
    b[::3] = a[::3]
    a[2::13] = 1e-41
    b[4::17] = -1e-41
    for special in ([], [float("inf")], [float("nan")]):
        if special and n > 7:
            a[7] = special[0]
        difference = native.differences()[torch.float32]
        by_kernel = difference_taken(a, b, kernels, difference)
        by_torch = taken(a - b, kernels=kernels)
        assert str(by_kernel) == str(by_torch)  # to the bit, NaN included


@pytest.mark.slow
def test_first_steps_run_while_the_kernel_builds(tmp_path):
    slow_cc = tmp_path / "slow-cc"
    slow_cc.write_text("#!/bin/sh\nsleep 4\nexec cc \"$@\"\n")
    slow_cc.chmod(0o755)
    out, _ = run_fresh_python(LARGE_STEPS, CC=str(slow_cc))
    assert "building" in out["building"]  # three steps done, the compiler still busy
    assert max(out["times"]) < 3.5, out["times"]  # none waited for the 4 s compiler
    assert out["ready"] and "one-pass kernel for" in out["status"]
    assert out["rows"] == 4 * 4 and out["std_error"] < 1e-5 and not out["warnings"]


@pytest.mark.slow
def test_a_failed_build_falls_back_to_torch_and_says_so_once():
    out, _ = run_fresh_python(LARGE_STEPS, CC="false")  # a "compiler" that always fails
    assert not out["ready"]
    said = [w for w in out["warnings"] if "could not be built" in w]
    assert len(said) == 1, out["warnings"]
    assert "torch reductions" in said[0] and "CC" in said[0]
    assert out["std_error"] < 1e-5 and out["rows"] == 4 * 4
    # and `%singlecard status` keeps saying it, after the one warning
    status_line = next(line for line in out["singlecard_status"].splitlines()
                       if line.strip().startswith("statistics"))
    assert "could not be built" in status_line


@pytest.mark.slow
def test_the_kernel_can_be_turned_off():
    out, _ = run_fresh_python(LARGE_STEPS, SINGLECARD_NB_NATIVE="0")
    assert not out["ready"] and "off" in out["status"] and not out["warnings"]
    assert "singlecard_nb-native" not in out["threads"]
    assert out["std_error"] < 1e-5


def test_params_rows_are_the_same_to_the_bit_through_the_difference_kernel(kernels, monkeypatch):
    # record_parameter reads a float32 parameter's three rows in one go, Δw without torch
    # making it; every parameter the common case leaves out (float64, not contiguous, a large
    # one whose gradient dedupe may have read, one an lr of 0 leaves as it was, one without a
    # gradient) takes the general path: the frames must be equal either way
    from singlecard_nb.inspection.recording import recorder

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 300), nn.LayerNorm(300), nn.Linear(300, 80))
            self.body[0].weight = nn.Parameter(torch.randn(300, 16).t().contiguous().t())
            self.head = nn.Linear(80, 4).double()
            self.unused = nn.Parameter(torch.ones(3))  # never a gradient

        def forward(self, x):
            return self.head(self.body(x).double())

    def run(common_case: bool):
        torch.manual_seed(0)
        model = Mixed()
        still = [model.body[1].weight]  # lr 0: an update of zeros
        rest = [p for p in model.parameters() if p is not still[0]]
        opt = torch.optim.AdamW([{"params": rest}, {"params": still, "lr": 0.0}], lr=1e-2)
        if not common_case:
            monkeypatch.setattr(recorder.Recorder, "record_parameter", lambda *a: False)
        with scn.inspect(model, grads=True, params=True) as insp:
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(8, 16)).square().mean().backward()
                opt.step()
        monkeypatch.undo()
        return insp.frame()

    taken_together = []
    rows_of = recorder.Recorder._parameter_rows
    monkeypatch.setattr(recorder.Recorder, "_parameter_rows",
                        lambda *a: taken_together.append(rows_of(*a)) or taken_together[-1])
    together = run(common_case=True)
    # a step: the first bias, LayerNorm's two, Linear(300, 80)'s two, the unused one together;
    # the strided weight and the float64 pair apart
    assert (taken_together.count(True), taken_together.count(False)) == (3 * 6, 3 * 3)
    apart = run(common_case=False)
    assert set(together["io"]) >= {"param", "step_grad", "update"}
    pd.testing.assert_frame_equal(together, apart, check_exact=True)


def test_a_parameter_resized_during_the_optimisers_step_is_said_and_its_copy_not_overread(
        kernels):
    # the copy from before the step has the old size: reading the new one's Δw against it
    # would read past the copy's end
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

    class Growing(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            with torch.no_grad():
                model[0].weight.data = torch.randn(64, 64)

    opt = Growing(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="replaced by a tensor of another size"), \
            scn.inspect(model, grads=True, params=True) as insp:
        opt.zero_grad()
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    updates = insp.frame().query("io == 'update'")
    assert sorted(updates["index"] + "@" + updates["module"]) == ["bias@0", "bias@1", "weight@1"]
