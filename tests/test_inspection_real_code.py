"""Inspection under everyday training code: Ctrl-C, inference_mode, checkpointing, threads,
compiled and scripted models, shared structures, train vs eval (issue 9)."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch
from conftest import hook_tables
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils.checkpoint import checkpoint

import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# --- 1. Ctrl-C inside a forward pass ------------------------------------------------------------
class InterruptOnce(nn.Module):
    """Raises KeyboardInterrupt (what Ctrl-C raises) on the calls listed in `at`."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = set(at), 0

    def forward(self, x):
        self.calls += 1
        if self.calls in self.at:
            raise KeyboardInterrupt
        return x


@pytest.mark.parametrize("interrupted_call", [1, 2], ids=["recorded-step", "skipped-step"])
def test_ctrl_c_inside_a_submodule_then_the_next_forward_starts_a_clean_step(interrupted_call):
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), InterruptOnce({interrupted_call})))
    insp = scn.inspect(model, every=2)
    try:
        for _ in range(6):
            try:
                model(torch.randn(1, 2))
            except KeyboardInterrupt:
                pass
        # every=2 still records steps 0, 2, 4: the interrupted call was one step, not a hang
        assert sorted(insp.frame().step.unique()) == [0, 2, 4]
        assert insp.steps_recorded == 3
        model(torch.randn(1, 2))  # step 6, recorded: each module once, call 0
        rows = insp.last_step().query("io == 'output'")
        assert rows.module.tolist() == ["0", "1.0", "1.1", "1", ""]
        assert set(rows.call) == {0}
        assert module_globals._global_forward_hooks == {}  # between steps: no global hook
    finally:
        insp.stop()
    assert module_globals._global_forward_hooks == {}


def test_ctrl_c_keeps_recursive_root_calls_in_one_step():
    class Tree(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf = nn.Linear(2, 2)
            self.stop = InterruptOnce({2})

        def forward(self, x, depth=2):
            x = self.stop(self.leaf(x))
            return self(x, depth - 1) if depth else x  # the root calls itself

    model = Tree()
    with scn.inspect(model) as insp:  # interrupted at the 2nd call of `stop`, inside a recursion
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(1, 2))
        model(torch.randn(1, 2))
        model(torch.randn(1, 2))
    df = insp.frame()
    assert sorted(df.step.unique()) == [0, 1, 2]
    assert df.query("step == 2 and module == 'leaf'")["call"].tolist() == [0, 1, 2]


# --- 2. inference_mode --------------------------------------------------------------------------
def test_inference_mode_forwards_are_recorded():
    model, x = mlp(), torch.randn(5, 8)
    with torch.inference_mode():
        expected = model(x)
    with scn.inspect(model) as insp:
        with torch.inference_mode():
            out = model(x)
            out2 = model(x)
    assert torch.equal(out, expected) and torch.equal(out2, expected)
    df = insp.frame()
    assert insp.errors == []
    assert df.query("io == 'output'").module.tolist() == ["0", "1", "2", ""] * 2
    last = df.query("step == 1 and module == ''  and io == 'output'").iloc[0]
    assert last["max"] == expected.max().item()
    assert last["mean"] == pytest.approx(expected.mean().item(), rel=1e-6)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch-reductions"])
def test_a_step_mixing_inference_mode_and_normal_calls_keeps_every_row(kernel, monkeypatch):
    # Small tensors are staged in buffers reused across the step: one made under inference_mode
    # must still take the normal call's copy (torch refuses in-place writes to inference tensors).
    if kernel:
        native.wait(120)  # built in the background; without a compiler this is torch again
    else:
        monkeypatch.setattr(native, "kernels", lambda: {})
    model, x = mlp(), torch.randn(5, 8)
    with scn.inspect(model, steps="manual") as insp:
        with torch.inference_mode():
            model(x)
        model(x)
        insp.step()
    assert insp.errors == []
    assert len(insp.frame().query("io == 'output'")) == 8


# --- 3. gradient checkpointing -----------------------------------------------------------------
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpointed_model_records_one_step_per_iteration_with_its_gradients(reentrant):
    def rows(run):
        model = mlp()
        with scn.inspect(model, grads=True) as insp:
            for i in range(2):
                x = torch.randn(3, 8, generator=torch.Generator().manual_seed(i), requires_grad=True)
                run(model, x).square().sum().backward()
        return insp.frame()

    plain = rows(lambda model, x: model(x))
    ckpt = rows(lambda model, x: checkpoint(model, x, use_reentrant=reentrant))
    assert sorted(ckpt.step.unique()) == [0, 1]
    key = ["step", "module", "io", "index", "call"]
    for io in ("output", "grad", "param_grad"):
        want = plain[plain.io == io].sort_values(key)
        got = ckpt[ckpt.io == io].sort_values(key)
        assert got[key].values.tolist() == want[key].values.tolist(), io
    grads = ckpt[ckpt.io == "grad"].sort_values(key)
    assert grads["absmax"].tolist() == pytest.approx(
        plain[plain.io == "grad"].sort_values(key)["absmax"].tolist())


