"""The DDP tutorial series, as a new user runs it: `%run` under `%singlecard cpu`, in a real kernel.

Scripts of the same shape as pytorch/examples `distributed/ddp-tutorial-series` (written here,
in notebooks/scripts/): single_gpu.py (`.to(0)`), multigpu.py (world size from
`torch.cuda.device_count()`, `mp.spawn`), multigpu_torchrun.py and multinode.py (`.to(local_rank)`,
a snapshot resumed with `map_location=f"cuda:{local_rank}"`). Each runs three times in one
fresh kernel and really trains; then `%singlecard off` and `%unload_ext` leave torch as it was.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import notebook_runner

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "notebooks" / "scripts"
MACHINE = Path(__file__).with_name("machines") / "no_gpus.json"
EPOCH = re.compile(r"\[GPU0\] Epoch (\d+) \| Batchsize: 32 \| Steps: 64 \| loss ([\d.]+)")

pytestmark = pytest.mark.slow

RUNS = {  # script -> the arguments of its three runs
    "single_gpu.py": ["3 1"] * 3,
    "multigpu.py": ["3 1"] * 3,
    "multigpu_torchrun.py": [f"{epochs} 1 --snapshot_path torchrun.pt" for epochs in (2, 4, 6)],
    "multinode.py": [f"{epochs} 1 --snapshot_path multinode.pt" for epochs in (2, 4, 6)],
}

IDENTITY = '''
import torch, torch.multiprocessing as mp, torch.distributed as dist
from torch import nn

def patched_objects():
    return {"Tensor.to": torch.Tensor.__dict__.get("to"), "Module.to": nn.Module.to,
            "torch.zeros": torch.zeros, "torch.load": torch.load, "mp.spawn": mp.spawn,
            "DDP.__init__": nn.parallel.DistributedDataParallel.__init__,
            "init_process_group": dist.init_process_group,
            "set_device": torch.cuda.set_device, "synchronize": torch.cuda.synchronize,
            "autocast": torch.amp.autocast_mode.autocast.__init__,
            "GradScaler": torch.amp.GradScaler.__init__}

before = patched_objects()
'''


def _text(cell, name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)


def _epochs(cell) -> list[tuple[int, float]]:
    return [(int(e), float(loss)) for e, loss in EPOCH.findall(_text(cell))]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook a new user would write, run once in a fresh kernel (in a temporary folder)."""
    import nbformat

    folder = tmp_path_factory.mktemp("tutorial")
    cells = [IDENTITY, "%load_ext singlecard_nb\n%singlecard cpu"]
    for script, runs in RUNS.items():
        cells += [f"%run {SCRIPTS / script} {arguments}" for arguments in runs]
    cells += ["%singlecard status",
              "%singlecard off\n%unload_ext singlecard_nb\n"
              "changed = [k for k, v in before.items() if patched_objects()[k] is not v]\n"
              "print('torch as before' if not changed else f'CHANGED: {changed}')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = folder / "tutorial.ipynb"
    nbformat.write(nb, str(path))
    report = notebook_runner().execute(path, machine=str(MACHINE), timeout=300)
    by_script, index = {}, 2
    for script, runs in RUNS.items():
        by_script[script] = report.nb.cells[index:index + len(runs)]
        index += len(runs)
    return report, by_script, folder


def test_no_cell_fails(executed):
    report, _, _ = executed
    assert report.errors == [], str(report)


@pytest.mark.parametrize("script", ["single_gpu.py", "multigpu.py"])
def test_one_gpu_and_spawn_scripts_train_the_same_three_times(executed, script):
    _, by_script, folder = executed
    runs = [_epochs(cell) for cell in by_script[script]]
    assert all([e for e, _ in run] == [0, 1, 2] for run in runs), runs
    assert all(run[0][1] > run[1][1] > run[2][1] for run in runs), runs  # it learns
    assert runs[0] == runs[1] == runs[2]  # nothing leaks from one run into the next
    assert all("Training checkpoint saved at checkpoint.pt" in _text(c) for c in by_script[script])
    assert (folder / "checkpoint.pt").exists()


def test_spawn_script_says_once_that_it_runs_rank_0_here(executed):
    _, by_script, _ = executed
    first, *later = (_text(c, "stderr") for c in by_script["multigpu.py"])
    assert "runs main(0, ...) in this process" in first and "asked for 0 processes" in first
    assert all("singlecard_nb" not in text for text in later), later


@pytest.mark.parametrize("script", ["multigpu_torchrun.py", "multinode.py"])
def test_torchrun_scripts_write_and_resume_their_snapshot(executed, script):
    _, by_script, folder = executed
    cells = by_script[script]
    runs = [_epochs(cell) for cell in cells]
    assert [[e for e, _ in run] for run in runs] == [[0, 1], [2, 3], [4, 5]], runs
    losses = [loss for run in runs for _, loss in run]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses  # resumed, not restarted
    assert "Loading snapshot" not in _text(cells[0])
    for cell, epoch in zip(cells[1:], (2, 4)):
        assert f"Resuming training from snapshot at Epoch {epoch}" in _text(cell)
    assert "map_location='cuda:0') uses cpu" in _text(cells[1], "stderr") + _text(
        by_script["multigpu_torchrun.py"][1], "stderr")
    assert (folder / script.replace("multigpu_", "").replace(".py", ".pt")).exists()


def test_status_says_what_was_remapped_and_off_unload_give_torch_back(executed):
    report, _, _ = executed
    status, last = report.nb.cells[-2], report.nb.cells[-1]
    text = "".join(o.get("data", {}).get("text/plain", "") for o in status.outputs)
    for said in ("single-card said", "module.to(0) uses cpu", "torch.cuda.set_device(0)",
                 "DistributedDataParallel(device_ids=[0]) runs on cpu",
                 "torch.load(..., map_location='cuda:0') uses cpu", "rank 0 of a world of one"):
        assert said in text, text
    assert "torch as before" in _text(last), _text(last)
