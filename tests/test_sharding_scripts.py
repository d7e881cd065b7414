"""Multi-GPU code people run today, under `%singlecard cpu` in one shell: nanoGPT's pinned
batches, FSDP1 in the tutorial's shape, an FSDP2 + tensor-parallel mesh, a GPU-count guard; and
what a described GPU machine decides without a GPU."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import fsdp2_on_cpu
from parallel_support import clean_state, patched_objects  # noqa: F401 - clean_state: pytestmark

from singlecard_nb import session
from singlecard_nb.parallel import fsdp, mesh, sockets
from singlecard_nb.parallel import single_card as parallel

SCRIPTS = Path(__file__).with_name("scripts")
ROOT = Path(__file__).resolve().parent.parent
FORMS = ("local_rank", "current_device", "device", "none")
OPTIONS = "mixed,offload,sync,orig"  # mixed precision, CPU offload, sync_module_states, orig params
pytestmark = pytest.mark.usefixtures("clean_state")


def run_scripts(target: str, folder: Path) -> tuple[dict, str, list[str]]:
    """Each script run twice with %run in one shell pinned to `target`, its output and notices
    kept; then the status text, and what releasing did not give back."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    before = patched_objects()
    out: dict[str, list[tuple[str, list[str], object]]] = {}

    def run(key: str, line: str) -> None:
        with warnings.catch_warnings(record=True) as said, capture_output() as captured:
            warnings.simplefilter("always")
            result = ip.run_cell(f"%run {line}")
        notices = [str(w.message) for w in said if "singlecard_nb" in str(w.message)]
        shown = re.sub(r"\x1b\[[0-9;]*m", "", captured.stdout)  # the traceback's colours
        out.setdefault(key, []).append((shown, notices, result.error_in_exec))

    session.pin(target)
    try:
        for _ in range(2):
            for form in FORMS:
                run(form, f"{SCRIPTS / 'fsdp1_tutorial.py'} {form} {folder / form}.pt")
            run("options", f"{SCRIPTS / 'fsdp1_tutorial.py'} device {folder / 'o.pt'} {OPTIONS}")
            run("mesh", f"{SCRIPTS / 'mesh_tp_fsdp2.py'} 1 {folder / 'dcp'}")
            run("mesh tp=2", f"{SCRIPTS / 'mesh_tp_fsdp2.py'} 2 {folder / 'dcp2'}")
            run("guard", str(SCRIPTS / "gpu_guard.py"))
            run("nanogpt", f"{SCRIPTS / 'nanogpt_batches.py'} {folder / 'ng.pt'}")
        ip.run_cell("import os; os.environ['WORLD_SIZE'] = '8'")
        run("nanogpt WORLD_SIZE=8", f"{SCRIPTS / 'nanogpt_batches.py'} {folder / 'ng8.pt'}")
        status = repr(session.status())
    finally:
        ip.run_cell("os.environ['WORLD_SIZE'] = '1'")
        session.release()
        if dist.is_initialized():
            dist.destroy_process_group()
    changed = [name for name, obj in patched_objects().items() if obj is not before[name]]
    return out, status, changed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_scripts("cpu", tmp_path_factory.mktemp("sharding"))


def test_fsdp1_trains_saves_full_state_and_reloads_in_every_device_id_form(runs):
    out, _, _ = runs
    lines = [stdout for form in FORMS for stdout, _, error in out[form] if error is None]
    assert len(lines) == 8, out
    # the same training, whatever the device_id form; the checkpoint's keys are a real FSDP1
    # run's (no _fsdp_wrapped_module. prefix) and a fresh FSDP model loads it back exactly
    assert len({line.split(": ", 1)[1] for line in lines}) == 1, lines
    assert "keys ['0.bias', '0.weight', '2.bias', '2.weight', '4.bias', '4.weight'] " \
           "reloaded equal True weight (64, 8)" in lines[0]
    losses = [float(v) for v in re.findall(r"[\d.]+", lines[0].split("losses ")[1].split("]")[0])]
    assert losses == sorted(losses, reverse=True)  # it learns


