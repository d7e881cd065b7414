"""Ctrl-C landing while hooks are being installed leaves nothing behind: the hook and its
owner's note of it are one step (borrow.uninterrupted), and the KeyboardInterrupt still comes."""

from __future__ import annotations

import signal

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_globals

import singlecard_nb as scn
from singlecard_nb import borrow
from singlecard_nb.inspection.finding import finder_hook
from singlecard_nb.inspection.recording import compile_watch


def global_hooks() -> int:
    return (len(module_globals._global_forward_pre_hooks)
            + len(module_globals._global_forward_hooks))


def ctrl_c_after(fn):
    """`fn`, followed by a real SIGINT: Python raises KeyboardInterrupt at the next bytecode,
    in the caller, right after `fn` returned (where a Ctrl-C lands at worst)."""
    def interrupted(*args, **kwargs):
        result = fn(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return result

    return interrupted


@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    yield
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# What an earlier test in this process left (an optimizer hook whose removal waits for the
# next step) is not this test's to give back, so each test compares the owners against those
# it started from.
_before: dict = {}


@pytest.fixture(autouse=True)
def state_before():
    _before.update(owners=[o.name for o in borrow.active_owners()])


def ours_in(function) -> bool:
    """Whether a wrapper of ours is in `function`'s chain of `__wrapped__`. Not "is it
    wrapped": importing lightning wraps torch.compile for good (lightning/fabric/wrappers.py,
    `torch.compile = _capture_compile_kwargs(torch.compile)`), from the collection of any test
    file that imports it; that wrapper is Lightning's, not ours to give back."""
    while function is not None:
        code = getattr(function, "__code__", None)
        if code is not None and code.co_filename == compile_watch.__file__:
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def nothing_left(model: nn.Module) -> None:
    assert global_hooks() == 0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(not getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
    assert [o.name for o in borrow.active_owners()] == _before["owners"]
    assert not ours_in(torch.compile) and not ours_in(nn.Module.compile)  # torch's own again


def test_the_check_sees_our_torch_compile_wrapper_and_not_lightnings(monkeypatch):
    import functools

    def foreign(*args, **kwargs):  # a library's wrapper, as Lightning's import makes
        return foreign.__wrapped__(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", functools.update_wrapper(foreign, torch.compile))
    model = nn.Linear(2, 2)
    insp = scn.inspect(model)
    try:
        assert ours_in(torch.compile) and ours_in(nn.Module.compile)
    finally:
        insp.stop()
    assert not ours_in(torch.compile) and torch.compile is foreign


def test_ctrl_c_right_after_a_parameter_hook_is_registered_leaves_none(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    original = torch.Tensor.register_post_accumulate_grad_hook
    monkeypatch.setattr(torch.Tensor, "register_post_accumulate_grad_hook", ctrl_c_after(original))
    with pytest.raises(KeyboardInterrupt):
        scn.inspect(model, grads=True)
    monkeypatch.undo()
    nothing_left(model)
    assert scn.inspector(model) is None or not scn.inspector(model).active


def test_ctrl_c_in_the_torch_compile_patch_leaves_no_global_probe_hook(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 3))
    monkeypatch.setattr(compile_watch._CompileListeners, "install",
                        ctrl_c_after(compile_watch._CompileListeners.install))
    with pytest.raises(KeyboardInterrupt):
        scn.inspect(model)
    monkeypatch.undo()
    nothing_left(model)
    assert not compile_watch.compile_listeners.listening()


def test_ctrl_c_right_after_inspect_all_registers_its_finder_leaves_none(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 3))
    monkeypatch.setattr(finder_hook, "register_module_forward_pre_hook",
                        ctrl_c_after(finder_hook.register_module_forward_pre_hook))
    with pytest.raises(KeyboardInterrupt):
        scn.inspect_all()
    monkeypatch.undo()
    nothing_left(model)


def test_ctrl_c_while_an_owner_gives_back_still_gives_everything_back():
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    insp = scn.inspect(model, grads=True)
    first = model[0].weight._post_accumulate_grad_hooks
    hook_id = next(iter(first))
    handle_owner = insp._attach._owner
    # the first undo to run (the last one registered) is followed by a Ctrl-C
    label, undo = handle_owner._undo[-1]
    handle_owner._undo[-1] = (label, ctrl_c_after(undo))
    with pytest.raises(KeyboardInterrupt):
        insp.stop()
    assert hook_id not in first
    nothing_left(model)
    assert not insp.active


# --- Ctrl-C at any line of a training step: torch's thread-local settings stay the user's -----
PACKAGE = scn.__file__.rpartition("/")[0]
GRAD_MODE = torch.autograd.grad_mode.__file__


def thread_state() -> tuple:
    """What torch keeps per thread and a hook of ours may touch."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.get_default_dtype(), torch.get_default_device())


class CtrlC:
    """A real SIGINT (what Ctrl-C sends) at the n-th line event of the chosen frames: those of
    torch's grad_mode.py (no_grad's __enter__/__exit__, set_grad_enabled) entered from ours,
    or, with `ours`, our own. `seen`: how many such lines the last run ran."""

    def __init__(self, ours: bool):
        self.ours, self.at, self.seen = ours, None, 0

    def _chosen(self, frame) -> bool:
        name, caller = frame.f_code.co_filename, frame.f_back
        if name == GRAD_MODE:  # entered or left by us, directly or through grad_mode itself
            if caller is not None and caller.f_code.co_filename.startswith(PACKAGE):
                return frame.f_code.co_name in ("__enter__", "__exit__")  # not the __init__
            while caller is not None and caller.f_code.co_filename == GRAD_MODE:
                frame, caller = caller, caller.f_back
            return (caller is not None and caller.f_code.co_filename.startswith(PACKAGE)
                    and frame.f_code.co_name in ("__enter__", "__exit__"))
        return self.ours and name.startswith(PACKAGE)

    def _trace(self, frame, event, arg):
        if event == "call":
            return self._trace if self._chosen(frame) else None
        if event == "line":
            self.seen += 1
            if self.seen == self.at:
                signal.raise_signal(signal.SIGINT)
        return self._trace

    def run(self, fn, at=None) -> None:
        import sys

        self.at, self.seen = at, 0
        sys.settrace(self._trace)
        try:
            fn()
        finally:
            sys.settrace(None)


@pytest.mark.parametrize("ours", [False, True], ids=["in torch's no_grad", "in our lines"])
def test_ctrl_c_at_any_line_of_an_inspected_step_leaves_grad_mode_on(ours, monkeypatch):
    from singlecard_nb.inspection.kernel import native

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 4)  # 4 features of 32 samples: per-channel statistics too
    # without the kernel (a process whose build is not ready) small tensors are staged, in
    # an inference_mode(False) block of ours
    monkeypatch.setattr(native, "kernels", dict)

    def step():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.inference_mode():  # an evaluation: our inference_mode(False) inside it
            model(x)

    insp = scn.inspect(model, grads=True, params=True)
    try:
        step()
        ctrl_c, user = CtrlC(ours), thread_state()
        ctrl_c.run(step)
        lines = ctrl_c.seen
        assert lines > 0
        # every line of torch's grad_mode entered from ours; of our own, 40 spread over a step
        for at in range(1, lines + 1, 1 if not ours else max(1, lines // 40)):
            try:
                ctrl_c.run(step, at)
            except KeyboardInterrupt:
                pass
            assert thread_state() == user, f"Ctrl-C at line event {at} of {lines}"
            step()  # raised "element 0 of tensors does not require grad" with grad mode off
    finally:
        insp.stop()
    nothing_left(model)
