"""Single-card mode: DataParallel / DDP / process groups / spawn / torchrun env on one device."""

from __future__ import annotations

import copy
import gc
import io
import os
import sys
import threading
import time
import warnings
from collections import namedtuple
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from parallel_support import (
    TORCHRUN_VARS,
    builtin_table_size,
    clean_state,  # noqa: F401 - used by every test (pytestmark)
    listening,
    on_linux,
    patched_objects,
    refuses_connections,
)
from torch import nn
from torch.distributed import distributed_c10d
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from singlecard_nb import session
from singlecard_nb.job import free_port
from singlecard_nb.parallel import single_card as parallel
from singlecard_nb.parallel import wrappers

SCRIPT = Path(__file__).resolve().parents[1] / "notebooks" / "scripts" / "multigpu_torchrun.py"
CPU = torch.device("cpu")
SHORT = timedelta(seconds=20)  # a broken world-of-one would otherwise wait 30 min for peers

Pair = namedtuple("Pair", "x scale")

pytestmark = [pytest.mark.usefixtures("clean_state"),
              pytest.mark.filterwarnings("ignore:singlecard_nb. :UserWarning")]


def model_pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, copy.deepcopy(model)


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


# --- enable / disable -------------------------------------------------------------------------
def test_disable_restores_the_identical_objects_and_environment(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")  # set by the user: must be left alone
    before, table = patched_objects(), builtin_table_size()
    parallel.enable(CPU)
    during = patched_objects()
    assert [name for name in before if during[name] is before[name]] == []
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
    assert len(report["patched"]) == len(set(report["patched"]))  # each label once

    parallel.disable()
    after = patched_objects()
    assert [name for name in before if after[name] is not before[name]] == []
    assert builtin_table_size() == table
    assert [v for v in TORCHRUN_VARS if v in os.environ] == ["MASTER_ADDR"]
    assert os.environ["MASTER_ADDR"] == "10.0.0.7"
    assert parallel.report()["enabled"] is False and parallel.report()["patched"] == []
    parallel.disable()  # idempotent


def test_a_gpu_pin_leaves_the_cuda_calls_of_the_cpu_mode_alone():
    before = patched_objects()
    parallel.enable(torch.device("cuda", 1))  # nothing touches CUDA until user code does
    during = patched_objects()
    unchanged = {name for name in before if during[name] is before[name]}
    assert unchanged == set(before) - set(patched_objects(cpu=False))
    assert "torch.cuda.synchronize" in unchanged and "Tensor.to" not in unchanged
    parallel.disable()
    assert all(patched_objects()[name] is before[name] for name in before)


def test_a_failure_half_way_through_enable_changes_nothing(monkeypatch):
    before, table = patched_objects(), builtin_table_size()

    def broken(owner):
        raise RuntimeError("boom")

    monkeypatch.setattr(parallel, "_provide_torchrun_env", broken)  # the last step
    with pytest.raises(RuntimeError, match="boom"):
        parallel.enable(CPU)
    assert all(patched_objects()[name] is before[name] for name in before)
    assert builtin_table_size() == table
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
    moved = wrappers._move(({"a": [x, (x,)], "p": Pair(x, 1.5)}, packed, "text"), meta)
    batch, seq, text = moved
    assert batch["a"][0].device == batch["a"][1][0].device == batch["p"].x.device == meta
    assert type(batch["p"]) is Pair and batch["p"].scale == 1.5 and text == "text"
    assert seq.data.device == meta and seq.batch_sizes.device == CPU  # as pack_sequence needs


def test_data_parallel_puts_module_and_inputs_on_the_pinned_device():
    meta = torch.device("meta")  # stands in for a GPU on a CPU-only machine
    parallel.enable(meta)
    model = nn.Linear(2, 2)
    wrapped = nn.DataParallel(model)
    out = wrapped(torch.randn(4, 2), **{})
    assert model.weight.device == meta and out.device == meta and out.shape == (4, 2)
    assert wrapped.src_device_obj == meta and wrapped.device_ids == []


def test_functional_data_parallel_runs_on_the_pinned_device_in_this_thread():
    model, bare = model_pair()
    x = torch.randn(5, 6)
    with pytest.raises((RuntimeError, AssertionError)):  # torch alone: no GPUs to replicate on
        nn.parallel.data_parallel(model, x, device_ids=[0, 1])
    parallel.enable(CPU)
    threads = []
    model.register_forward_hook(lambda *_: threads.append(threading.get_ident()))
    out = nn.parallel.data_parallel(model, x, device_ids=[0, 1], output_device=1)
    torch.testing.assert_close(out, bare(x), rtol=0, atol=0)
    assert threads == [threading.get_ident()]
    kwargs_model = nn.Bilinear(6, 6, 2)
    both = nn.parallel.data_parallel(kwargs_model, (x,), [0], module_kwargs={"input2": x})
    torch.testing.assert_close(both, kwargs_model(x, x))
    meta = torch.device("meta")
    parallel.enable(meta)
    assert torch.nn.parallel.data_parallel(model, x).device == meta and model[0].weight.is_meta


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


# --- DistributedDataParallel: the real one over a world of one --------------------------------
class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


def test_ddp_is_the_real_ddp_and_trains_like_the_bare_model_with_cpu_device_ids():
    parallel.enable(CPU)
    model, bare = model_pair()
    # Without single-card mode: no process group, and device_ids rejected for a CPU module.
    with pytest.warns(UserWarning, match="formed a world of one"):
        ddp = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])], find_unused_parameters=False)
    assert isinstance(ddp, DDP) and ddp.module is model and dist.get_world_size() == 1
    assert all(key.startswith("module.") for key in ddp.state_dict())
    # What Lightning, Hugging Face and accelerate touch is DDP's own.
    assert isinstance(ddp.reducer, dist.Reducer) and isinstance(ddp.logger, dist.Logger)
    assert ddp.bucket_bytes_cap > 0 and ddp.find_unused_parameters is False
    assert ddp.device_ids is None and ddp.process_group is dist.group.WORLD
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
    logging = ddp._get_ddp_logging_data()
    assert logging["world_size"] == 1 and logging["bucket_cap_bytes"] == ddp.bucket_bytes_cap
    assert parallel.report()["wrappers"] == 1


