"""Training scripts of the shape people run, unchanged, under `%inspect all` + `%run` in a real
IPython shell, and under `python -m singlecard_nb` (also with a real `torchrun`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb import borrow, cli
from singlecard_nb.errors import NonFiniteError
from singlecard_nb.notebook import explain_cells

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).with_name("scripts")
TUTORIAL = ROOT / "notebooks" / "scripts"
TRAIN = TUTORIAL / "train.py"
# train.py (nanoGPT-shaped): an evaluation of 2 calls on train and 2 on val, then one call per iteration
GPT_PATHS = {"", "transformer.wte", "transformer.h.0.attn.c_proj", "transformer.h.1.mlp.2",
             "lm_head"}


@pytest.fixture
def ip(monkeypatch):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    run_magic = shell.find_magic("run")  # IPython's own %run, resolved if registered lazily
    explained: list = []
    monkeypatch.setattr(explain_cells, "display", explained.append)
    shell.explained = explained
    yield shell
    shell.run_line_magic("unload_ext", "singlecard_nb")
    assert borrow.active_owners() == []
    assert shell.magics_manager.magics["line"]["run"] == run_magic  # IPython's own again
    assert not module_globals._global_forward_pre_hooks and not module_globals._global_forward_hooks


def run(shell, cell):
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    return result


def test_a_nanogpt_shaped_script_is_recorded_and_rerunning_starts_clean_records(ip):
    run(ip, "%inspect all")
    run(ip, f"%run {TRAIN} --compile=True --max_iters=3")
    first = scn.inspectors()
    assert list(first) == ["GPT"]  # the torch.compile wrapper counts as the model it wraps
    insp = first["GPT"]
    assert insp.steps_recorded == 2 * 2 + 3
    assert GPT_PATHS <= set(insp.frame().module)  # the model's own paths, no "_orig_mod."
    assert any("torch.compile" in note for note in insp.notes)
    assert scn.inspector() is insp
    run(ip, f"%run {TRAIN} --max_iters=1")
    assert list(scn.inspectors()) == ["GPT"] and scn.inspectors()["GPT"] is not insp
    assert scn.inspectors()["GPT"].steps_recorded == 2 * 2 + 1 and not insp.active


def test_a_planted_nan_is_trapped_at_its_module_and_step_and_explained(ip):
    run(ip, "%inspect all --trap")
    run(ip, f"%run {TRAIN} --nan_iter=1")  # %run shows the script's error
    error = sys.last_value
    assert isinstance(error, NonFiniteError)
    assert (error.module, error.step, error.io) == ("transformer.h.0.attn.c_proj", 5, "output")
    from singlecard_nb.diagnosis.explain import Explanation

    explained = [shown for shown in ip.explained if isinstance(shown, Explanation)]
    assert len(explained) == 1 and "c_proj" in repr(explained[0])  # once, under the traceback
    assert scn.inspectors()["GPT"].steps_recorded == 6  # the records stay after the error


def test_a_gan_and_the_ddp_tutorial_under_single_card_mode(ip, tmp_path, capsys):
    run(ip, "%inspect all --params")
    run(ip, f"%run {SCRIPTS / 'gan.py'} 3")
    capsys.readouterr()
    run(ip, "%inspect all show")
    shown = capsys.readouterr().out
    assert "Discriminator: <Inspector Discriminator: active" in shown and "Generator:" in shown
    assert "main.2" in shown and "Sigmoid" in shown  # the summaries
    found = scn.inspectors()
    assert list(found) == ["Discriminator", "Generator"]  # called first on real data; BCELoss: no model
    assert found["Generator"].steps_recorded == 3 and found["Discriminator"].steps_recorded == 9
    assert "param" in set(found["Discriminator"].frame().io)
    run(ip, "%singlecard cpu\n%inspect all --every 16")
    run(ip, f"%run {TUTORIAL / 'multigpu_torchrun.py'} 2 5 --snapshot_path {tmp_path}/s.pt")
    found = scn.inspectors()
    assert list(found) == ["Linear"]  # found through DDP: the model it wraps
    frame = found["Linear"].frame()
    assert set(frame.module) == {""} and sorted(set(frame.step)) == list(range(0, 128, 16))
    run(ip, "%inspect all off\n%singlecard off")
    assert found["Linear"].steps_recorded == 8 and not found["Linear"].active


def test_lightning_fit_and_hugging_face_train(ip, tmp_path):
    run(ip, "%inspect all")
    run(ip, f"%run {SCRIPTS / 'lit_fit.py'} 3")
    insp = scn.inspectors()["LitAutoEncoder"]
    assert insp.steps_recorded == 3 and {"encoder.0", "decoder.0"} <= set(insp.frame().module)
    run(ip, f"%run {SCRIPTS / 'hf_train.py'} {tmp_path} 3")
    found = scn.inspectors()
    assert list(found) == ["GPT2LMHeadModel"]
    assert found["GPT2LMHeadModel"].steps_recorded == 3
    assert {"transformer.h.1.attn.c_attn", "lm_head"} <= set(found["GPT2LMHeadModel"].frame().module)


def test_bad_lines_are_usage_errors(ip):
    for line in ("all --every 0", "all sideways"):
        with pytest.raises(UsageError, match="every|sideways"):
            ip.run_line_magic("inspect", line)
    assert not module_globals._global_forward_pre_hooks


# --- the command line ---------------------------------------------------------------------
def _cli(*args, cwd=ROOT, torchrun=False):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    head = ([str(Path(sys.executable).with_name("torchrun")), "--standalone",
             "--nproc_per_node=2"] if torchrun else [sys.executable])
    return subprocess.run([*head, "-m", "singlecard_nb", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_command_line_traps_a_nan_explains_it_exits_non_zero_and_saves(tmp_path, capsys):
    status = cli.main(["--trap", "--save", str(tmp_path / "gpt.db"),
                       str(TRAIN), "--nan_iter=1"])
    stderr = capsys.readouterr().err
    assert status == 1
    assert "NonFiniteError" in stderr and "singlecard_nb.explain" in stderr
    assert "transformer.h.0.attn.c_proj" in stderr and "at step 5" in stderr
    records = scn.load(tmp_path / "gpt.db")  # saved although the script failed
    assert sorted(set(records.step)) == list(range(6))


def test_command_line_saves_after_ctrl_c_and_passes_the_scripts_exit_status_on(tmp_path):
    script = tmp_path / "stops.py"
    script.write_text("import sys, torch\nmodel = torch.nn.Linear(2, 2)\n"
                      "for step in range(3):\n    model(torch.ones(1, 2))\n"
                      "if sys.argv[1] == 'ctrl-c':\n    raise KeyboardInterrupt\n"
                      "sys.exit(int(sys.argv[1]))\n")
    assert cli.main(["--save", str(tmp_path / "a.db"), str(script), "ctrl-c"]) == 130
    assert sorted(set(scn.load(tmp_path / "a.db").step)) == [0, 1, 2]
    assert cli.main(["--inspect", str(script), "3"]) == 3


def test_command_line_device_runs_the_ddp_tutorial_single_card_then_unpins(tmp_path):
    assert cli.main(["--device", "cpu", "--every", "8", str(TUTORIAL / "multigpu_torchrun.py"),
                     "1", "5", "--snapshot_path", str(tmp_path / "s.pt")]) == 0
    assert {n: i.steps_recorded for n, i in scn.inspectors().items()} == {"Linear": 8}
    assert scn.current() is None and not scn.single_card()


def test_command_line_refuses_bad_options_before_running(capsys):
    for argv, named in ((["--every", "0", "x.py"], "--every"),
                        (["--device", "tpu9", str(SCRIPTS / "gan.py")], "--device"),
                        (["--inspect", "no_such_script.py"], "no_such_script.py"),
                        (["--colour", "x.py"], "--colour")):
        with pytest.raises(SystemExit) as exit:
            cli.main(argv)
        assert exit.value.code == 2
        assert named in capsys.readouterr().err.splitlines()[-1]


def test_command_line_runs_a_module_like_python_m(monkeypatch, capsys):
    monkeypatch.chdir(SCRIPTS)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["--inspect", "-m", "gan", "2"]) == 0
    assert "[1/2] Loss_D" in capsys.readouterr().out  # its own sys.argv
    assert {n: i.steps_recorded for n, i in scn.inspectors().items()} == {
        "Generator": 2, "Discriminator": 6}
    assert not any(i.active for i in scn.inspectors().values())


@pytest.mark.slow
def test_torchrun_job_saves_one_file_per_rank_and_compare_ranks_finds_a_desync(tmp_path):
    done = _cli("--inspect", "--params", "--save", tmp_path / "job.db",
                SCRIPTS / "ddp_gloo.py", 4, 1, torchrun=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.rank0.db", "job.rank1.db"]
    records = scn.load(tmp_path / "job.db")
    assert sorted(set(records["rank"])) == [0, 1]
    first = scn.compare_ranks(records).first
    # rank 1 changed a weight after the optimiser step of step 1: the parameters recorded at
    # the next optimiser step differ
    assert (first.rank, first.step, first.module, first.io) == (1, 2, "2", "param")
