"""Code written for GPUs under `%singlecard cpu`, at the edges users meet: every form of a
request gets the same answer, and a notice points at the user's own line."""

from __future__ import annotations

import warnings

import pytest
import torch
from parallel_support import clean_state  # noqa: F401 - used by every test (pytestmark)

from singlecard_nb.parallel import single_card as parallel

CPU = torch.device("cpu")

pytestmark = [pytest.mark.usefixtures("clean_state")]


def test_factory_functions_asked_for_pinned_memory_answer_as_pin_memory_does():
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        made = [torch.zeros(2, pin_memory=True), torch.empty(3, 2, pin_memory=True),
                torch.ones(2, pin_memory=True), torch.full((2,), 1.0, pin_memory=True),
                torch.randn(2, pin_memory=True), torch.tensor([1.0], pin_memory=True),
                torch.empty(2, device="cuda", pin_memory=True)]
        made.append(made[0].new_empty(2, pin_memory=True))
        made.append(made[0].pin_memory())
    assert all(t.device == CPU and t.is_pinned() for t in made)
    pinned = [w for w in said if "pin_memory" in str(w.message)]
    assert len(pinned) == 1 and "torch.zeros(..., pin_memory=True)" in str(pinned[0].message)
    assert pinned[0].filename == __file__  # the user's line, not ours
    assert any("pin_memory" in n and "(×9)" in n for n in parallel.report()["notices"])


def test_accelerates_notebook_launcher_of_two_runs_as_a_world_of_one_at_once():
    accelerate = pytest.importorskip("accelerate")
    import os
    import threading

    from accelerate.state import AcceleratorState

    # a user's fresh kernel: no Accelerator made by an earlier test in this process (accelerate
    # then refuses notebook_launcher before anything of ours runs)
    AcceleratorState._reset_state(reset_partial_state=True)
    parallel.enable(CPU)
    ran: list = []

    def train(steps):
        state = accelerate.Accelerator()
        model = state.prepare(torch.nn.Linear(2, 2))
        for _ in range(steps):
            model(torch.ones(1, 2))
        ran.append((state.num_processes, state.process_index, os.environ["WORLD_SIZE"]))

    def launch():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            accelerate.notebook_launcher(train, (2,), num_processes=2)
        ran.append([(w.filename, str(w.message)) for w in said])

    thread = threading.Thread(target=launch, daemon=True)  # the old code waited for good
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "notebook_launcher(num_processes=2) hangs"
    (processes, index, world), said = ran
    assert (processes, index, world) == (1, 0, "1")
    assert os.environ.get("WORLD_SIZE") != "2"  # torchrun's variables given back
    assert any("runs train(...) in this process" in text and where == __file__
               for where, text in said)
    assert any("elastic_launch(nproc_per_node=2) is a job of 2 ranks" in text
               for _, text in said)


def test_a_world_size_of_zero_is_said_as_no_gpus_counted_not_one_zeroth_of_a_job():
    import datetime

    import torch.distributed as dist

    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                                world_size=torch.cuda.device_count(),  # 0 here
                                timeout=datetime.timedelta(seconds=20))
    (world,) = [str(w.message) for w in said if "world_size=0" in str(w.message)]
    assert "asks for 0 ranks" in world and "torch.cuda.device_count()" in world
    assert "1/0" not in world and "multiply" not in world
    assert dist.get_world_size() == 1


def test_torchs_own_warnings_and_ours_point_at_the_users_line():
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=torch.float32):  # CPU autocast: dtype not supported
            pass
        torch.cuda.amp.GradScaler()  # torch's deprecated class calls ours through super()
    assert any("target dtype is not supported" in str(w.message) for w in said)
    assert any("GradScaler('cuda') under `%singlecard cpu`" in str(w.message) for w in said)
    assert {w.filename for w in said} == {__file__}, [(w.filename, str(w.message)) for w in said]


def test_the_gpu_count_guards_notice_says_how_to_run_a_script_that_needs_its_ranks(tmp_path):
    import runpy

    script = tmp_path / "tp.py"
    script.write_text("import sys, torch\n"
                      "if torch.cuda.device_count() < 2:\n"
                      "    sys.exit('needs an even number of GPUs')\n")
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said, pytest.raises(SystemExit):
        warnings.simplefilter("always")
        runpy.run_path(str(script))
    (guard,) = [str(w.message) for w in said if "sys.exit()" in str(w.message)]
    assert "the check at tp.py:2" in guard and "skip that check" in guard
    assert "`%singlecard cpu --ranks N`" in guard and "docs/single-card.md" in guard


def test_an_assert_that_cuda_is_available_is_named_with_what_to_pass_instead():
    parallel.enable(CPU)

    def init_device(device: str):  # timm's init_distributed_device, for `--device cuda`
        if device == "cuda":
            assert torch.cuda.is_available(), f"CUDA is not available but {device} was specified."

    with warnings.catch_warnings(record=True) as said, pytest.raises(AssertionError) as error:
        warnings.simplefilter("always")
        init_device("cuda")
    # theirs, as is (pytest rewrites asserts in this file: it adds its own lines after)
    assert str(error.value).startswith("CUDA is not available but cuda was specified.")
    (notice,) = [w for w in said if "` at " in str(w.message) and " fails: " in str(w.message)]
    assert "`assert torch.cuda.is_available()" in str(notice.message)
    assert "--device cpu" in str(notice.message) and notice.filename == __file__


def test_lightning_accelerator_gpu_is_named_at_the_users_line_with_what_to_pass_instead():
    lightning = pytest.importorskip("lightning")
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said, pytest.raises(Exception) as error:
        warnings.simplefilter("always")
        lightning.Trainer(accelerator="gpu", devices=1, logger=False)
    assert type(error.value).__name__ == "MisconfigurationException"  # Lightning's own
    (notice,) = [w for w in said if "Trainer(accelerator='gpu')" in str(w.message)]
    assert 'pass accelerator="cpu"' in str(notice.message) and notice.filename == __file__
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lightning.Trainer(accelerator="auto", logger=False, enable_progress_bar=False)
    assert not [w for w in said if "singlecard_nb" in str(w.message)]  # only asked for a GPU
