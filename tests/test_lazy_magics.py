"""`%inspect all` + `%run` on the IPython a user installs today (9.17+ registers `%run` lazily,
as a placeholder that looks the name up again when called) and on IPython 8 (the floor lane):
in a new shell, a new terminal IPython and a new Jupyter kernel, with `%run` used before or not.
Each test starts from a new shell (conftest's `a_new_users_shell`), as a user's kernel does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from conftest import notebook_runner
from IPython.core import magic as ipython_magic
from IPython.core.interactiveshell import InteractiveShell

import singlecard_nb as scn
from singlecard_nb import borrow

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "notebooks" / "scripts" / "train.py"
LAZY_IPYTHON = hasattr(ipython_magic, "LazyMagic")  # 9.17+


def run(shell, cell: str):
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    return result


def _ipythons_own_run(shell):
    found = shell.magics_manager.magics["line"]["run"]
    assert getattr(found, "__self__", None) is shell.magics_manager.registry["ExecutionMagics"]
    return found


@pytest.mark.parametrize("run_used_before", [False, True], ids=["fresh", "run-used-before"])
def test_inspect_all_records_a_script_and_gives_back_ipythons_run(tmp_path, run_used_before):
    shell = InteractiveShell.instance()
    if LAZY_IPYTHON and not run_used_before:
        assert isinstance(shell.magics_manager.magics["line"]["run"], ipython_magic.LazyMagic)
    if run_used_before:
        (tmp_path / "hello.py").write_text("greeting = 'hi'\n")
        run(shell, f"%run {tmp_path / 'hello.py'}")
    run(shell, "%load_ext singlecard_nb")
    try:
        run(shell, "%inspect all")
        run(shell, f"%run {TRAIN} --max_iters=2")
        assert scn.inspectors()["GPT"].steps_recorded == 2 * 2 + 2

        run(shell, "%inspect all off")
        run(shell, f"%run {TRAIN} --max_iters=1")  # %run keeps working once inspection is off
        own = _ipythons_own_run(shell)
        run(shell, "%inspect all")  # and wraps again, the real %run, not itself
        run(shell, f"%run {TRAIN} --max_iters=1")
        assert scn.inspectors()["GPT"].steps_recorded == 2 * 2 + 1
    finally:
        run(shell, "%unload_ext singlecard_nb")
    assert shell.magics_manager.magics["line"]["run"] is own
    assert borrow.active_owners() == []
    run(shell, f"%run {TRAIN} --max_iters=1")  # and after unloading


def test_unloading_before_the_first_run_gives_back_a_working_run(tmp_path):
    shell = InteractiveShell.instance()
    run(shell, "%load_ext singlecard_nb")
    run(shell, "%inspect all")
    run(shell, "%unload_ext singlecard_nb")
    (tmp_path / "hello.py").write_text("greeting = 'hi'\n")
    run(shell, f"%run {tmp_path / 'hello.py'}")
    assert shell.user_ns["greeting"] == "hi"
    _ipythons_own_run(shell)


@pytest.mark.slow
def test_a_new_terminal_ipython_records_the_script():
    commands = textwrap.dedent(f"""
        %load_ext singlecard_nb
        %singlecard cpu
        %inspect all --trap --live
        %run {TRAIN} --max_iters=2
        import singlecard_nb as scn
        print("steps", scn.inspectors()["GPT"].steps_recorded)
        %inspect all off
        %unload_ext singlecard_nb
        %run {TRAIN} --max_iters=1
        print("ran again")
    """)
    done = subprocess.run([sys.executable, "-m", "IPython", "--quick", "--no-banner",
                           "--HistoryManager.hist_file=:memory:", "--colors=nocolor"],
                          input=commands, capture_output=True, text=True, timeout=300)
    assert "Error" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "steps 6" in done.stdout and "ran again" in done.stdout, done.stdout
    # --live in a terminal: no update can be drawn in place, so the table is printed once, at
    # the end (each update printed anew had been a 25-line table per step)
    assert done.stdout.count("live inspection · step") == 1, done.stdout


@pytest.mark.slow
def test_a_new_jupyter_kernel_records_the_script(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext singlecard_nb\n%singlecard cpu",
        "%inspect all --live --trap",
        f"%run {TRAIN} --max_iters=2",
        "import singlecard_nb as scn\nprint('steps', scn.inspectors()['GPT'].steps_recorded)",
        f"%inspect all off\n%unload_ext singlecard_nb\n%run {TRAIN} --max_iters=1\nprint('ran again')",
    )]
    path = tmp_path / "fresh_kernel.ipynb"
    nbformat.write(notebook, path)
    report = notebook_runner().execute(path, timeout=300)
    assert not report.errors, report
    outputs = [o for cell in report.nb.cells for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "steps 6" in text and "ran again" in text, text


@pytest.mark.parametrize("first_off", ["%inspect all off", "%singlecard cpu --ranks 1"])
def test_two_run_wrappers_given_back_in_either_order_leave_ipythons_run(first_off):
    shell = InteractiveShell.instance()
    run(shell, "%load_ext singlecard_nb")
    try:
        run(shell, "%singlecard cpu --ranks 2")
        run(shell, "%inspect all")  # wraps the ranks' wrapper, which wraps IPython's %run
        run(shell, first_off)
        run(shell, "%inspect all off" if first_off != "%inspect all off" else
            "%singlecard cpu --ranks 1")
        own = _ipythons_own_run(shell)  # neither wrapper is left, whichever went first
    finally:
        run(shell, "%unload_ext singlecard_nb")
    assert shell.magics_manager.magics["line"]["run"] is own
    assert borrow.active_owners() == []
