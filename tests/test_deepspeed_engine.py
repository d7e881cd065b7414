"""DeepSpeed's engine is unwrapped as DDP is. deepspeed is not installed here, so the engine is
a stand-in: a module class named `DeepSpeedEngine` holding the model as `.module`, which is
all singlecard_nb reads of it (by name: deepspeed is never imported to ask)."""

from __future__ import annotations

import torch
from parallel_support import clean_state  # noqa: F401 - restores single-card mode
from torch import nn

import singlecard_nb as scn
from singlecard_nb.parallel import single_card as parallel


class DeepSpeedEngine(nn.Module):  # deepspeed.runtime.engine.DeepSpeedEngine's shape
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_inspect_all_records_the_model_inside_a_deepspeed_engine_by_its_own_paths():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    engine = DeepSpeedEngine(model)
    with scn.inspect_all():
        for _ in range(2):
            engine(torch.ones(1, 2))
    (name, insp), = scn.inspectors().items()
    assert name == "Sequential" and insp.steps_recorded == 2
    assert set(insp.frame().module) == {"", "0", "1", "2"}  # not "module.0"


def test_unwrap_takes_the_model_out_of_a_deepspeed_engine(clean_state):  # noqa: F811
    model = nn.Linear(2, 2)
    parallel.enable(torch.device("cpu"))
    assert parallel.unwrap(DeepSpeedEngine(model)) is model
