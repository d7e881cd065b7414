"""A DDP training job written for torchrun, in the shape of the DDP tutorial series
(pytorch/examples `distributed/ddp-tutorial-series`).

Real launch, one process per GPU (this is what the script is written for):

    torchrun --standalone --nproc_per_node=4 multigpu_torchrun.py 10 2

Each process reads its LOCAL_RANK from torchrun, selects its card with `torch.cuda.set_device`,
joins an nccl process group, puts the model and every batch on its card with `.to(local_rank)`,
trains on its quarter of the data (DistributedSampler), DDP averages the gradients, and a
snapshot is resumed with `torch.load(path, map_location=f"cuda:{local_rank}")`.

In a notebook under singlecard_nb, unchanged (`%run scripts/multigpu_torchrun.py 10 2`):
`%singlecard 1` / `auto` run it as a world of one on the pinned GPU; `%singlecard cpu` on the
CPU: torchrun's variables are provided, `.to(0)`, `set_device(0)` and `map_location="cuda:0"`
land on the CPU, `init_process_group("nccl")` forms a one-process gloo group, and DDP is the real
DDP over that world of one. Each of these is said once. Re-running the cell neither fails nor
hangs; `%singlecard off` gives torch back.

Positional args: total_epochs save_every. Each epoch prints its mean loss; `main` returns the
list of epoch losses (after `%run` it is `epoch_losses` in the notebook). A snapshot at
--snapshot_path is resumed from.
"""

import os

import torch
import torch.nn.functional as F
from datautils import MyTrainDataset
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.gpu_id])

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=f"cuda:{self.gpu_id}")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets) -> float:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch) -> float:
        batch_size = len(next(iter(self.train_data))[0])
        self.train_data.sampler.set_epoch(epoch)
        losses = []
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            losses.append(self._run_batch(source, targets))
        mean_loss = sum(losses) / len(losses)
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {batch_size} | "
              f"Steps: {len(self.train_data)} | loss {mean_loss:.4f}")
        return mean_loss

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch + 1,  # the epoch to resume at
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> list:
        epoch_losses = []
        for epoch in range(self.epochs_run, max_epochs):
            epoch_losses.append(self._run_epoch(epoch))
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
        return epoch_losses


def load_train_objs():
    torch.manual_seed(0)
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=True, shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    epoch_losses = trainer.train(total_epochs)
    destroy_process_group()
    return epoch_losses


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int,
                        help="Input batch size on each device (default: 32)")
    parser.add_argument("--snapshot_path", default="snapshot.pt",
                        help="Where to save and resume from")
    args = parser.parse_args()

    epoch_losses = main(args.save_every, args.total_epochs, args.batch_size, args.snapshot_path)
