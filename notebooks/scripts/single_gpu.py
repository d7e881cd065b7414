"""Training on one GPU, the first step of the DDP tutorial series (pytorch/examples
`distributed/ddp-tutorial-series`): `python single_gpu.py 10 2`.

The device is the int 0 ("cuda:0"): the model goes there with `model.to(0)` and every batch with
`.to(0)`. Under `%singlecard cpu` single-card mode sends both to the CPU, unchanged.
Positional args: total_epochs save_every. A checkpoint is written to ./checkpoint.pt.
"""

import torch
import torch.nn.functional as F
from datautils import MyTrainDataset
from torch.utils.data import DataLoader, Dataset


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        gpu_id: int,
        save_every: int,
    ) -> None:
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets) -> float:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        batch_size = len(next(iter(self.train_data))[0])
        losses = []
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            losses.append(self._run_batch(source, targets))
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {batch_size} | "
              f"Steps: {len(self.train_data)} | loss {sum(losses) / len(losses):.4f}")

    def _save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), "checkpoint.pt")
        print(f"Epoch {epoch} | Training checkpoint saved at checkpoint.pt")

    def train(self, max_epochs: int):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    torch.manual_seed(0)
    train_set = MyTrainDataset(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=True, shuffle=True)


def main(device, total_epochs, save_every, batch_size):
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, device, save_every)
    trainer.train(total_epochs)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="simple training job on one GPU")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a checkpoint")
    parser.add_argument("--batch_size", default=32, type=int,
                        help="Input batch size on each device (default: 32)")
    args = parser.parse_args()

    device = 0  # the first GPU, as an int: cuda:0
    main(device, args.total_epochs, args.save_every, args.batch_size)
