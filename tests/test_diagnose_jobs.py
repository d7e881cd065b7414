"""Diagnose, not just record: small training jobs in the shape people write them, each hiding
one bug; the first row of the ranking (summary, live view, terminal) must name the cause, in
words a person acts on."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb import cli
from singlecard_nb.errors import NonFiniteError
from singlecard_nb.inspection.views import live

SCRIPTS = Path(__file__).with_name("scripts")


@pytest.fixture(autouse=True)
def no_shell(monkeypatch):
    monkeypatch.setattr(live, "_current_shell", lambda: None)


def _first(insp):
    rows = insp.findings(3)
    assert rows, "nothing ranked"
    return rows[0]


def _terminal(capsys, *argv) -> tuple[int, str]:
    status = cli.main(["--device", "cpu", *map(str, argv)])
    return status, capsys.readouterr().err


def test_a_param_group_with_100x_the_lr_is_named_first_on_the_terminal(capsys, tmp_path):
    # torchrun + DDP shape, param groups; run on one CPU through the terminal form
    status, err = _terminal(capsys, "--params", "--save", tmp_path / "job.db",
                            SCRIPTS / "ddp_param_groups.py", 25)
    assert status == 0
    report = err[err.index("findings, likeliest cause first:"):]
    first = report.splitlines()[1]
    assert first.startswith("  1. head (optimizer): `head`: lr 5, 100× the other group"), report
    # the parameters that grew come next, before the outputs that went NaN later
    assert report.splitlines()[2].startswith("  2. head.")
    assert "module." not in report  # the inspector's paths, not DDP's


def test_a_dead_relu_points_at_the_linear_whose_bias_kills_it(capsys):
    status, err = _terminal(capsys, "--params", SCRIPTS / "dead_relu.py", 4)
    assert status == 0  # nothing is NaN: the report is printed all the same
    lines = err[err.index("findings, likeliest cause first:"):].splitlines()
    assert lines[1].startswith("  1. fc1 (output): every output ≤ 0")
    assert "its bias (mean -10, absmax 10) does it" in lines[1] and "act (ReLU)" in lines[1]
    assert lines[2].startswith("  2. act (output): dead: 100.0% zeros, because fc1")


def test_log_of_zero_in_a_router_is_the_first_row_and_the_explanation_spells_paths_alike(
        capsys):
    status, err = _terminal(capsys, "--params", "--grads", SCRIPTS / "router_log.py", 3)
    assert status == 0
    first = err[err.index("findings, likeliest cause first:"):].splitlines()[1]
    assert first.startswith("  1. moe.router (output):") and "log or sqrt of 0" in first
    # the trap's explanation names the router as the inspector does, not "module.moe.router"
    status, err = _terminal(capsys, "--trap", SCRIPTS / "router_log.py", 3)
    assert status == 1
    assert "'moe.router' (Router)" in err and "module.moe" not in err
    assert "--save PATH" in err and "scn.load(PATH)" in err  # no insp.frame() on a terminal
    assert "insp.frame()" not in err


def test_the_trap_on_a_terminal_says_to_load_the_saved_rows(capsys, tmp_path):
    saved = tmp_path / "moe.db"
    status, err = _terminal(capsys, "--trap", "--save", saved, SCRIPTS / "router_log.py", 3)
    assert status == 1 and f"scn.load({str(saved)!r})" in err
    assert "findings, likeliest cause first:" in err and len(scn.load(saved))


def test_vanishing_gradients_in_a_20_layer_sigmoid_mlp_lead_the_summary():
    torch.manual_seed(0)
    layers = [m for _ in range(20) for m in (nn.Linear(32, 32), nn.Sigmoid())]
    model = nn.Sequential(*layers, nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with scn.inspect(model, grads=True) as insp:
        view = insp.live()
        for _ in range(6):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    first = _first(insp)
    assert first.kind == "grad" and first.path == "0.weight", first
    assert first.why.startswith("vanishing gradient") and "below the median gradient" in first.why
    assert "largest 40." in first.why
    # the summary and the live view lead with the same row
    summary = repr(insp.summary()).splitlines()
    assert summary[1].startswith("  1. 0.weight (grad, worst of {0,2,4")
    assert "): vanishing gradient" in summary[1]
    assert repr(view).splitlines()[1].split()[1] == "0.weight"
    # and the heatmap draws gradients per parameter (it raised TypeError before)
    fig = insp.plot(io="param_grad")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert any(label.startswith("0.weight") for label in labels)
    assert "first finding: 0.weight" in fig.axes[0].get_title()


def _cnn():
    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)
            self.c3 = nn.Conv2d(8, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)  # as ResNet's stem: the later layers see normal values
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            x = torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.bn(self.stem(x)))))))
            return self.fc(x.mean((2, 3)))
    return CNN()


def test_an_input_channel_normalised_by_a_near_zero_std_is_named_before_the_stem():
    torch.manual_seed(0)
    model = _cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.0004]).view(1, 3, 1, 1)  # a typo in the third std
    with scn.inspect(model) as insp:
        for _ in range(4):
            images = torch.rand(8, 3, 16, 16) * torch.tensor([1, 1, .2]).view(1, 3, 1, 1) + \
                torch.tensor([0, 0, .4]).view(1, 3, 1, 1)
            loss = nn.functional.cross_entropy(model((images - mean) / std),
                                               torch.randint(0, 10, (8,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    rows = insp.findings(5)
    assert rows[0].kind == "input" and rows[0].why.startswith("channel 2 of the model's input [0]")
    assert "the median of the other 2 channels" in rows[0].why
    # the stem's output stands out among only three Conv2d: the small-group rule sees it
    stem = next(r for r in rows if r.path == "stem")
    assert "the median of the other 2 Conv2d" in stem.why


class _Half(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.square = _Square()

    def forward(self, x):
        return self.square(self.proj(x))


class _Square(nn.Module):
    def forward(self, x):
        h = x.half()
        return h * h * h  # float16: beyond 65504 is Inf


def test_the_ranking_and_the_trap_say_float16_overflow_with_the_dtype_max():
    torch.manual_seed(0)
    model = _Half()
    x = torch.randn(4, 64)
    with scn.inspect(model) as insp:
        model(x)
        model(x * 30)
    first = _first(insp)
    assert first.path == "square" and "float16 overflow" in first.why and "65504" in first.why
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True):
        model(x * 30)
    assert "float16 overflow" in str(caught.value)
    hint = scn.explain(caught.value).hint
    assert hint.startswith("float16 overflow") and "65504" in hint


def test_a_norm_fed_exploded_but_finite_values_is_told_they_exploded_before_it():
    # the LSTM of word_language_model at lr 1e30 got absmax 4e26 from its embedding: not a log
    # or sqrt of its own, the squares of values that had grown past float32's reach
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with torch.no_grad():
        model[0].weight.mul_(1e21)
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True):
        model(torch.randn(2, 4))
    hint = scn.explain(caught.value).hint
    assert hint.startswith("LayerNorm '1' received finite inputs of absmax"), hint
    assert "had already exploded before this module" in hint and "log or sqrt" not in hint
    with scn.inspect(model) as insp:  # the ranking says the same of the norm, and leads with
        model(torch.randn(2, 4))      # the Linear whose weights made the values
    first, norm = insp.findings()[:2]
    assert first.path == "0" and "the first module whose output left the healthy range" in \
        first.why, first.why
    assert norm.path == "1" and "values that had exploded before it" in norm.why, norm.why


def _diverging(lr: float = 50.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def _train(model, optimizer, steps=200):
    for _ in range(steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_trap_and_explanation_agree_when_the_weights_are_already_nan():
    model, optimizer = _diverging()
    _train(model, optimizer, steps=3)
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")  # corrupted, as by an earlier step
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True):
        _train(model, optimizer)
    message = str(caught.value)
    assert "already held NaN/Inf" in message and "inputs were finite" not in message
    assert "in its own" in scn.explain(caught.value).hint  # the explanation says the same


def test_a_diverging_run_traps_at_its_loss_and_names_the_parameter_that_grew_first():
    # SGD at lr 50: the weights grow, the squared output overflows in the loss (computed
    # outside any module) before any module's output or gradient is non-finite
    model, optimizer = _diverging()
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True, params=True):
        _train(model, optimizer)
    error = caught.value
    assert error.io == "loss", error
    message = str(error)
    assert "Inf in the loss (what loss.backward() was called on)" in message
    assert "Its last operations: Mean ← Pow" in message
    # the cause that began before it comes first, in the message and in the explanation
    assert "Likeliest cause, begun before it:" in message and "(param)" in message
    hint = scn.explain(error).hint
    assert hint.startswith("Likeliest cause, begun before the trap: ") and "RMS" in hint
    assert "The loss held" in hint and "a sqrt or power in the loss" in hint


def test_with_params_the_trap_stops_at_the_optimiser_step_that_made_a_parameter_nan():
    model, optimizer = _diverging(lr=0.1)
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True, params=True):
        _train(model, optimizer, steps=3)
        optimizer.param_groups[0]["lr"] = float("inf")  # the update, not the loss, is infinite
        _train(model, optimizer, steps=1)
    error = caught.value
    assert error.io == "param" and "The optimiser step made it non-finite" in str(error)
    hint = scn.explain(error).hint
    assert "after the optimiser step of step 3" in hint


def _job(monkeypatch, odd: int | None, ranks: int, evaluate_on_rank_0: bool = False):
    frames = []
    for rank in range(ranks):
        monkeypatch.setenv("RANK", str(rank))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with scn.inspect(model, params=True) as insp:
            for step in range(3):
                if evaluate_on_rank_0 and rank == 0 and step != 1:  # as nanoGPT's estimate_loss
                    model.eval()
                    with torch.no_grad():
                        for _ in range(2):
                            model(torch.randn(4, 8))
                    model.train()
                optimizer.zero_grad()
                model(torch.randn(4, 8)).pow(2).mean().backward()
                for p in model.parameters():
                    p.grad = torch.full_like(p, 0.01)  # DDP's all-reduce
                optimizer.step()
                if rank == odd and step == 1:
                    with torch.no_grad():
                        model[0].bias.mul_(1.001)
        frames.append(insp.frame())
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("odd", [0, 2])
def test_compare_ranks_names_the_odd_rank_by_majority(monkeypatch, odd):
    result = scn.compare_ranks(_job(monkeypatch, odd, 3))
    assert result.odd == odd
    assert repr(result).startswith(f"rank {odd} is the odd one")


def test_compare_ranks_matches_optimiser_steps_when_one_rank_also_evaluates(monkeypatch):
    # rank 0 alone runs 2 evaluation forwards before steps 0 and 2: its steps are numbered
    # 0-1 eval, 2 train, 3 train, 4-5 eval, 6 train; rank 1's 0, 1, 2
    clean = scn.compare_ranks(_job(monkeypatch, None, 2, evaluate_on_rank_0=True))
    assert clean.first is None, repr(clean)
    assert any("the ranks recorded different steps" in note and "rank 0: 3 of 7" in note
               and "rank 1: 3 of 3" in note for note in clean.notes), clean.notes
    planted = scn.compare_ranks(_job(monkeypatch, 1, 2, evaluate_on_rank_0=True))
    first = planted.first
    # rank 1 scaled a bias after its second optimiser step (rank 0's step 3): its third step's
    # parameters are the first to differ, at rank 0's number for that step
    assert (first.rank, first.step, first.io, first.module) == (1, 6, "param", "0"), first


def test_compare_ranks_with_two_ranks_does_not_blame_one(monkeypatch):
    result = scn.compare_ranks(_job(monkeypatch, 0, 2))
    assert result.odd is None and repr(result).startswith("rank 0 and rank 1 differ")


class _Blowup(nn.Module):
    """Finite until step 1, then log of a negative number."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.log(x - 10) if self.calls > 1 else x