def test_fsdp1_with_mixed_precision_offload_sync_and_orig_params_trains_under_cpu(runs):
    out, _, _ = runs
    (first, said, error), (second, _, _) = out["options"]
    assert error is None and first == second and "reloaded equal True" in first, first
    assert any("sync_module_states=True) under `%singlecard cpu`" in s for s in said)
    assert any("offload_params=True)) under `%singlecard cpu`" in s for s in said)


@fsdp2_on_cpu
def test_an_fsdp2_tp_mesh_of_one_trains_and_checkpoints_and_a_bigger_one_says_what_to_change(runs):
    out, _, _ = runs
    (first, said, error), (second, _, error2) = out["mesh"]
    assert error is error2 is None
    assert first == second and first.startswith("mesh (1, 1) cpu: losses")
    assert any("init_device_mesh('cuda', (1, 1)) under `%singlecard cpu` is a cpu mesh" in s
               for s in said)
    for shown, _, _ in out["mesh tp=2"]:  # %run shows the error (one frame of ours, not torch's)
        assert "MeshTooLargeError: singlecard_nb: init_device_mesh('cuda', (0, 2)) asks for 0 " \
               "ranks" in shown, shown
        assert "init_device_mesh(..., (1, 1), mesh_dim_names=('dp', 'tp')) here" in shown
        assert "device_mesh.py" not in shown  # torch's own mesh code was never reached


def test_a_gpu_count_guard_stops_with_a_notice_naming_its_lines_once(runs):
    out, _, _ = runs
    (first, said, _), (second, said_again, _) = out["guard"]
    assert "Unable to locate sufficient 2 gpus" in first and "Unable" in second
    guard = [s for s in said if "sys.exit()" in s]
    assert len(guard) == 1 and "sys.exit() at gpu_guard.py:16" in guard[0]
    assert "torch.accelerator.device_count() answered 0 at gpu_guard.py:10" in guard[0]
    assert "the check at gpu_guard.py:14 (`if not verify_min_gpu_count(min_gpus=2):`)" in guard[0]
    assert "skip that check" in guard[0]
    assert not [s for s in said_again if "sys.exit()" in s]  # said once


def test_nanogpt_batches_pin_and_copy_without_error_and_the_world_size_is_said(runs):
    out, status, _ = runs
    (first, said, error), (second, said_again, _) = out["nanogpt"]
    assert error is None and first == second
    assert "accumulation 8" in first and "pinned [True, True]" in first
    assert any("tensor.pin_memory() under `%singlecard cpu`" in s for s in said)
    assert not any("pin_memory" in s for s in said_again)
    (eight, said8, _), = out["nanogpt WORLD_SIZE=8"]
    assert "accumulation 1" in eight  # what nanoGPT does: 8 // 8
    assert any("WORLD_SIZE=8 (the environment) is a job of 8 ranks" in s
               and "1/8 of the job's work" in s for s in said8)


def test_status_lists_what_was_turned_into_what_and_release_gives_torch_back(runs):
    _, status, changed = runs
    assert "FullyShardedDataParallel(device_id=0) → the real FSDP1 on cpu, a world of one (×8)" \
        in status, status
    assert "FullyShardedDataParallel(device_id=None) → the real FSDP1 on cpu" in status
    assert "init_device_mesh('cuda', (1, 1)) → a cpu mesh (1, 1), a world of one (×2)" in status
    assert changed == []