def test_ddp_device_ids_follow_the_pin_and_say_so_once():
    parallel.enable(CPU)
    with pytest.warns(UserWarning, match=r"device_ids=\[3\], output_device=3\) runs on cpu"):
        first = DDP(nn.Linear(2, 2), device_ids=[3], output_device=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DDP(nn.Linear(2, 2), device_ids=[torch.device("cuda", 1)])  # said once
    assert first.device_ids is None and first.output_device is None
    notices = parallel.report()["notices"]
    assert any("device_ids=[3]" in line and line.endswith("(×2)") for line in notices), notices


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


def test_ddp_complains_about_unused_parameters_as_ddp_does():
    parallel.enable(CPU)
    ddp = DDP(WithUnused())  # find_unused_parameters=False
    ddp(torch.randn(2, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="Expected to have finished reduction"):
        ddp(torch.randn(2, 3)).sum().backward()
    finds = DDP(WithUnused(), find_unused_parameters=True)
    for _ in range(2):
        finds(torch.randn(2, 3)).sum().backward()
    static = DDP(WithUnused(), static_graph=True)
    for _ in range(3):
        static(torch.randn(2, 3)).sum().backward()
    assert static.static_graph is True and static.module.unused.weight.grad is None


def test_ddp_comm_hooks_really_run():
    parallel.enable(CPU)
    model, bare = model_pair()
    ddp = DDP(model)
    buckets = []

    def recording_hook(state, bucket):
        buckets.append(bucket.buffer().numel())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(state=dist.group.WORLD, hook=recording_hook)
    x = torch.randn(4, 6)
    ddp(x).sum().backward()
    bare(x).sum().backward()
    assert sum(buckets) == sum(p.numel() for p in model.parameters())
    for a, b in zip(grads(model), grads(bare)):
        torch.testing.assert_close(a, b)

    compressed, reference = model_pair(seed=3)
    fp16 = DDP(compressed)
    fp16.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    big = torch.randn(4, 6) * 1000
    fp16(big).sum().backward()
    reference(big).sum().backward()
    rounded = [g.half().float() for g in grads(reference)]
    assert grads(compressed)[0].tolist() == rounded[0].tolist()  # the hook's numerics happened
    assert grads(compressed)[0].tolist() != grads(reference)[0].tolist()
    with pytest.raises(RuntimeError, match="register_comm_hook"):
        fp16.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)  # DDP's own rule


def test_ddp_join_and_copies():
    parallel.enable(CPU)
    ddp = DDP(nn.Linear(3, 3))
    with ddp.join():
        for _ in range(2):
            ddp(torch.randn(2, 3)).sum().backward()
    clone = copy.deepcopy(ddp)
    assert isinstance(clone, DDP) and clone.module is not ddp.module
    torch.testing.assert_close(clone(torch.ones(1, 3)), ddp(torch.ones(1, 3)))


def test_ddp_keeps_the_errors_real_ddp_gives_one_process():
    parallel.enable(CPU)
    with pytest.raises(ValueError, match="single element"):
        DDP(nn.Linear(2, 2), device_ids=[0, 1])
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(RuntimeError, match="doesn't have any parameter"):
        DDP(frozen)
    with pytest.raises(TypeError):
        DDP(nn.Linear(2, 2), no_such_option=True)


def test_real_ddp_built_before_single_card_mode_keeps_working_and_is_unwrapped():
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
    real(x).sum().backward()  # not ours: its group is the user's and stays
    assert dist.is_initialized()


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
    with pytest.warns(UserWarning, match=r"init_process_group\(world_size=8\) is a job of 8 ranks"):
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


def test_a_script_that_checks_rank_is_told_single_card_mode_set_it(monkeypatch):
    # nanoGPT: `ddp = int(os.environ.get('RANK', -1)) != -1`, then its DDP branch's choices
    monkeypatch.delenv("RANK", raising=False)
    parallel.enable(CPU)
    assert os.environ["RANK"] == "0"
    with pytest.warns(UserWarning, match="RANK=0 and WORLD_SIZE=1 were set by single-card mode"):
        dist.init_process_group("gloo", timeout=SHORT)
    parallel.disable()
    assert "RANK" not in os.environ
    monkeypatch.setenv("RANK", "0")  # the user's (or a launcher's) own: nothing to say
    parallel.enable(CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.init_process_group("gloo", timeout=SHORT)


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
    with pytest.warns(UserWarning, match=r"WORLD_SIZE=4 \(the environment\) is a job of 4 ranks"
                                         r".* does 1/4 of the job's work per step"):
        parallel.enable(CPU)  # said where single-card mode first sees it
    assert os.environ["WORLD_SIZE"] == "4"  # set by someone else: left alone
    dist.init_process_group("gloo", timeout=SHORT)
    assert dist.get_world_size() == 1
    assert any("job of 4 ranks" in n and n.endswith("(×2)") for n in parallel.report()["notices"])


# --- the gloo listener of a world-of-one group ------------------------------------------------
needs_proc = pytest.mark.skipif(not on_linux(), reason="reads the process's sockets from /proc")


def _group_with_a_trained_ddp() -> tuple[str, DDP]:
    dist.init_process_group("gloo", timeout=SHORT)
    (address,) = parallel.report()["listeners"]
    assert listening(address)
    ddp = DDP(nn.Linear(3, 3))  # holds the group, as a training script's model does
    ddp(torch.randn(2, 3)).sum().backward()
    return address, ddp


@needs_proc
def test_destroy_process_group_closes_the_gloo_listener_even_while_a_ddp_holds_the_group():
    parallel.enable(CPU)
    address, ddp = _group_with_a_trained_ddp()
    dist.destroy_process_group()
    assert not listening(address) and refuses_connections(address)
    assert parallel.report()["listeners"] == []
    with pytest.raises(RuntimeError, match="Build the wrapper again"):
        ddp(torch.randn(2, 3))
    assert isinstance(ddp.module, nn.Linear) and list(ddp.state_dict()) == [
        "module.weight", "module.bias"]
    dist.init_process_group("gloo", timeout=SHORT)  # a fresh one opens a fresh listener
    assert len(parallel.report()["listeners"]) == 1


@pytest.mark.parametrize("ends", ["destroy_process_group", "single_card(False)"])
def test_a_thread_waiting_for_the_gil_runs_before_the_group_is_destroyed(monkeypatch, ends):
    # A backend thread frees a finished collective, and may need the GIL for it (a tensor
    # Python made); the group's destructor joins that thread with the GIL held. Ending the group
    # lets the GIL go first, so such a thread has run when torch destroys it: without that, a
    # script ending in destroy_process_group() hung the kernel (FSDP1 under torch 2.6).
    woke, go = threading.Event(), threading.Event()
    seen: list[bool] = []
    real = distributed_c10d.destroy_process_group

    def torchs(group=None):  # torch's, as single-card mode's patch finds it
        seen.append(woke.is_set())
        return real(group)

    monkeypatch.setattr(distributed_c10d, "destroy_process_group", torchs)
    monkeypatch.setattr(dist, "destroy_process_group", torchs)
    session.pin("cpu")
    try:
        dist.init_process_group("gloo", timeout=SHORT)
        waiter = threading.Thread(target=lambda: (go.wait(), woke.set()))
        waiter.start()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(10.0)  # this thread keeps the GIL unless it lets it go
        try:
            go.set()  # the waiter wakes and waits for the GIL, as a gloo thread freeing a work
            if ends == "destroy_process_group":
                dist.destroy_process_group()
            else:
                session.single_card(False)
        finally:
            sys.setswitchinterval(interval)
        waiter.join(10)
    finally:
        session.release()
    assert seen == [True]


@needs_proc
def test_ctrl_c_while_ddp_is_built_leaves_no_gloo_listener_after_off(monkeypatch):
    session.pin("cpu")
    try:
        dist.init_process_group("gloo", timeout=SHORT)
        (address,) = parallel.report()["listeners"]

        def interrupted(self, *args, **kwargs):
            raise KeyboardInterrupt  # Ctrl-C while DDP builds its reducer

        monkeypatch.setattr(DDP, "_ddp_init_helper", interrupted)
        try:
            DDP(nn.Linear(3, 3))
        except KeyboardInterrupt:
            kept = sys.exc_info()[2]  # what IPython keeps as sys.last_traceback
        monkeypatch.undo()
    finally:
        session.release()
    gc.collect()
    assert not listening(address) and refuses_connections(address)
    del kept


@needs_proc
@pytest.mark.parametrize("where", ["_verify_param_shape_across_processes", "_sync_module_states"])
def test_ctrl_c_in_ddps_collectives_leaves_no_gloo_listener_while_the_traceback_is_kept(
        monkeypatch, where):
    from torch.nn.parallel import distributed as ddp_module

    session.pin("cpu")
    try:
        dist.init_process_group("gloo", timeout=SHORT)
        (address,) = parallel.report()["listeners"]

        def interrupted(process_group=None, *args, **kwargs):  # as torch's functions take it
            assert process_group is dist.group.WORLD  # its frame holds the group, as torch's
            raise KeyboardInterrupt  # Ctrl-C while DDP checks or broadcasts its parameters

        monkeypatch.setattr(ddp_module, where, interrupted)
        try:
            DDP(nn.Linear(3, 3))
        except KeyboardInterrupt:
            kept = sys.exc_info()[2]  # what IPython keeps as sys.last_traceback
        monkeypatch.undo()
    finally:
        session.release()
    gc.collect()
    assert not listening(address) and refuses_connections(address)  # was open until `del kept`
    assert kept.tb_next is not None  # the traceback itself is the user's: still there
    del kept


@needs_proc
def test_off_closes_the_gloo_listener_and_status_says_while_it_is_open():
    session.pin("cpu")
    try:
        address, ddp = _group_with_a_trained_ddp()
        assert f"open on {address}" in repr(session.status())
    finally:
        session.release()
    assert not listening(address) and refuses_connections(address)
    assert not dist.is_initialized()
    assert "gloo listener" not in repr(session.status())


@needs_proc
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_unload_ext_closes_the_gloo_listener(shell):
    shell.run_line_magic("load_ext", "singlecard_nb")
    try:
        shell.run_line_magic("singlecard", "cpu")
        result = shell.run_cell(
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('nccl')\n"
            "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))\n"
            "model(torch.randn(2, 3)).sum().backward()\n")
        result.raise_error()
        (address,) = parallel.report()["listeners"]
        assert listening(address)
    finally:
        shell.run_line_magic("unload_ext", "singlecard_nb")
    assert not listening(address) and refuses_connections(address)


# --- torch.multiprocessing.spawn / start_processes --------------------------------------------
def _worker(rank, calls, world_size):
    calls.append((rank, world_size, threading.get_ident(), os.getpid()))


def test_spawn_runs_rank_0_in_this_process_and_says_so_once():
    parallel.enable(CPU)
    calls = []
    with pytest.warns(UserWarning, match=r"spawn\(_worker, nprocs=4\) runs _worker\(0, ...\) in this"):
        assert mp.spawn(_worker, args=(calls, 4), nprocs=4) is None
    assert calls == [(0, 4, threading.get_ident(), os.getpid())]
    notices = parallel.report()["notices"]
    assert any("asked for 4 processes; single-card mode runs rank 0 only" in n for n in notices)
    assert any("torch.multiprocessing.spawn(nprocs=4) is a job of 4 ranks" in n
               and "1/4 of the job's work per step" in n for n in notices)  # the batch it implies
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mp.spawn(_worker, args=(calls, 4), nprocs=4)  # said once
    context = mp.start_processes(_worker, args=(calls, 1), nprocs=1, join=False,
                                 start_method="fork")
    assert context.join() is True and context.pids() == [] and context.processes == []
    assert [c[:2] for c in calls] == [(0, 4), (0, 4), (0, 1)]


def test_spawn_with_no_processes_runs_rank_0_and_says_why():
    parallel.enable(CPU)
    calls = []
    with pytest.warns(UserWarning, match="asked for 0 processes"):
        mp.spawn(_worker, args=(calls, torch.cuda.device_count()), nprocs=0)
    assert [c[:2] for c in calls] == [(0, 0)]


def test_spawn_gives_the_worker_exception_unchanged_and_undoes_its_environment():
    parallel.enable(CPU)
    error = KeyError("from the worker")
    threads = torch.get_num_threads()

    def worker(rank):
        os.environ["MASTER_PORT"] = "12355"  # as the tutorial's ddp_setup does
        os.environ["SINGLECARD_TEST_CHILD"] = "1"
        torch.set_num_threads(1)
        raise error

    port = os.environ["MASTER_PORT"]
    with pytest.raises(KeyError) as caught:
        mp.spawn(worker, nprocs=2)
    assert caught.value is error
    assert os.environ["MASTER_PORT"] == port and "SINGLECARD_TEST_CHILD" not in os.environ
    assert torch.get_num_threads() == threads


def _rpc_worker(rank, world_size):
    import torch.distributed.rpc as rpc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rpc.init_rpc("trainer" if rank else "ps", rank=rank, world_size=world_size)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
def test_an_rpc_job_of_two_processes_stops_at_once_saying_why_instead_of_waiting():
    # pytorch/examples' distributed/rpc/rnn: mp.spawn runs rank 0 here, whose init_rpc of a
    # world of 2 waited more than 5 minutes for a parameter server nobody starts
    import torch.distributed.rpc as rpc

    torchs = rpc.init_rpc
    parallel.enable(CPU)
    started = time.monotonic()
    with pytest.warns(UserWarning, match="runs rank 0 only"), \
            pytest.raises(RuntimeError, match=r"rpc.init_rpc\('ps', rank=0, world_size=2\) would "
                          r"wait for the job's other 1 process\(es\)") as caught:
        mp.spawn(_rpc_worker, args=(2,), nprocs=2)
    assert time.monotonic() - started < 10
    assert "run the script without single-card mode" in str(caught.value)
    parallel.disable()
    assert rpc.init_rpc is torchs  # given back


# --- the torchrun tutorial script in a shell --------------------------------------------------
@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    yield ip
    for name in ("epoch_losses", "main", "Trainer", "model"):
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
