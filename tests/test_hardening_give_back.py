"""Issue 31, "give everything back": what a stop from another thread, a dropped model, a
closed process group and a hung compiler used to leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from conftest import fsdp2_on_cpu
from torch import nn

import singlecard_nb as scn


def _top_saved_hooks():
    """The reader of this thread's saved-tensor hook stack (torch >= 2.7), or skip."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        pytest.skip(f"torch {torch.__version__} has no way to read autograd's saved-tensor "
                    "hook stack")
    return top


class _Blocks(nn.Module):
    """Saves a tensor for backward, then waits until told to finish its forward: `after` says
    how (saving nothing more, saving again, or raising)."""

    def __init__(self, entered: threading.Event, go_on: threading.Event, after: str):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.entered, self.go_on, self.after = entered, go_on, after

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        self.entered.set()
        assert self.go_on.wait(30)
        if self.after == "raises" and x.shape[0] == 2:
            raise ValueError("the forward fails after the stop")
        return torch.tanh(y) if self.after == "saves" else y * 2


@pytest.mark.parametrize("after", ["returns", "saves", "raises"])
def test_memory_stop_from_another_thread_gives_the_training_threads_hooks_back(after):
    top = _top_saved_hooks()
    entered, go_on = threading.Event(), threading.Event()
    model = _Blocks(entered, go_on, after)
    insp = scn.inspect(model, memory=True)
    seen = {}

    def train():
        seen["before"] = top(False)
        try:
            try:
                model(torch.randn(2, 4)).sum().backward()
            except ValueError:
                assert after == "raises"
            seen["after"] = top(False)
            model(torch.randn(3, 4)).sum().backward()  # an unrecorded call after the stop
            seen["later"] = top(False)
        except BaseException as e:
            seen["error"] = e

    thread = threading.Thread(target=train)
    try:
        thread.start()
        assert entered.wait(30)
        with pytest.warns(UserWarning, match="another thread"):
            insp.stop()  # the training thread's call is still open
    finally:
        go_on.set()
        thread.join(30)
    assert "error" not in seen, seen.get("error")
    assert seen["before"] is None
    assert seen["after"] is None, "the training thread's saved-tensor hooks stayed pushed"
    assert seen["later"] is None
    assert any("another thread" in note for note in insp.notes)
    assert not model._forward_hooks and not model._forward_pre_hooks  # nothing stays on it


_STOP_ELSEWHERE = textwrap.dedent("""
    import threading, torch
    from torch import nn
    import singlecard_nb as scn

    entered, go_on = threading.Event(), threading.Event()

    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = torch.tanh(self.lin(x))
            entered.set()
            go_on.wait(30)
            return y * 2

    model = Blocks()
    insp = scn.inspect(model, memory=True)
    def stopper():
        entered.wait(30)
        insp.stop()
        go_on.set()
    t = threading.Thread(target=stopper)
    t.start()
    model(torch.randn(2, 4)).sum().backward()  # in the main thread: its hooks last to exit
    t.join()
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    print("hooks left" if top is not None and top(False) is not None else "done")
""")


def test_memory_stop_from_another_thread_then_exit_does_not_abort():
    # Once: "hooks left" was certain on the old code; the abort at exit it led to was not (it
    # was seen in 3 of 5 runs elsewhere, never here), so more runs would add time, not a check.
    run = subprocess.run([sys.executable, "-c", _STOP_ELSEWHERE], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done" in run.stdout, run.stdout  # not "hooks left" in the main thread


_SWEEP = textwrap.dedent("""
    import gc, weakref
    import torch
    from torch import nn

    freed = []
    for width in range(2, 8):
        model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        ref = weakref.ref(model)
        del model, opt
        gc.collect()
        freed.append(ref() is None)
""")

_COMPILED = textwrap.dedent("""
    import weakref
    import torch
    from torch import nn

    model = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    model(torch.randn(2, 4)).sum().backward()
    REFS.append(weakref.ref(model._orig_mod))
    del model
""")


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    yield ip
    ip.run_line_magic("unload_ext", "singlecard_nb")


def _run(ip, cell):
    result = ip.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec


def test_inspect_all_lets_each_model_of_a_sweep_go_and_keeps_its_records(shell, tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(_SWEEP)
    _run(shell, "%inspect all")
    _run(shell, f"%run {script}")
    assert shell.user_ns["freed"] == [True] * 6, "a dropped model was kept alive"
    found = scn.inspectors()
    assert list(found) == ["Sequential"] + [f"Sequential#{i}" for i in range(2, 7)]
    for insp in found.values():  # the records outlive their models
        frame = insp.frame()
        assert insp.steps_recorded == 2 and {"", "0", "2"} <= set(frame.module)
    assert not any(insp.active for insp in found.values())  # stopped, once their model went
    assert found["Sequential#6"].frame().query("module == '0'")["shape"].iloc[0] == (8, 7)
    _run(shell, "%inspect all off")


def test_inspect_all_a_compiled_model_of_one_run_is_gone_after_the_next(shell, tmp_path):
    import gc

    script = tmp_path / "compiled.py"
    script.write_text(_COMPILED)
    shell.user_ns["REFS"] = refs = []
    _run(shell, "%inspect all")
    _run(shell, f"%run -i {script}")  # -i: the script sees REFS
    assert list(scn.inspectors()) == ["Sequential"]
    _run(shell, f"%run -i {script}")
    gc.collect()
    assert refs[0]() is None, "the compiled model of the first %run survived the second"
    _run(shell, "%inspect all off")


_FSDP2 = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
""")


def _gloo_listeners_torch_alone_keeps(tmp_path) -> int:
    """The gloo listeners a process without this package still has after the same script ran
    three times and dropped its model: torch 2.15's FSDP2 keeps one for the process (2.13: none).
    The rendezvous store's own port is not counted: under a pin it is never opened here."""
    port = 29500 + os.getpid() % 400
    code = (f"import gc, os\nos.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{port}', "
            "RANK='0', WORLD_SIZE='1')\n"
            f"for _ in range(3):\n    exec({_FSDP2!r}, {{}})\ngc.collect()\n"
            "from singlecard_nb.parallel.sockets import listening_sockets\n"
            f"print(sum(not a.endswith(':{port}') for a in listening_sockets().values()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@fsdp2_on_cpu
def test_fsdp2_runs_under_singlecard_cpu_leave_no_gloo_listener(shell, tmp_path):
    import gc

    from singlecard_nb.parallel.sockets import listening_sockets

    if not sys.platform.startswith("linux"):
        pytest.skip("listening sockets are read from /proc (Linux)")
    pytest.importorskip("torch.distributed.fsdp")
    kept_by_torch = _gloo_listeners_torch_alone_keeps(tmp_path)
    script = tmp_path / "fsdp2.py"
    script.write_text(_FSDP2)
    _run(shell, "%singlecard cpu")
    try:
        before = set(listening_sockets())
        after = []
        for _ in range(3):
            _run(shell, f"%run {script}")
            gc.collect()
            after.append(set(listening_sockets()) - before)
        # the last run's model (still in the namespace) holds its group: one listener at most
        # beyond what torch keeps for the process; none more per %run
        assert all(len(opened) <= 1 + kept_by_torch for opened in after), (after, kept_by_torch)
        for name in ("model", "opt"):
            shell.user_ns.pop(name, None)
        shell.clear_main_mod_cache()  # %run keeps the script's namespace for pickling too
        gc.collect()
        left = set(listening_sockets()) - before
        assert len(left) <= kept_by_torch, f"a gloo listener outlived its runs: {left}"
    finally:
        _run(shell, "%singlecard off")
