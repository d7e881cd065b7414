"""What the ranking reads beside the rows (input channels, the optimiser's param groups) is
saved with them: a loaded record ranks as the live inspector did, and the two tables are read
back as strictly as the rows (every refusal names the file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch
from torch import nn

import singlecard_nb as scn
from singlecard_nb import cli
from singlecard_nb.inspection.views import live

SCRIPTS = Path(__file__).with_name("scripts")


@pytest.fixture(autouse=True)
def no_shell(monkeypatch):
    monkeypatch.setattr(live, "_current_shell", lambda: None)


def test_the_lr_100x_job_saved_by_the_terminal_loads_with_the_same_first_finding(
        capsys, tmp_path):
    saved = tmp_path / "job.db"
    status = cli.main(["--device", "cpu", "--params", "--save", str(saved),
                       str(SCRIPTS / "ddp_param_groups.py"), "25"])
    err = capsys.readouterr().err
    assert status == 0
    printed = err[err.index("findings, likeliest cause first:"):].splitlines()[1:4]
    loaded = scn.findings(scn.load(saved), 3)
    # the param group's lr (lost in the file before), then the parameters it makes grow
    assert loaded[0].kind == "optimizer" and "lr 5, 100× the other group" in loaded[0].why
    assert [f"  {i}. {r.text()}" for i, r in enumerate(loaded, 1)] == printed
    assert scn.findings(saved, 1)[0].text() == loaded[0].text()  # a path works as well


def _cnn():
    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.stem(x))).mean((2, 3)))
    return CNN()


def _dead_channel_job():
    """Images normalised with a typo in the third channel's std (0.0004 for 0.25)."""
    torch.manual_seed(0)
    model = _cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.0004]).view(1, 3, 1, 1)
    with scn.inspect(model, params=True) as insp:
        for _ in range(4):
            images = torch.rand(8, 3, 16, 16) * torch.tensor([1, 1, .2]).view(1, 3, 1, 1) + \
                torch.tensor([0, 0, .4]).view(1, 3, 1, 1)
            loss = nn.functional.cross_entropy(model((images - mean) / std),
                                               torch.randint(0, 10, (8,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return insp


def test_the_dead_channel_job_loads_with_the_same_findings(tmp_path):
    insp = _dead_channel_job()
    path = insp.save(tmp_path / "cnn.db")
    before = insp.findings(None)
    assert before[0].why.startswith("channel 2 of the model's input [0]")
    after = scn.findings(scn.load(path), None)
    assert [r.text() for r in after] == [r.text() for r in before]
    # what scn.inspectors() holds after a %run of ranks reads the same file the same way
    from singlecard_nb.inspection.runs.recorded import Recorded
    recorded = Recorded("CNN[rank 0]", 0, scn.load(path), path)
    assert recorded.findings(1)[0].text() == before[0].text()
    assert repr(recorded.summary()).startswith("findings, likeliest cause first:\n  1. input[0]")


def test_the_input_channels_and_the_loss_operations_are_read_every_16th_step_and_dated():
    """They describe the data and the loss's code, not the step: read on steps 0, 16, 32...
    (a third of what inspect added to a small model's step), the loss itself every step;
    the finding names the step its channels were measured at. The trap reads the operations
    every step: its words name them."""
    torch.manual_seed(0)
    model = _cnn()
    std = torch.tensor([0.25, 0.25, 0.0004]).view(1, 3, 1, 1)
    with scn.inspect(model) as insp:
        for _ in range(20):
            loss = model((torch.rand(8, 3, 8, 8) - 0.5) / std).square().mean()
            loss.backward()
    extras = {r.extras["step"]: r.extras for r in insp.records() if r.extras}
    assert sorted(extras) == list(range(20))  # every step's loss
    assert [s for s, e in extras.items() if "channels" in e] == [0, 16]
    assert [s for s, e in extras.items() if e["loss"]["ops"]] == [0, 16]
    assert extras[16]["loss"]["ops"][:2] == ("Mean", "Pow")
    found = insp.findings(1)[0]
    assert found.why.startswith("channel 2 of the model's input [0]") and "at step 16" in found.why
    with scn.inspect(model, trap=True) as trapped:
        for _ in range(3):
            model(torch.rand(8, 3, 8, 8)).square().mean().backward()
    assert all(r.extras["loss"]["ops"][:2] == ("Mean", "Pow") for r in trapped.records())


def test_a_frame_cut_to_another_rank_does_not_rank_with_this_ranks_channels(tmp_path):
    frame = scn.load(_dead_channel_job().save(tmp_path / "cnn.db"))
    assert scn.findings(frame[frame["rank"] == 0], 1)[0].kind == "input"
    other = frame.assign(rank=1)  # rows of rank 1, extras of rank 0
    # no channel of rank 0 speaks for rank 1 (the whole input's scale, its own row, may)
    assert not any(r.why.startswith("channel") for r in scn.findings(other, None))


def test_a_file_without_the_extras_tables_loads_and_ranks_its_rows(tmp_path):
    path = _dead_channel_job().save(tmp_path / "old.db")
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE record_channels; DROP TABLE record_param_groups; "
                     "DROP TABLE record_losses;")
    db.close()
    frame = scn.load(path)
    assert len(frame) and frame.attrs["singlecard_nb"]["extras"] == []
    # no channel is known: only the whole input's scale can speak of it
    assert not any(r.why.startswith("channel") for r in scn.findings(frame, None))


def _crafted(tmp_path, sql: str) -> Path:
    path = _dead_channel_job().save(tmp_path / "crafted.db")
    db = sqlite3.connect(path)
    db.executescript(sql)
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize(("sql", "says"), [
    ("UPDATE record_channels SET step = 'x'", "holds step 'x', not a whole number"),
    ("UPDATE record_channels SET channel = 5 WHERE channel = 1", "channel 5 follows 1"),
    ("UPDATE record_channels SET mean = 'big'", "mean 'big' is no number"),
    ("UPDATE record_channels SET shape = '{\"a\": 1}'", "is no list of int"),
    ("UPDATE record_param_groups SET params = '[1, 2]'", "is no list of str"),
    ("UPDATE record_param_groups SET params = 'not json'", "record_param_groups at step 0"),
    ("UPDATE record_param_groups SET param_group = -1", "param_group -1 is no group"),
    ("UPDATE record_param_groups SET optimizer = zeroblob(10)", "is no short text"),
])
def test_a_crafted_value_in_the_extras_tables_is_refused_naming_the_file(tmp_path, sql, says):
    path = _crafted(tmp_path, sql)
    with pytest.raises(ValueError, match=r"crafted\.db") as caught:
        scn.load(path)
    assert says in str(caught.value)


def test_a_generated_column_in_the_extras_tables_is_refused_without_being_computed(tmp_path):
    path = _crafted(tmp_path, "DROP TABLE record_channels; CREATE TABLE record_channels (step "
                    "INTEGER, input TEXT, shape TEXT, channel INTEGER, mean REAL, std REAL, "
                    "absmax BLOB GENERATED ALWAYS AS (zeroblob(300000000)) VIRTUAL);")
    with pytest.raises(ValueError, match=r"crafted\.db.*'absmax'.*generated column"):
        scn.load(path)


def test_a_virtual_table_in_place_of_the_param_groups_is_refused(tmp_path):
    path = _crafted(tmp_path, "DROP TABLE record_param_groups; CREATE VIRTUAL TABLE "
                    "record_param_groups USING fts5(step);")
    with pytest.raises(ValueError, match=r"crafted\.db.*record_param_groups is not a plain"):
        scn.load(path)


def test_the_condensed_extras_a_frame_keeps_build_the_tracks_all_steps_build():
    from singlecard_nb.inspection.causes.series import Tracks, condensed

    def group(lr):
        return [{"optimizer": "SGD", "group": 0, "lr": lr, "weight_decay": 0.0,
                 "params": ["fc.weight"]}]
    steps = [{"step": s, "optimizer": group(0.1 / (s + 1)),
              "loss": {"values": [1.0 / (s + 1)], "ops": ["MseLoss"], "shared": 1}}
             for s in range(20)]
    for s in (2, 3, 5):  # an input whose channels are recorded from step 2 on
        steps[s]["channels"] = {"[0]": {"shape": (8, 3), "values": [[s, 1.0, 2.0]] * 3}}
    steps[4]["channels"] = {"[1]": {"shape": (8, 2), "values": [[0.0, 1.0, 1.0]] * 2}}
    every, kept = Tracks(), Tracks()
    for item in steps:
        every.add_extras(item)
    for item in condensed(steps):
        kept.add_extras(item)
    assert len(condensed(steps)) < len(steps)
    assert kept.channels == every.channels and kept.channels["input[0]"].first_step == 2
    assert kept.optimizer == every.optimizer and kept.optimizer[0]["lr"] == pytest.approx(0.1 / 20)
    assert kept.optimizer_first_step == every.optimizer_first_step == 0
    # what the steps add up to (counts, the lr and loss series) is kept whole
    assert kept.optimizer_steps == every.optimizer_steps == 20
    assert kept.lr_history == every.lr_history and kept.losses == every.losses


def test_findings_takes_an_inspector_and_refuses_what_holds_no_records(tmp_path):
    insp = _dead_channel_job()
    assert scn.findings(insp, 1)[0].text() == insp.findings(1)[0].text()
    with pytest.raises(TypeError, match=r"a frame from scn\.load\(\).*got int"):
        scn.findings(42)
    with pytest.raises(FileNotFoundError, match="no saved records"):
        scn.findings(tmp_path / "missing.db")