def test_torch_accelerator_answers_as_torch_cuda_under_cpu():
    parallel.enable(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.accelerator.is_available() is torch.cuda.is_available() is False
        assert torch.accelerator.device_count() == torch.cuda.device_count() == 0
        assert torch.accelerator.current_accelerator() == torch.device("cpu")
        assert torch.accelerator.current_device_index() == torch.cuda.current_device() == 0
        torch.accelerator.set_device_index(3)  # nothing to select: no error
        if hasattr(torch.accelerator, "device_index"):  # the context manager: torch 2.8+
            with torch.accelerator.device_index(1):
                torch.accelerator.synchronize()
        if hasattr(torch.accelerator, "memory_allocated"):  # torch 2.8+
            assert torch.accelerator.memory_allocated() == 0
        stream = torch.accelerator.current_stream()
        stream.synchronize()


@pytest.mark.parametrize("pinned", [0, 2])  # a hard pin (cuda:0) and a soft pin to cuda:2
def test_on_a_gpu_pin_every_fsdp_device_id_form_is_the_pinned_card(pinned):
    card = torch.device("cuda", pinned)
    for requested in (0, 3, torch.device("cuda", 1), "cuda:3"):
        assert fsdp._device_id(requested, card) == card
    assert fsdp._device_id(None, card) is None  # FSDP takes the current device: the pin's
    assert fsdp._device_id(1, torch.device("cpu")) == torch.device("cpu")


def test_on_a_described_gpu_pin_a_mesh_too_large_is_refused_before_cuda_starts(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.warns(UserWarning, match="WORLD_SIZE=8 .* job of 8 ranks"):
        parallel.enable(torch.device("cuda", 1))  # nothing touches CUDA until user code does
    from torch.distributed.device_mesh import init_device_mesh

    with pytest.raises(mesh.MeshTooLargeError, match=r"asks for 8 ranks.*WORLD_SIZE=8 is set"
                                                     r".*torchrun on 8 GPUs") as caught:
        init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    assert "(1, 1), mesh_dim_names=('dp', 'tp')" in str(caught.value)
    if hasattr(torch.accelerator, "device_index"):  # the context manager: torch 2.8+
        with pytest.warns(UserWarning, match=r"device_index\(3\) selects cuda:1"):
            selection = torch.accelerator.device_index(3)  # entering it would start CUDA
        assert selection.idx == 1  # the rank's card is the pinned card
    assert not torch.cuda.is_initialized()


@pytest.mark.gpu
def test_on_a_gpu_pin_the_scripts_run_with_the_real_fsdp_and_a_cuda_mesh(tmp_path):
    out, status, changed = run_scripts("0", tmp_path)
    for form in (*FORMS, "options"):
        for stdout, _, error in out[form]:
            assert error is None and "reloaded equal True" in stdout, (form, stdout)
    assert all(stdout.startswith("mesh (1, 1) cuda") for stdout, _, _ in out["mesh"])
    assert "the real FSDP1 on cuda:0, a world of one" in status
    guard, _, _ = out["guard"][0]
    assert "Unable to locate sufficient 2 gpus" in guard  # one card counted as one
    assert changed == []


def test_a_pin_leaves_fsdp_unimported_and_patches_it_when_the_script_imports_it():
    """torch.distributed.fsdp costs a third of torch's import: a pin (and each rank of
    --ranks N) imports it only when the script does, and FSDP1 is single-card's then too."""
    import subprocess
    import sys

    code = (
        "import sys, singlecard_nb as scn\n"
        "scn.pin('cpu')\n"
        "assert 'torch.distributed.fsdp' not in sys.modules, 'imported by the pin'\n"
        "from torch import nn\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "model = FSDP(nn.Linear(4, 4))  # refused on the CPU unless single-card's device_id\n"
        "print('params on', next(model.parameters()).device)\n"
        "scn.release()\n"
        "assert not hasattr(FSDP.__init__, '__wrapped__'), 'not given back'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "params on cpu" in done.stdout


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads the process's sockets")
def test_an_fsdp1_tree_lets_go_of_its_group_when_the_group_is_destroyed():
    import gc

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    parallel.enable(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FSDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)),
                     auto_wrap_policy=lambda module, recurse, **_: recurse or isinstance(
                         module, torch.nn.Linear))  # no group yet: FSDP forms the world of one
    model(torch.randn(2, 4)).sum().backward()
    [listener] = parallel.report()["listeners"]
    dist.destroy_process_group()
    gc.collect()
    assert listener not in sockets.listening_sockets().values()  # gloo's socket closed
    with pytest.raises(RuntimeError, match="Build the wrapper again"):
        model(torch.randn(2, 4))
    assert model.module[0].weight.shape == (4, 4)  # the module is intact


def test_a_mesh_sized_by_a_launched_world_of_two_is_that_world_on_the_one_device():
    # pytorch/examples' tensor_parallel_example.py: init_device_mesh("cuda", (WORLD_SIZE,))
    # before any process group, in each of torchrun's 2 ranks; under --device cpu it was
    # refused as "single-card mode runs a world of 1"
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "singlecard_nb", "--device", "cpu",
         str(Path(__file__).with_name("scripts") / "mesh_world.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "mesh (2,) rank 0 sum 3.0" in done.stdout and "mesh (2,) rank 1 sum 3.0" in done.stdout
