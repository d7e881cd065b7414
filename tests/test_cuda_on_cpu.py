"""`%singlecard cpu`: the CUDA calls of CUDA-minded scripts get a one-GPU machine's answers."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from parallel_support import clean_state  # noqa: F401 - used by every test (pytestmark)
from torch import nn

from singlecard_nb.parallel import single_card as parallel

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()

pytestmark = [pytest.mark.usefixtures("clean_state"),
              pytest.mark.filterwarnings("ignore:singlecard_nb. :UserWarning")]


def test_synchronize_returns_and_says_why_once():
    if not HAS_CUDA:
        with pytest.raises((AssertionError, RuntimeError)):  # torch: not compiled with CUDA
            torch.cuda.synchronize()
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match="synchronize.*nothing|returns at once"):
        torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.cuda.synchronize(0)


def test_cuda_seeds_seed_the_generator_that_draws_the_gpu_tensors():
    parallel.enable(CPU)
    draws = []
    for seed_call in (torch.cuda.manual_seed, torch.cuda.manual_seed_all):
        seed_call(7)
        draws.append(torch.randn(3, device="cuda"))
    assert torch.equal(draws[0], draws[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.manual_seed calls manual_seed_all itself: quiet
        torch.manual_seed(1)
    (seeds,) = [n for n in parallel.report()["notices"] if "seeds the CPU generator" in n]
    assert seeds.startswith("torch.cuda.manual_seed(7)") and seeds.endswith("(×2)")


def test_memory_counters_read_zero_resets_do_nothing_and_it_is_said():
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match="singlecard watch on"):
        assert torch.cuda.memory_allocated() == 0
    assert torch.cuda.max_memory_allocated(0) == torch.cuda.memory_reserved() == 0
    assert torch.cuda.max_memory_reserved() == 0 and torch.cuda.memory_stats() == {}
    torch.cuda.reset_peak_memory_stats()  # natively: AttributeError on a CPU-only torch
    torch.cuda.reset_max_memory_allocated()
    assert "singlecard cpu" in torch.cuda.memory_summary()
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    (memory,) = [n for n in parallel.report()["notices"] if "CUDA's allocator" in n]
    assert memory.endswith("(×8)")  # every counter call above, said once


def _float16_notices(record) -> list[str]:
    return [str(w.message) for w in record if "slow" in str(w.message)]


def test_cpu_float16_is_said_slow_once_with_the_factor_and_what_to_pass():
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=torch.bfloat16):  # fast on the CPU: nothing said
            model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
        model.to(torch.float32)
        assert _float16_notices(record) == []
        with torch.autocast("cuda", dtype=torch.float16):  # nanoGPT's train.py on a GPU
            model(x)
        with torch.autocast("cuda"):  # float16 too: a GPU's default
            model(x)
        copy.deepcopy(model).half()
        copy.deepcopy(model).to(dtype=torch.float16)
    said = _float16_notices(record)
    assert len(said) == 1, said
    assert "x slower than in float32" in said[0] and "--dtype=float32" in said[0]
    assert "bfloat16" in said[0] and "autocast('cuda', torch.float16)" in said[0]
    assert record[[str(w.message) for w in record].index(said[0])].filename == __file__


def test_module_half_under_cpu_is_said_slow():
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match=r"Linear.half\(\) computes in float16 .* slower"):
        nn.Linear(2, 2).half()


def test_autocast_cuda_runs_as_cpu_autocast_with_the_same_dtype():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    if not HAS_CUDA:
        with pytest.warns(UserWarning, match="Disabling"), torch.autocast("cuda"):
            assert (x @ w).dtype == torch.float32  # torch alone: silently full precision
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match=r"autocast\('cuda', torch.float16\).*autocast\('cpu'"):
        with torch.autocast("cuda"):
            assert (x @ w).dtype == torch.float16  # a GPU's default autocast dtype
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert (x @ w).dtype == torch.bfloat16
    with pytest.warns(FutureWarning), torch.cuda.amp.autocast():  # the deprecated spelling
        assert (x @ w).dtype == torch.float16
    with torch.autocast("cuda", enabled=False):
        assert (x @ w).dtype == torch.float32
    assert (x @ w).dtype == torch.float32


def test_grad_scaler_cuda_scales_on_the_cpu():
    if not HAS_CUDA:
        with pytest.warns(UserWarning, match="Disabling"):
            assert torch.amp.GradScaler("cuda").is_enabled() is False
    parallel.enable(CPU)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    bare = copy.deepcopy(model)
    opt, bare_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, bare))
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    x = torch.randn(8, 3)
    scaled = scaler.scale(model(x).pow(2).mean())
    scaled.backward()
    assert scaled.item() == pytest.approx(bare(x).pow(2).mean().item() * 1024.0, rel=1e-5)
    scaler.step(opt)
    scaler.update()
    bare(x).pow(2).mean().backward()
    bare_opt.step()
    torch.testing.assert_close(model.weight, bare.weight)  # unscaled before the step
    with pytest.warns(FutureWarning):
        assert torch.cuda.amp.GradScaler().is_enabled()


def test_availability_stays_truthful_so_libraries_take_their_cpu_path():
    parallel.enable(CPU)
    assert torch.cuda.is_available() is HAS_CUDA
    if not HAS_CUDA:
        assert torch.cuda.device_count() == 0
    torch.backends.cudnn.benchmark = True  # accepted; there is no cuDNN on the CPU
    torch.backends.cudnn.benchmark = False


def test_cuda_events_time_cpu_work_and_streams_have_nothing_to_wait_for():
    """The timing idiom of training scripts: events around a step, a side stream, a sync."""
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match="Event.*CPU's clock"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    assert isinstance(start, torch.cuda.Event)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    start.record()
    with torch.cuda.stream(side):
        x = torch.randn(256, 256, device="cuda")
        for _ in range(20):
            x = x @ x.T / 256
    torch.cuda.current_stream().wait_stream(side)
    done = side.record_event()
    end.record()
    end.synchronize()
    assert done.query() and torch.cuda.default_stream().query()
    assert 0 < start.elapsed_time(end) < 10_000  # milliseconds, of real CPU work
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.cuda.Event().elapsed_time(end)
    kinds = " ".join(parallel.report()["notices"])
    assert "CPU's clock" in kinds and "CPU's one stream" in kinds


def test_cuda_random_state_round_trips_through_the_cpu_generator():
    parallel.enable(CPU)
    state = torch.cuda.get_rng_state()
    first = torch.randn(5, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.randn(5, device="cuda"), first)
    torch.cuda.set_rng_state_all(torch.cuda.get_rng_state_all())  # a checkpoint's "all" form
    gpu_state = torch.zeros(16, dtype=torch.uint8)  # what a GPU's generator state looks like
    before = torch.get_rng_state()
    with pytest.warns(UserWarning, match="GPU generator's state.*left as it was"):
        torch.cuda.set_rng_state(gpu_state)
    assert torch.equal(torch.get_rng_state(), before)


def test_current_device_is_the_cpu_and_calls_that_need_a_gpu_say_what_to_change():
    parallel.enable(CPU)
    device = torch.cuda.current_device()
    assert device == 0 and torch.randn(2).to(device).device == CPU  # a script's usual next line
    assert "CPU" in torch.cuda.get_device_name(device)
    if HAS_CUDA:
        return  # CUDA works in this process: nothing fails
    with pytest.raises(RuntimeError, match=r"get_device_properties\(\).*is_available"):
        torch.cuda.get_device_properties(0)
    with pytest.raises(AssertionError, match=r"get_device_capability\(\)"):  # caught as torch's
        torch.cuda.get_device_capability()  # CPU-build error still is; named as the user called it
    parallel.disable()
    with pytest.raises((AssertionError, RuntimeError)) as raised:
        torch.cuda.get_device_properties(0)
    assert "singlecard_nb" not in str(raised.value)  # torch's own error again once off