def test_the_block_panel_leaves_modules_that_did_not_run_blank():
    blocks = [nn.Sequential(nn.Linear(4, 4), nn.Identity()) for _ in range(6)]
    blocks[2][1] = _Blowup()
    model = nn.Sequential(*blocks)
    with pytest.raises(NonFiniteError), scn.inspect(model, trap=True) as insp:
        for _ in range(2):
            model(torch.randn(2, 4))
    panel = insp.plot().axes[1]  # block × module, latest step: blocks 3-5 never ran in it
    red = [image for image in panel.images if image.get_array().count() < image.get_array().size]
    painted = {int(i) for image in red[1:] for i, _ in zip(*(~image.get_array().mask).nonzero())}
    assert painted and max(painted) <= 2, painted


def test_a_view_sized_by_the_global_batch_is_connected_to_the_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched by torchrun with 2 processes

    class Patches(nn.Module):
        def __init__(self, batch_size):
            super().__init__()
            self.batch_size, self.proj = batch_size, nn.Linear(8, 8)

        def forward(self, x):
            world_size = int(__import__("os").environ["WORLD_SIZE"])
            return self.proj(x.view(self.batch_size * world_size, 8, 8))

    model = Patches(batch_size=4)
    with pytest.raises(RuntimeError) as caught:
        model(torch.randn(4, 64))
    hint = scn.explain(caught.value).hint
    assert "8 is 4 × 2, the global batch" in hint and "x.size(0)" in hint


