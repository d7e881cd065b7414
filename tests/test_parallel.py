"""Single-card mode: DataParallel / DDP / process groups / torchrun env on the one pinned device."""

from __future__ import annotations

import copy
import io
import os
import threading
import warnings
from collections import namedtuple
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from singlecard_nb import session
from singlecard_nb.parallel import single_card as parallel

SCRIPT = Path(__file__).resolve().parents[1] / "notebooks" / "scripts" / "multigpu_torchrun.py"
TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
CPU = torch.device("cpu")
SHORT = timedelta(seconds=20)  # a broken world-of-one would otherwise wait 30 min for peers

Pair = namedtuple("Pair", "x scale")


def patched_objects() -> dict[str, object]:
    """Every torch object single-card mode replaces, read fresh."""
    objects = {f"DataParallel.{n}": nn.DataParallel.__dict__[n] for n in ("__init__", "forward")}
    for name in ("__init__", "forward", "__setstate__", *parallel._DDP_PASSTHROUGH_METHODS):
        objects[f"DDP.{name}"] = DDP.__dict__[name]
    objects["dist.init_process_group"] = dist.init_process_group
    objects["c10d.init_process_group"] = distributed_c10d.init_process_group
    objects["torch.cuda.set_device"] = torch.cuda.set_device
    return objects


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """No torchrun variables from the outside; single-card mode and process groups end after."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    parallel.disable()
    if dist.is_initialized():
        dist.destroy_process_group()


def model_pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, copy.deepcopy(model)


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


# --- enable / disable -------------------------------------------------------------------------
def test_disable_restores_the_identical_objects_and_environment(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")  # set by the user: must be left alone
    before = patched_objects()
    parallel.enable(CPU)
    during = patched_objects()
    assert all(during[name] is not before[name] for name in before)
    assert {name: os.environ[name] for name in TORCHRUN_VARS[:4]} == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    assert os.environ["MASTER_ADDR"] == "10.0.0.7"
    assert 0 < int(os.environ["MASTER_PORT"]) < 65536
    report = parallel.report()
    assert report["enabled"] and report["device"] == "cpu"
    assert "DataParallel.forward" in report["patched"] and "$RANK" in report["patched"]

    parallel.disable()
    after = patched_objects()
    assert all(after[name] is before[name] for name in before)
    assert [v for v in TORCHRUN_VARS if v in os.environ] == ["MASTER_ADDR"]
    assert os.environ["MASTER_ADDR"] == "10.0.0.7"
    assert parallel.report()["enabled"] is False and parallel.report()["patched"] == []
    parallel.disable()  # idempotent


def test_a_failure_half_way_through_enable_changes_nothing(monkeypatch):
    before = patched_objects()

    def broken(owner):
        raise RuntimeError("boom")

    monkeypatch.setattr(parallel, "_patch_cuda_set_device", broken)
    with pytest.raises(RuntimeError, match="boom"):
        parallel.enable(CPU)
    assert all(patched_objects()[name] is before[name] for name in before)
    assert not any(name in os.environ for name in TORCHRUN_VARS)
    assert parallel.report()["enabled"] is False


def test_enable_is_idempotent_and_switches_device_without_starting_cuda(monkeypatch):
    def no_cuda(*args, **kwargs):
        raise AssertionError("enable() must not ask torch.cuda anything")

    for name in ("is_available", "device_count", "init", "current_device"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    parallel.enable(CPU)
    owner = parallel._state.owner
    parallel.enable("cpu")
    assert parallel._state.owner is owner
    parallel.enable(torch.device("cuda", 1))  # a soft pin to the second card
    assert parallel.report()["device"] == "cuda:1" and parallel._state.owner is not owner
    parallel.disable()
    assert parallel.report()["enabled"] is False


def test_torch_cuda_set_device_is_harmless_on_the_cpu():
    parallel.enable(CPU)
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # raises without CUDA when off
    torch.cuda.set_device(3)


def test_set_device_selects_the_pinned_card_whatever_index_is_asked(monkeypatch):
    selected = []
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)  # the "original"
    parallel.enable(torch.device("cuda", 2))  # soft pin: cuda:2
    torch.cuda.set_device(0)
    torch.cuda.set_device(torch.device("cuda", 5))
    assert selected == [2, 2]


# --- DataParallel -----------------------------------------------------------------------------
def test_data_parallel_output_equals_the_bare_model_in_the_calling_thread(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("asked about CUDA"))
    parallel.enable(CPU)
    model, bare = model_pair()
    threads = []
    model.register_forward_hook(lambda *_: threads.append(threading.get_ident()))
    wrapped = nn.DataParallel(model, device_ids=[0, 1, 2, 3], output_device=1)
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is model
    x = torch.randn(8, 6)
    torch.testing.assert_close(wrapped(x), bare(x), rtol=0, atol=0)
    assert threads == [threading.get_ident()]
    assert wrapped._singlecard_requested == {"device_ids": [0, 1, 2, 3], "output_device": 1}
    assert parallel.report()["wrappers"] == 1


def test_data_parallel_passes_nested_inputs_and_kwargs():
    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, pair, batch, *, extra):
            return self.linear(pair.x) * pair.scale + self.linear(batch["y"][0]) + extra

    parallel.enable(CPU)
    module = Nested()
    x, y, extra = torch.randn(3, 4), torch.randn(3, 4), torch.ones(1)
    expected = module(Pair(x, 2.0), {"y": [y]}, extra=extra)
    got = nn.DataParallel(module)(Pair(x, 2.0), {"y": [y]}, extra=extra)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_inputs_are_moved_like_data_parallel_moves_them():
    meta = torch.device("meta")  # a device other than the inputs' on a CPU-only machine
    x = torch.randn(3, 2)
    packed = nn.utils.rnn.pack_sequence([torch.randn(2, 1), torch.randn(1, 1)])
    moved = parallel._move(({"a": [x, (x,)], "p": Pair(x, 1.5)}, packed, "text"), meta)
    batch, seq, text = moved
    assert batch["a"][0].device == batch["a"][1][0].device == batch["p"].x.device == meta
    assert type(batch["p"]) is Pair and batch["p"].scale == 1.5 and text == "text"
    assert seq.data.device == meta and seq.batch_sizes.device == CPU  # as pack_sequence needs


def test_wrappers_put_module_and_inputs_on_the_pinned_device():
    meta = torch.device("meta")  # stands in for a GPU on a CPU-only machine
    parallel.enable(meta)
    model = nn.Linear(2, 2)
    wrapped = nn.DataParallel(model)
    out = wrapped(torch.randn(4, 2), **{})
    assert model.weight.device == meta and out.device == meta and out.shape == (4, 2)
    assert wrapped.src_device_obj == meta and wrapped.device_ids == []
    ddp = DDP(nn.Linear(2, 2), device_ids=[0])  # device_ids: the pinned device
    assert ddp.module.weight.device == meta and ddp(torch.randn(4, 2)).device == meta
    cpu_ddp = DDP(nn.Linear(2, 2))  # a CPU module without device_ids: a CPU DDP program
    assert cpu_ddp.module.weight.device == CPU and cpu_ddp(torch.randn(4, 2)).device == CPU


def test_data_parallel_built_before_single_card_mode_runs_single_card():
    model, bare = model_pair()
    wrapped = nn.DataParallel(model)
    # What DataParallel records on a 4-GPU box: its own forward would scatter to 4 cards.
    wrapped.device_ids, wrapped.src_device_obj, wrapped.output_device = [0, 1, 2, 3], CPU, 0
    x = torch.randn(5, 6)
    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        wrapped(x)
    parallel.enable(CPU)
    torch.testing.assert_close(wrapped(x), bare(x), rtol=0, atol=0)
    assert parallel.unwrap(wrapped) is model


def test_checkpoints_round_trip_between_wrapped_and_bare_models():
    plain_wrapper_keys = list(nn.DataParallel(model_pair()[0]).state_dict())  # torch's own layout
    parallel.enable(CPU)
    source, _ = model_pair(seed=1)
    wrapped = nn.DataParallel(source, device_ids=[0, 1])
    assert list(wrapped.state_dict()) == plain_wrapper_keys
    assert all(key.startswith("module.") for key in plain_wrapper_keys)

    buffer = io.BytesIO()
    torch.save(wrapped.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    x = torch.randn(4, 6)

    other_wrapped = nn.DataParallel(model_pair(seed=2)[0])
    other_wrapped.load_state_dict(saved)  # wrapped -> wrapped
    bare = model_pair(seed=3)[0]
    bare.load_state_dict({k.removeprefix("module."): v for k, v in saved.items()})  # -> bare
    back = nn.DataParallel(model_pair(seed=4)[0])
    back.module.load_state_dict(bare.state_dict())  # bare -> wrapped
    for model in (other_wrapped, bare, back):
        torch.testing.assert_close(model(x), wrapped(x), rtol=0, atol=0)


# --- DistributedDataParallel ------------------------------------------------------------------
def test_ddp_training_step_equals_a_bare_model_step_with_cpu_device_ids():
    parallel.enable(CPU)
    model, bare = model_pair()
    # Real DDP rejects device_ids for a CPU module and needs init_process_group first.
    ddp = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])], find_unused_parameters=False)
    assert isinstance(ddp, DDP) and ddp.module is model
    assert all(key.startswith("module.") for key in ddp.state_dict())
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    opt_bare = torch.optim.SGD(bare.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x, y = torch.randn(8, 6), torch.randn(8, 3)
        for net, opt in ((ddp, opt_ddp), (bare, opt_bare)):
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        for a, b in zip(model.parameters(), bare.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert parallel.report()["wrappers"] == 1


def test_ddp_no_sync_accumulates_like_the_bare_model():
    parallel.enable(CPU)
    model, bare = model_pair()
    ddp = DDP(model)
    batches = [torch.randn(4, 6) for _ in range(3)]
    with ddp.no_sync():
        assert ddp.require_backward_grad_sync is False
        for x in batches[:2]:
            ddp(x).pow(2).sum().backward()
    assert ddp.require_backward_grad_sync is True
    ddp(batches[2]).pow(2).sum().backward()
    for x in batches:
        bare(x).pow(2).sum().backward()
    for a, b in zip(grads(model), grads(bare)):
        torch.testing.assert_close(a, b)


def test_ddp_join_comm_hooks_static_graph_unused_parameters_and_copies():
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    parallel.enable(CPU)
    ddp = DDP(WithUnused(), device_ids=[0])  # unused parameters, find_unused_parameters=False
    calls = []
    ddp.register_comm_hook(state=None, hook=lambda state, bucket: calls.append(bucket))
    ddp._set_static_graph()
    assert ddp.static_graph is True
    with ddp.join():
        for _ in range(2):
            ddp(torch.randn(2, 3)).sum().backward()
    assert calls == []  # nothing to communicate in a world of one
    clone = copy.deepcopy(ddp)
    assert isinstance(clone, DDP) and clone.module is not ddp.module
    torch.testing.assert_close(clone(torch.ones(1, 3)), ddp(torch.ones(1, 3)))
    with pytest.raises(TypeError):
        ddp.register_comm_hook(None, "not a hook")


def test_ddp_keeps_the_errors_real_ddp_gives_one_process():
    parallel.enable(CPU)
    with pytest.raises(ValueError, match="single element"):
        DDP(nn.Linear(2, 2), device_ids=[0, 1])
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(RuntimeError, match="doesn't have any parameter"):
        DDP(frozen)
    with pytest.raises(TypeError):
        DDP(nn.Linear(2, 2), no_such_option=True)


def test_real_ddp_built_before_single_card_mode_is_run_through_and_unwrapped():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    model, bare = model_pair()
    real = DDP(model)
    parallel.enable(CPU)
    x = torch.randn(4, 6)
    real(x).sum().backward()
    bare(x).sum().backward()
    for a, b in zip(grads(model), grads(bare)):
        torch.testing.assert_close(a, b)
    assert parallel.unwrap(real) is model
    parallel.disable()
    real(x).sum().backward()  # DDP's own forward and reducer work again


def test_unwrap_nested_wrappers_and_moves_to_the_pinned_device():
    model = nn.Linear(2, 2)
    built_before = nn.DataParallel(model)
    assert parallel.unwrap(built_before) is model  # nothing pinned: left in place
    assert model.weight.device == CPU
    parallel.enable(CPU)
    assert parallel.unwrap(nn.DataParallel(DDP(model))) is model
    assert parallel.unwrap(model) is model
    parallel.enable(torch.device("meta"))  # stands in for a GPU on a CPU-only machine
    assert parallel.unwrap(built_before) is model and model.weight.device.type == "meta"


# --- process groups ---------------------------------------------------------------------------
def test_init_process_group_twice_and_destroy_then_init_form_worlds_of_one():
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match="gloo instead of nccl"):
        dist.init_process_group(backend="nccl", timeout=SHORT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        dist.init_process_group(backend="nccl", timeout=SHORT)  # torch alone: "initialized twice"
    first = dist.group.WORLD
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    dist.destroy_process_group()
    with pytest.warns(UserWarning, match="world size 8 requested"):
        distributed_c10d.init_process_group(
            "gloo", init_method="env://", rank=3, world_size=8, timeout=SHORT
        )
    assert dist.group.WORLD is not first and dist.get_world_size() == 1
    x = torch.arange(4.0)
    dist.all_reduce(x)
    dist.barrier()
    torch.testing.assert_close(x, torch.arange(4.0))
    assert parallel.report()["groups"] == 3
    parallel.disable()
    assert not dist.is_initialized()  # our group does not outlive single-card mode


def test_distributed_sampler_defaults_cover_the_whole_dataset():
    parallel.enable(CPU)
    dist.init_process_group(timeout=SHORT)
    dataset = TensorDataset(torch.arange(10))
    sampler = DistributedSampler(dataset)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert sorted(epoch1) == list(range(10))
    sampler.set_epoch(2)
    assert list(sampler) != epoch1


def test_a_launcher_world_size_is_overridden_with_a_notice(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    parallel.enable(CPU)
    assert os.environ["WORLD_SIZE"] == "4"  # set by someone else: left alone
    with pytest.warns(UserWarning, match="world of one"):
        dist.init_process_group("gloo", timeout=SHORT)
    assert dist.get_world_size() == 1


# --- the torchrun tutorial script in a shell --------------------------------------------------
@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    yield ip
    for name in ("epoch_losses", "main", "Trainer"):
        ip.user_ns.pop(name, None)


def run_script(ip, tmp_path, name: str, epochs: int) -> list[float]:
    result = ip.run_cell(f"%run {SCRIPT} {epochs} 1 --snapshot_path {tmp_path / name}")
    result.raise_error()
    return ip.user_ns["epoch_losses"]


def falls(losses: list[float]) -> bool:
    return len(losses) >= 2 and all(b < a for a, b in zip(losses, losses[1:]))


@pytest.mark.filterwarnings("ignore:singlecard_nb. init_process_group uses gloo")
def test_torchrun_script_runs_three_times_in_one_shell_under_a_cpu_pin(shell, tmp_path):
    before = patched_objects()
    session.pin("cpu")
    try:
        runs = [run_script(shell, tmp_path, f"run{i}.pt", epochs=4) for i in range(3)]
        assert all(falls(losses) for losses in runs), runs
        assert runs[0] == runs[1] == runs[2]  # nothing leaks from one run into the next
        resumed = run_script(shell, tmp_path, "run0.pt", epochs=6)  # the tutorial's snapshot
        assert len(resumed) == 2 and resumed[0] < runs[0][-1]
        assert parallel.report()["groups"] == 4 and not dist.is_initialized()
    finally:
        session.release()
    assert all(patched_objects()[name] is before[name] for name in before)


@pytest.mark.filterwarnings("ignore:singlecard_nb. init_process_group uses gloo")
def test_magics_run_the_script_and_off_and_unload_restore_torch(shell, tmp_path):
    before = patched_objects()
    shell.run_line_magic("load_ext", "singlecard_nb")
    try:
        shell.run_line_magic("singlecard", "cpu")
        assert session.single_card() is True
        for i in range(3):
            assert falls(run_script(shell, tmp_path, f"magic{i}.pt", epochs=3))
        shell.run_line_magic("singlecard", "off")
        assert all(patched_objects()[name] is before[name] for name in before)

        shell.run_line_magic("singlecard", "cpu")
        assert patched_objects()["DDP.__init__"] is not before["DDP.__init__"]
    finally:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    assert all(patched_objects()[name] is before[name] for name in before)
    assert parallel.report()["enabled"] is False
    assert not any(name in os.environ for name in TORCHRUN_VARS)


def test_single_card_toggles_without_unpinning():
    with pytest.raises(ValueError, match="needs a pinned device"):
        session.single_card(True)
    session.pin("cpu", single_card=False)
    try:
        assert session.single_card() is False
        assert session.single_card(True) is True and parallel.report()["device"] == "cpu"
        assert session.single_card(False) is False
        assert session.current() is not None  # still pinned
    finally:
        session.release()


# --- on a real GPU ----------------------------------------------------------------------------
GPU = torch.device("cuda", 0)


@pytest.mark.gpu
def test_gpu_data_parallel_matches_the_bare_model_on_the_card():
    parallel.enable(GPU)
    model, bare = model_pair()
    wrapped = nn.DataParallel(model, device_ids=[0, 1, 2, 3])
    assert next(model.parameters()).device == GPU and wrapped.device_ids == [0]
    x = torch.randn(8, 6)  # on the CPU: moved to the card as DataParallel would
    out = wrapped(x)
    assert out.device == GPU
    torch.testing.assert_close(out.cpu(), bare(x))


@pytest.mark.gpu
def test_gpu_ddp_step_and_nccl_world_of_one():
    parallel.enable(GPU)
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="nccl", timeout=SHORT)
    dist.init_process_group(timeout=SHORT)  # re-run: no "initialized twice"
    x = torch.ones(3, device=GPU)
    dist.all_reduce(x)
    dist.barrier()
    assert dist.get_world_size() == 1 and x.sum().item() == 3
    model, bare = model_pair()
    ddp = DDP(model.to(GPU), device_ids=[0])
    inputs, target = torch.randn(4, 6), torch.randn(4, 3)
    nn.functional.mse_loss(ddp(inputs), target.to(GPU)).backward()
    nn.functional.mse_loss(bare(inputs), target).backward()
    for a, b in zip(grads(model), grads(bare)):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()


@pytest.mark.gpu
def test_gpu_torchrun_script_in_a_shell(shell, tmp_path):
    parallel.enable(GPU)
    losses = run_script(shell, tmp_path, "gpu.pt", epochs=3)
    assert falls(losses)
