"""Libraries nobody here wrote train under a pin: Lightning DDP, Hugging Face Trainer, accelerate.

Tiny models with random weights, no downloads (HF_HUB_OFFLINE=1). Each library decides by
itself how to use the world of one that single-card mode provides (torchrun's variables, a
process group, DistributedDataParallel); the tests check that training finishes and learns,
and that the pin's `off` closes what they opened.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from conftest import run_fresh_python
from parallel_support import clean_state, listening  # noqa: F401 - clean_state: pytestmark
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from singlecard_nb import session
from singlecard_nb.parallel import single_card as parallel

pytestmark = [pytest.mark.usefixtures("clean_state"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture
def pinned_cpu():
    # Lightning sets OMP_NUM_THREADS and torch's threads for its "workers": not for later tests.
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    session.pin("cpu")
    yield
    listeners = parallel.report()["listeners"]
    session.release()
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp
    assert not dist.is_initialized()
    assert not any(listening(address) for address in listeners)


def linear_problem(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True))


# --- Lightning --------------------------------------------------------------------------------
LIGHTNING_MODULE = """
import lightning, torch
from torch import nn


class Regression(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.losses, self.wrapped_in = [], []

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.wrapped_in.append(type(self.trainer.strategy.model).__name__)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(strategy, loader):
    torch.manual_seed(0)
    module = Regression()
    trainer = lightning.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=4,
                                logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    return trainer, module
"""


def _lightning_fit(strategy: str) -> tuple:
    namespace: dict = {}
    exec(compile(LIGHTNING_MODULE, "lightning_regression", "exec"), namespace)
    return namespace["fit"](strategy, DataLoader(linear_problem(), batch_size=16))


def test_lightning_ddp_notebook_fit_completes_under_a_pin(pinned_cpu):
    pytest.importorskip("lightning")
    trainer, module = _lightning_fit("ddp_notebook")  # Lightning's strategy for notebooks
    assert trainer.state.finished and trainer.current_epoch == 4
    assert set(module.wrapped_in) == {"DistributedDataParallel"}  # over single-card's world
    assert module.losses[-1] < module.losses[0] / 4
    assert any("start_processes" in n for n in parallel.report()["notices"])


@pytest.mark.slow
def test_lightning_ddp_fit_completes_in_a_pinned_script():
    # Lightning refuses strategy="ddp" where Python is interactive (a notebook, or this test
    # process once any test made an IPython shell): it is the scripts' strategy, so a script.
    pytest.importorskip("lightning")
    code = LIGHTNING_MODULE + """
import json
import singlecard_nb
from torch.utils.data import DataLoader, TensorDataset
from singlecard_nb.parallel import single_card

singlecard_nb.pin("cpu")
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
trainer, module = fit("ddp", DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16))
report = single_card.report()
singlecard_nb.release()
print(json.dumps({"finished": trainer.state.finished, "epoch": trainer.current_epoch,
                  "wrapped": sorted(set(module.wrapped_in)), "first": module.losses[0],
                  "last": module.losses[-1], "groups": report["groups"],
                  "initialized": torch.distributed.is_initialized()}))
"""
    result, _ = run_fresh_python(code)
    assert result["finished"] and result["epoch"] == 4 and result["groups"] == 1
    assert result["wrapped"] == ["DistributedDataParallel"]
    assert result["last"] < result["first"] / 4 and result["initialized"] is False


# --- Hugging Face Trainer ---------------------------------------------------------------------
class TokenTask(Dataset):
    """Label = whether the first token is in the upper half of the vocabulary."""

    def __init__(self, n: int = 64, vocab: int = 32):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, 8), generator=generator)
        self.labels = (self.ids[:, 0] >= vocab // 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def test_hugging_face_trainer_trains_under_a_pin(pinned_cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)  # random weights
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, num_train_epochs=6,
        learning_rate=5e-3, logging_steps=4, save_strategy="no", report_to=[],
        disable_tqdm=True, seed=0)
    try:
        trainer = transformers.Trainer(model=model, args=args, train_dataset=TokenTask())
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert trainer.args.world_size == 1 and trainer.args.device.type == "cpu"
        assert len(losses) == 6 and losses[-1] < losses[0] * 0.8, losses
    finally:
        _reset_accelerate()


# --- accelerate -------------------------------------------------------------------------------
def test_accelerate_prepared_loop_trains_under_a_pin(pinned_cpu):
    accelerate = pytest.importorskip("accelerate")
    try:
        accelerator = accelerate.Accelerator()
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(linear_problem(), batch_size=16, shuffle=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        assert accelerator.num_processes == 1 and accelerator.device.type == "cpu"
        assert int(os.environ["WORLD_SIZE"]) == 1  # what single-card mode told it
        epoch_losses = []
        for _ in range(4):
            losses = []
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                losses.append(loss.item())
            epoch_losses.append(sum(losses) / len(losses))
        assert epoch_losses[-1] < epoch_losses[0] / 4, epoch_losses
    finally:
        _reset_accelerate()


def _reset_accelerate() -> None:
    """accelerate keeps one process-wide state; the next test (or user) starts afresh."""
    try:
        from accelerate.state import AcceleratorState
    except ImportError:
        return
    AcceleratorState._reset_state(reset_partial_state=True)
