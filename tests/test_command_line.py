"""`python -m singlecard_nb` at its edges: what python does with a script, it does; what it
cannot do, it says before the script runs; the records land where the command line said."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import singlecard_nb as scn
from singlecard_nb import cli

ROOT = Path(__file__).resolve().parent.parent
_STEPS = ("import torch\nmodel = torch.nn.Linear(2, 2)\nfor _ in range({}):\n"
          "    model(torch.ones(1, 2))\n")


def _script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_folder_with_main_runs_as_python_runs_it(tmp_path, capsys):
    folder = tmp_path / "app"
    _script(folder, "__main__.py", "import sys\nprint('ran', sys.argv[1:])\n")
    assert cli.main(["--inspect", str(folder), "x"]) == 0
    assert "ran ['x']" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit:
        cli.main(["--inspect", str(tmp_path / "empty")])
    assert exit.value.code == 2
    assert "can't find '__main__' module" in capsys.readouterr().err


def test_a_syntax_error_and_a_missing_module_print_what_python_prints(tmp_path, capsys):
    bad = _script(tmp_path, "bad.py", "x = 1\ndef (:\n")
    assert cli.main(["--inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    python = subprocess.run([sys.executable, str(bad)], capture_output=True, text=True)
    assert err.strip() == python.stderr.strip()  # no frames of cli/ or runpy
    assert cli.main(["--inspect", "-m", "no_such_module_32"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"{sys.executable}: No module named no_such_module_32"


def test_a_scripts_traceback_starts_at_the_script(tmp_path, capsys):
    boom = _script(tmp_path, "boom.py", "def f():\n    raise ValueError('boom')\nf()\n")
    assert cli.main(["--inspect", str(boom)]) == 1
    err = capsys.readouterr().err
    assert "boom.py" in err and "ValueError: boom" in err
    assert f"singlecard_nb{os.sep}cli" not in err and "runpy" not in err


def test_a_bad_save_path_is_refused_before_the_script_runs(tmp_path, capsys):
    ran = tmp_path / "ran"
    script = _script(tmp_path, "s.py", f"open({str(ran)!r}, 'w').close()\n")
    with pytest.raises(SystemExit) as exit:
        cli.main(["--save", str(tmp_path / "x{y}.db"), str(script)])
    assert exit.value.code == 2
    assert "argument --save" in capsys.readouterr().err.splitlines()[-1]
    assert not ran.exists()


def test_a_model_class_with_a_slash_in_its_name_saves(tmp_path):
    script = _script(tmp_path, "s.py", "import torch\nA = type('a/b', (torch.nn.Linear,), {})\n"
                     "A(2, 2)(torch.ones(1, 2))\ntorch.nn.Conv1d(1, 1, 1)(torch.ones(1, 1, 2))\n")
    assert cli.main(["--save", str(tmp_path / "run.db"), str(script)]) == 0
    assert len(scn.load(tmp_path / "run.a-b.db")) > 0


def test_a_script_that_changes_folder_and_clears_sys_path_saves_where_asked(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = _script(tmp_path, "s.py", _STEPS.format(2) + "import os, sys\nos.makedirs('sub')\n"
                     "os.chdir('sub')\nsys.path.clear()\n")
    path = list(sys.path)
    assert cli.main(["--save", "run.db", str(script)]) == 0
    assert sys.path == path  # given back whole
    assert sorted(set(scn.load(tmp_path / "run.db").step)) == [0, 1]
    assert not (tmp_path / "sub" / "run.db").exists()


def test_a_failed_save_makes_the_exit_status_one(tmp_path, capsys):
    script = _script(tmp_path, "s.py", _STEPS.format(1))
    (tmp_path / "file").write_text("")  # a file where the save needs a folder
    assert cli.main(["--save", str(tmp_path / "file" / "run.db"), str(script)]) == 1
    assert "could not save records" in capsys.readouterr().err
    failing = _script(tmp_path, "f.py", _STEPS.format(1) + "import sys\nsys.exit(3)\n")
    assert cli.main(["--save", str(tmp_path / "file" / "run.db"), str(failing)]) == 3


def test_a_script_that_inspects_for_itself_gets_its_records_saved(tmp_path):
    own = _script(tmp_path, "own.py", "import torch, singlecard_nb as scn\n"
                  "finder = scn.inspect_all()\n" + _STEPS.format(4) + "finder.stop()\n")
    assert cli.main(["--save", str(tmp_path / "all.db"), str(own)]) == 0
    assert sorted(set(scn.load(tmp_path / "all.db").step)) == [0, 1, 2, 3]
    one = _script(tmp_path, "one.py", "import torch, singlecard_nb as scn\n"
                  "model = torch.nn.Linear(2, 2)\nwith scn.inspect(model):\n"
                  "    for _ in range(3):\n        model(torch.ones(1, 2))\n")
    assert cli.main(["--save", str(tmp_path / "one.db"), str(one)]) == 0
    assert sorted(set(scn.load(tmp_path / "one.db").step)) == [0, 1, 2]


def test_a_scripts_own_inspector_started_after_the_first_call_is_the_one_saved(tmp_path):
    # the finder's inspector records the first call; the script's own replaces it: saved whole
    late = _script(tmp_path, "late.py", "import torch, singlecard_nb as scn\n"
                   "model = torch.nn.Linear(2, 2)\nmodel(torch.ones(1, 2))\n"
                   "insp = scn.inspect(model, grads=True)\nfor _ in range(3):\n"
                   "    model(torch.ones(1, 2)).sum().backward()\n")
    try:
        with pytest.warns(UserWarning, match="replaces the inspector already recording"):
            assert cli.main(["--save", str(tmp_path / "late.db"), str(late)]) == 0
    finally:
        scn.inspectors()["Linear"].stop()  # the script's own, which it never stopped
    frame = scn.load(tmp_path / "late.db")
    assert sorted(set(frame.step)) == [0, 1, 2] and "grad" in set(frame.io)  # its own options


def test_an_abbreviated_option_is_refused_by_name(tmp_path, capsys):
    script = _script(tmp_path, "s.py", "")
    with pytest.raises(SystemExit) as exit:
        cli.main(["--dev", "cpu", str(script)])
    assert exit.value.code == 2
    assert "--dev: write the option in full (--device)" in capsys.readouterr().err


def test_a_forked_child_leaves_the_parents_record_alone(tmp_path):
    script = _script(tmp_path, "forks.py", _STEPS.format(10) + "import os\npid = os.fork()\n"
                     "if pid == 0:\n    model(torch.ones(1, 2))\nelse:\n    os.waitpid(pid, 0)\n")
    done = subprocess.run([sys.executable, "-m", "singlecard_nb", "--save",
                           str(tmp_path / "run.db"), str(script)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(set(scn.load(tmp_path / "run.db").step)) == list(range(10))
    assert "forked from" in done.stderr and "does not save its records" in done.stderr


def test_notices_on_a_terminal_point_at_no_magic(tmp_path, recwarn):
    # `%singlecard status` exists in IPython only: a terminal run's notices say "said once"
    moved = _script(tmp_path, "moved.py", "import torch\ntorch.nn.Linear(2, 2).to(3)\n")
    assert cli.main(["--device", "cpu", str(moved)]) == 0
    said = [str(w.message) for w in recwarn if "singlecard_nb:" in str(w.message)]
    assert said and all(m.endswith("[said once]") for m in said), said


def test_loading_the_save_path_of_two_models_names_their_files(tmp_path):
    two = _script(tmp_path, "two.py", "import torch\nfor width in (2, 3):\n"
                  "    model = torch.nn.Linear(width, 1)\n    model(torch.ones(1, width))\n")
    assert cli.main(["--save", str(tmp_path / "run.db"), str(two)]) == 0
    assert sorted(p.name for p in tmp_path.glob("run*.db")) == ["run.Linear-2.db", "run.Linear.db"]
    with pytest.raises(FileNotFoundError) as refused:
        scn.load(tmp_path / "run.db")
    assert "that run saved one file per model (run.Linear-2.db, run.Linear.db)" in str(refused.value)
    assert len(scn.load(tmp_path / "run.Linear.db")) > 0


def test_a_process_group_the_script_left_formed_is_destroyed_before_python_exits(tmp_path):
    # torch asks scripts to destroy their group; one that does not may be aborted at exit by
    # gloo's threads ("terminate called without an active exception", status -6 under
    # torchrun). The command line ends it after the script; the script's own atexit handlers,
    # which run later, find it gone.
    from singlecard_nb.job import free_port

    script = _script(tmp_path, "leaves_group.py", (
        "import atexit\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\n"
        "atexit.register(lambda: print('formed at exit:', dist.is_initialized()))\n"
        "print('sum', t.item())\n"))
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "singlecard_nb", "--inspect", str(script)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sum 1.0" in done.stdout and "formed at exit: False" in done.stdout
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=120)  # python itself leaves it to the teardown
    assert "formed at exit: True" in plain.stdout