def test_checkpointed_blocks_inside_the_model_keep_their_gradient_rows():
    class Blocks(nn.Module):  # how Hugging Face models checkpoint each layer
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=True)
            return x

    torch.manual_seed(0)
    model = Blocks()
    with scn.inspect(model, grads=True) as insp:
        for _ in range(2):
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    df = insp.frame()
    assert sorted(df.step.unique()) == [0, 1]
    grads = df[df.io == "grad"]
    for step in (0, 1):
        modules = set(grads[grads.step == step].module)
        assert {"layers.0", "layers.0.0", "layers.2.1", ""} <= modules, step
    assert set(df[df.io == "output"].groupby(["step", "module"]).size()) == {1}  # no duplicates


# --- 4. hooks are given back --------------------------------------------------------------------
class PositionTable(nn.Module):
    """Returns one of its own Parameters, as positional embeddings and CLS tokens do."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(4, 3))

    def forward(self):
        return self.pos


class WithPositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.positions = PositionTable()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        return self.proj(x + self.positions())


def test_torch_hook_tables_are_left_exactly_as_found():
    model = WithPositions()
    before = hook_tables(model)
    with scn.inspect(model, grads=True, inputs=True) as insp:
        for _ in range(50):
            model(torch.randn(4, 3)).sum().backward()
            assert len(model.positions.pos._backward_hooks or {}) <= 1  # not one more per step
    assert insp.steps_recorded == 50
    assert "param_grad" in set(insp.frame().io)
    assert len(insp.frame().query("module == 'positions' and io == 'grad'")) == 50
    assert hook_tables(model) == before


# --- 5. threads ---------------------------------------------------------------------------------
def test_training_in_a_background_thread_while_reading_frames():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    errors: list[BaseException] = []
    steps = 300

    def train():
        try:
            for _ in range(steps):
                opt.zero_grad()
                model(torch.randn(4, 8)).square().mean().backward()
                opt.step()
        except BaseException as e:  # noqa: B036 - a test collecting what reached user code
            errors.append(e)

    with scn.inspect(model, grads=True) as insp:
        worker = threading.Thread(target=train)
        worker.start()
        frames = 0
        while worker.is_alive() or frames < 20:
            df = insp.frame()  # must never raise
            frames += 1
            assert list(df.columns) == list(scn.inspection.engine.COLUMNS)
            outputs = df[df.io == "output"]
            # a consistent snapshot: no row twice, every output row with its statistics
            assert not df.duplicated(["step", "module", "call", "io", "index"]).any()
            assert outputs["max"].notna().all()
            insp.last_step(), insp.summary()
        worker.join()
    assert errors == [] and insp.errors == []
    df = insp.frame()
    assert df.step.nunique() == steps == insp.steps_recorded
    per_step = df[df.io == "output"].groupby("step").size()
    assert set(per_step) == {4}  # every step complete: 3 layers and the root


def test_calls_from_a_second_thread_during_a_step_are_not_mixed_in():
    release, entered = threading.Event(), threading.Event()

    class Gate(nn.Module):
        def forward(self, x):
            if threading.current_thread() is not threading.main_thread():
                entered.set()
                release.wait(10)
            return x

    model = nn.Sequential(nn.Linear(2, 2), Gate())
    with scn.inspect(model) as insp:
        worker = threading.Thread(target=lambda: model(torch.randn(1, 2)))
        worker.start()
        entered.wait(10)
        with pytest.warns(UserWarning, match="two threads"):
            model(torch.randn(3, 2))  # while the worker's call is inside the model
        release.set()
        worker.join()
        model(torch.randn(5, 2))
    df = insp.frame()
    assert df.query("module == '0' and io == 'output'")["shape"].tolist() == [(1, 2), (5, 2)]
    assert sorted(df.step.unique()) == [0, 1]


# --- 7. compiled and scripted models -----------------------------------------------------------
def test_model_compiled_in_place_after_a_first_run_records_every_module():
    model = mlp()
    model.compile(backend="eager")
    x = torch.randn(2, 8)
    expected = model(x)  # compiled without hooks: the normal notebook order
    with pytest.warns(UserWarning, match="run eagerly while inspected"):
        insp = scn.inspect(model)
    with insp:
        out = model(x)
    assert torch.equal(out, expected)
    assert insp.frame().query("io == 'output'").module.tolist() == ["0", "1", "2", ""]
    assert model._compiled_call_impl is not None  # compiled again after stop


def test_torch_compile_wrapper_records_every_module():
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 8)
    expected = compiled(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with scn.inspect(compiled, grads=True) as insp:
            out = compiled(x)
            out.sum().backward()
            compiled(x)
    # said once, and nothing else: not torch's note on global hooks either
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "run eagerly while inspected" in str(caught[0].message)
    assert torch.equal(out, expected)
    df = insp.frame()
    assert df.query("step == 1 and io == 'output'").module.tolist() == ["0", "1", "2", ""]
    assert "grad" in set(df.io) and insp.model is model
    assert scn.inspector(compiled) is insp


@pytest.mark.parametrize("make", [
    lambda m: torch.jit.script(m), lambda m: torch.jit.trace(m, torch.randn(2, 8))],
    ids=["script", "trace"])
def test_torchscript_models_get_a_clear_message(make):
    scripted = make(mlp())
    with pytest.raises(TypeError, match="TorchScript.*inspect the nn.Module before"):
        scn.inspect(scripted)


def test_a_scripted_submodule_is_recorded_as_one_module_and_said_once():
    model = nn.Sequential(nn.Linear(4, 4), torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU())))
    with pytest.warns(UserWarning, match="'1' is a TorchScript module"):
        insp = scn.inspect(model)
    with insp:
        model(torch.randn(2, 4))
    assert insp.frame().query("io == 'output'").module.tolist() == ["0", "1", ""]


# --- 9. smaller promises -----------------------------------------------------------------------
class Decoder(nn.Module):
    def forward(self, ids, encoder_outputs=None, mask=None):
        return encoder_outputs[0] * 2


class EncoderDecoder(nn.Module):  # T5 passes encoder_outputs=(hidden, ...) to its decoder
    def __init__(self):
        super().__init__()
        self.dec = Decoder()

    def forward(self, ids):
        return self.dec(ids, encoder_outputs=(torch.ones(2, 3), {"a": torch.zeros(1)}),
                        mask=torch.ones(2))


def test_keyword_inputs_keep_their_inner_index():
    model = EncoderDecoder()
    with scn.inspect(model, inputs=True) as insp:
        model(torch.arange(3))
    rows = insp.frame().query("module == 'dec' and io == 'input'")
    assert rows["index"].tolist() == ["[0]", "['encoder_outputs'][0]",
                                      "['encoder_outputs'][1]['a']", "['mask']"]


def test_shared_references_in_an_output_are_walked_once():
    t = torch.ones(3)
    level = [t]
    for _ in range(6):  # 8 references to the level below, 6 levels: 8**6 paths to `t`
        level = [level] * 8

    class Shared(nn.Module):
        def forward(self, x):
            return level

    model = nn.Sequential(Shared())
    start = time.perf_counter()
    with scn.inspect(model) as insp:
        assert model(torch.zeros(1)) is level
    rows = insp.frame().query("module == '0'")
    assert rows["index"].tolist() == ["[0][0][0][0][0][0][0]"]
    assert time.perf_counter() - start < 5


def test_many_tensors_in_one_output_are_bounded_and_said_once():
    class Many(nn.Module):
        def forward(self, x):
            return [x + i for i in range(1000)]

    model = nn.Sequential(Many())
    with pytest.warns(UserWarning, match="more than 256 tensors"):
        with scn.inspect(model) as insp:
            model(torch.zeros(2))
            model(torch.zeros(2))
    assert len(insp.frame().query("module == '0'")) == 2 * 256


def test_manual_steps_without_step_keep_memory_bounded():
    model = nn.Sequential(*[nn.Identity() for _ in range(10)])
    with pytest.warns(RuntimeWarning, match="max_rows=30 reached"):
        with scn.inspect(model, steps="manual", max_rows=30) as insp:
            for _ in range(50):
                model(torch.randn(3))
                assert len(insp._recorder.pending.rows) <= 30
    assert len(insp.frame()) == 30


def test_rerunning_inspect_in_a_cell_replaces_the_previous_inspector():
    model = mlp()
    first = scn.inspect(model)
    with pytest.warns(UserWarning, match="replaces the inspector"):
        second = scn.inspect(model)
    assert not first.active and second.active
    model(torch.randn(1, 8))
    assert len(second.frame()) == 5 and second.steps_recorded == 1
    assert len(first.frame()) == 0
    assert len(model._forward_pre_hooks) == 1
    second.stop()
    assert scn.inspector(model) is second


def test_histogram_of_an_empty_tensor_and_nested_tensors_keep_their_rows():
    class Odd(nn.Module):
        def forward(self, x):
            nested = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
            return x[:0], nested, x

    model = nn.Sequential(Odd())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        with scn.inspect(model, hist="0") as insp:
            model(torch.randn(3, 2))
    rows = insp.frame().query("module == '0'")
    assert rows["index"].tolist() == ["[0]", "[1]", "[2]"]
    assert rows["shape"].tolist() == [(0, 2), (2, None, 3), (3, 2)]
    assert insp.errors == []
    assert insp.histograms()["0"][0].sum() == 6


def test_a_user_hook_that_replaces_the_output_is_recorded_as_the_caller_sees_it():
    model = mlp()
    model[1].register_forward_hook(lambda m, args, out: out * 0 + 7)
    with scn.inspect(model) as insp:
        model(torch.randn(2, 8))
    row = insp.frame().query("module == '1' and io == 'output'").iloc[0]
    assert (row["min"], row["max"]) == (7, 7)


# --- 10. train vs eval --------------------------------------------------------------------------
def test_training_column_tells_train_and_eval_apart():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    with scn.inspect(model, grads=True) as insp:
        model.train()
        model(torch.randn(2, 4)).sum().backward()
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4))
        model[1].train()  # a module's own flag, not the root's
        model(torch.randn(2, 4))
    df = insp.frame()
    assert df.columns[-1] == "training"
    assert df.query("step == 0").training.all()
    assert not df.query("step == 1").training.any()
    assert df.query("step == 2 and io == 'output'").set_index("module")["training"].to_dict() == {
        "0": False, "1": True, "": False}
    summary = insp.summary().frame
    assert set(summary.query("module == '0'").training) == {True, False}
    assert list(insp.history(training=False).columns) == [1, 2]
    assert list(insp.history(training=True).columns) == [0, 2]


def test_heatmap_marks_eval_steps_and_can_keep_one_mode():
    model = mlp()
    with scn.inspect(model) as insp:
        for i in range(4):
            model.train(i != 2)
            model(torch.randn(2, 8))
    figure = insp.plot()
    ax = figure.axes[0]
    assert "eval steps" in ax.get_title()
    markers = [line for line in ax.lines if line.get_marker() == "v"]
    assert markers and list(markers[0].get_xdata()) == [2]  # column of step 2
    only_train = insp.plot(training=True).axes[0]
    assert "eval" not in only_train.get_title()
    # steps 0, 1 and 3; rows 0, 1 (the ReLU: its absmax is the Linear's, its mean is not) and 2
    # (the Sequential returns 2's output: folded into it)
    assert only_train.images[0].get_array().shape == (3, 3)
    assert [t.get_text() for t in only_train.get_yticklabels()] == [
        "0 · Linear", "1 · ReLU", "2 · Linear"]


def test_a_compiled_function_calling_the_model_is_said_not_silent():
    model = mlp()
    step = torch.compile(lambda x: model(x).sum(), backend="eager")
    with pytest.warns(UserWarning, match="none of its modules reached the inspector"):
        with scn.inspect(model) as insp:
            step(torch.randn(2, 8))
            step(torch.randn(2, 8))
    df = insp.frame()
    assert set(df.io) == {"input"} and sorted(df.step) == [0, 1]  # the model's own inputs
    assert "torch.compile" in insp.notes[0]


def test_a_copy_made_while_inspecting_is_not_recorded_and_does_not_disturb_steps():
    model, x = mlp(), torch.randn(2, 8)
    with scn.inspect(model, grads=True) as insp:
        ema = torch.optim.swa_utils.AveragedModel(model)  # deepcopies the inspected model
        for _ in range(3):
            model(x).sum().backward()
            ema.update_parameters(model)
            ema(x)
    assert torch.equal(ema(x), ema.module(x))
    assert insp.steps_recorded == 3 and sorted(insp.frame().step.unique()) == [0, 1, 2]
    assert set(insp.frame().query("step == 2 and io == 'output'").module) == {"0", "1", "2", ""}


def test_no_bypass_note_for_a_failing_forward_or_an_excluded_root():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(3, 3))  # the second layer cannot take 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with scn.inspect(model) as insp:
            with pytest.raises(RuntimeError):
                model(torch.randn(1, 2))
        with scn.inspect(model, include="1") as insp:
            model[0](torch.randn(1, 2))  # runs nothing included: not a compiled bypass
            with pytest.raises(RuntimeError):
                model(torch.randn(1, 2))
    assert insp.notes == []