class _CharRNN(nn.Module):
    """A character model in the shape of the PyTorch tutorials, its recurrent weight
    initialised 3× too large (orthogonal with gain 3): the first backward explodes through the
    50 time steps, the update wrecks the weights, and later gradients look tame."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 32)
        self.rnn = nn.RNN(32, 64, batch_first=True)
        self.head = nn.Linear(64, 20)
        nn.init.orthogonal_(self.rnn.weight_hh_l0, gain=3.0)

    def forward(self, x):
        hidden, _ = self.rnn(self.embed(x))
        return self.head(hidden)


def test_exploding_gradients_in_an_rnn_name_the_parameter_and_how_far_above_the_others():
    torch.manual_seed(0)
    model = _CharRNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with scn.inspect(model, grads=True) as insp:
        for _ in range(6):
            text = torch.randint(0, 20, (16, 50))
            logits = model(text)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), text.roll(1, 1).flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    first = _first(insp)
    assert first.kind == "grad" and first.path.startswith("rnn."), first
    # at the step it happened, against the layers nearest the loss, though it is over now
    assert first.why.startswith("exploding gradient at step 0: absmax ")
    assert "the smaller gradients of that step" in first.why and "smallest head." in first.why
    assert "10^5×" in first.why and "at step 5, the latest" in first.why
    assert first.since == 0


def test_a_weight_decay_of_50_on_one_group_is_named_first_against_the_other_group():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("encoder", nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64),
                                              nn.ReLU()))
    model.add_module("head", nn.Linear(64, 1))
    # the usual split, no decay on biases; 50 typed for 5e-4
    decay = [p for name, p in model.named_parameters() if name.endswith("weight")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 50.0},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=0.01,
                                momentum=0.9)
    with scn.inspect(model, params=True) as insp:
        for _ in range(10):
            x = torch.randn(32, 16)
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    rows = insp.findings(4)
    first = rows[0]
    assert first.kind == "optimizer" and first.type == "SGD group 0", first
    assert "weight_decay 50 (the other group's: 0) with lr 0.01" in first.why
    assert "takes 50% off its weights at every step" in first.why
    assert "check the weight_decay" in first.why
    # the weights it shrinks come next, each with how much and since when
    assert rows[1].kind == "param" and rows[1].path.endswith(".weight")
    assert "smaller since step 0" in rows[1].why and "weight decay" in rows[1].why


def test_adamw_with_an_lr_of_20_is_told_to_check_the_lr_not_its_default_decay():
    # pytorch/examples' word_language_model --use-optimizer: AdamW(lr=20), weight_decay 0.01 by
    # default; decay then takes 20 % off every step, and the lr is what was mistyped
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=20)
    with scn.inspect(model, params=True) as insp:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
    (row,) = [r for r in insp.findings(10) if r.kind == "optimizer"]
    assert "lr 20 with weight_decay 0.01: decay alone takes 20% off" in row.why, row.why
    assert row.why.endswith("check the lr given to the optimizer"), row.why


def test_amp_clipping_before_unscale_is_named_first_on_the_terminal(capsys):
    status, err = _terminal(capsys, "--params", "--grads",
                            SCRIPTS / "amp_clip_before_unscale.py", 5)
    assert status == 0  # nothing is NaN: the training only barely moves
    first = err[err.index("findings, likeliest cause first:"):].splitlines()[1]
    assert first.startswith("  1. (all parameters) (optimizer): the gradients the optimiser "
                            "stepped with have the same total norm 1.5e-05"), first
    assert "a loss scale of 65536" in first and "backward's were 10^10× larger" in first
    assert "scaler.unscale_(optimizer) before clipping" in first


def test_a_loss_computed_outside_any_module_traps_at_its_step_with_the_log_that_made_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(dim=-1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    target = nn.functional.one_hot(torch.tensor([0, 1]), 3).float()
    with pytest.raises(NonFiniteError) as caught, scn.inspect(model, trap=True):
        for step in range(3):
            probs = model(torch.randn(2, 4))
            if step == 2:
                probs = probs * torch.tensor([0.0, 1.0, 1.0])  # a probability of exactly 0
            loss = -(target * probs.log()).sum()  # 0 × log 0: NaN, in no module
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    error = caught.value
    assert error.io == "loss" and error.step == 2
    assert "a log of 0" in str(error) and "Log" in error.cause
    assert scn.explain(error).hint.startswith("The loss held 1 NaN at step 2")
