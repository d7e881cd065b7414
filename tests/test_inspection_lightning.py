"""A LightningModule under a real lightning Trainer: each training_step / validation_step is a
step, although Lightning never calls forward (issue 9)."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import singlecard_nb as scn


class LitAutoEncoder(L.LightningModule):
    """As in Lightning's README: the step calls the submodules, never self(...)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
        self.decoder = nn.Linear(4, 8)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return F.mse_loss(self.decoder(self.encoder(x)), x)

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", F.mse_loss(self.decoder(self.encoder(x)), x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n):
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=torch.Generator().manual_seed(0))),
                      batch_size=4)


def test_a_lightning_trainer_run_is_recorded_step_by_step():
    torch.manual_seed(0)
    model = LitAutoEncoder()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=3,
                        limit_val_batches=2, num_sanity_val_steps=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")  # its notes on workers etc.
        with scn.inspect(model, grads=True) as insp:
            trainer.fit(model, loader(12), loader(8))
    df = insp.frame()
    assert sorted(df.step.unique()) == [0, 1, 2, 3, 4]  # 3 training steps, 2 validation steps
    outputs = df[df.io == "output"]
    assert set(outputs.module) == {"encoder.0", "encoder.1", "encoder", "decoder"}
    by_step = outputs.groupby("step")["training"].agg(set).tolist()
    assert by_step == [{True}] * 3 + [{False}] * 2  # validation runs in eval mode
    grads = df[df.io.isin(["grad", "param_grad"])]
    assert sorted(grads.step.unique()) == [0, 1, 2]  # no backward in validation
    assert {"decoder", "encoder.0"} <= set(grads.module)
    assert "training_step" not in vars(model)  # the step methods are given back


def test_submodules_called_directly_are_said_once_when_no_step_is_recorded():
    class Namespace(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(2, 2)

        def encode(self, x):
            return self.encoder(x)

    model = Namespace()
    with pytest.warns(UserWarning, match="'encoder' of Namespace ran outside a call") as said:
        with scn.inspect(model) as insp:
            for _ in range(3):
                model.encode(torch.randn(1, 2))
    assert len([w for w in said if "ran outside" in str(w.message)]) == 1
    assert insp.frame().empty and "ran outside" in repr(insp.summary())
    assert model.encoder._forward_pre_hooks == {}
    with scn.inspect(model, steps="manual") as insp:  # what the note suggests
        model.encode(torch.randn(1, 2))
        insp.step()
        model.encode(torch.randn(1, 2))
    assert sorted(insp.frame().step.unique()) == [0, 1]


def test_a_copy_of_an_inspected_lightning_module_runs_its_own_steps():
    import copy

    model = LitAutoEncoder()
    with scn.inspect(model) as insp:
        twin = copy.deepcopy(model)  # what EMA / SWA callbacks do
        batch = (torch.randn(4, 8),)
        model.training_step(batch, 0)
        twin.training_step(batch, 0)  # not a step of `model`
        assert twin.training_step.__self__ is twin
    assert insp.steps_recorded == 1
