"""A DDP job in the shape of the DDP tutorial's multigpu_torchrun.py: the process group from
torchrun's environment variables (a plain `python healthy_ddp.py` runs a world of one: RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT get defaults when absent), gloo on the CPU, the model
(one Linear(20, 1), as the tutorial's) wrapped in DistributedDataParallel, a DistributedSampler
sharding a random dataset, SGD at lr 1e-3, MSE, epochs until the steps are done.

    python healthy_ddp.py --steps 300
    torchrun --nproc_per_node=2 healthy_ddp.py --steps 300
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                         ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(key, default)
    dist.init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def train(self, max_steps):
        step, epoch = 0, 0
        while step < max_steps:
            self.train_data.sampler.set_epoch(epoch)
            for source, targets in self.train_data:
                loss = self._run_batch(source, targets)
                step += 1
                if step == max_steps:
                    break
            epoch += 1
        print(f"[rank {dist.get_rank()}] epoch {epoch} step {step}: loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    ddp_setup()
    torch.manual_seed(0)
    dataset = MyTrainDataset(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=args.batch_size, pin_memory=False, shuffle=False,
                        sampler=DistributedSampler(dataset))
    Trainer(model, loader, optimizer).train(args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
