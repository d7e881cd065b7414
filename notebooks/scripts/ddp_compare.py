"""A small DDP training job that records itself with singlecard_nb on every rank.

A real job, two processes on the CPU (gloo):

    torchrun --standalone --nproc_per_node=2 ddp_compare.py --out runs/ddp

The same script on one card, in a notebook under single-card mode (`%singlecard cpu`, then
`%run ddp_compare.py --out runs/single`): DDP is a pass-through and the world has one rank.

Every rank inspects its DDP-wrapped model with `params=True` (parameters after each optimiser
step, and the gradients the step used), gathers every rank's rows with
`insp.frame(ranks="all")`, asks `singlecard_nb.compare_ranks(insp)` which ranks differ, and
saves its own records to `--out` (one file per rank: `rank0.db`, `rank1.db`, ...). Rank 0 prints
a one-line JSON summary after `RESULT `.

The global batch (`--global-batch`) is split across the ranks, as when scaling a job out: each
optimiser step then averages the gradients of the same samples as one card with the whole batch.

--desync plants the kind of bug compare_ranks is for:
  param    rank 1 scales a weight outside DDP after step 2's optimiser step
  dropout  rank 1 seeds its dropout differently (with --same-data, every rank the same batch)
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import singlecard_nb as scn


def problem(size: int = 256, features: int = 20) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator) + 0.01 * torch.randn(size, 1,
                                                                               generator=generator)
    return TensorDataset(x, y)


def build_model(dropout: float) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the per-rank records")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--same-data", action="store_true", help="every rank reads every sample")
    parser.add_argument("--desync", choices=("none", "param", "dropout"), default="none")
    args = parser.parse_args(argv)

    init_process_group(backend="gloo")
    rank, world = get_rank(), get_world_size()
    dataset = problem()
    sampler = (DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
               if args.same_data else DistributedSampler(dataset, shuffle=False))
    per_rank = args.global_batch if args.same_data else args.global_batch // world
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler)
    model = DDP(build_model(args.dropout))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1 + (rank if args.desync == "dropout" else 0))  # the dropout masks

    with scn.inspect(model, grads=True, params=True) as insp:
        for step, (x, y) in zip(range(args.steps), loader):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            if args.desync == "param" and rank == 1 and step == 2:
                with torch.no_grad():
                    model.module[0].weight.mul_(1.001)  # an update DDP never sees

    everyone = insp.frame(ranks="all")  # collectives: every rank calls them
    ranks = scn.compare_ranks(insp)
    path = insp.save(os.path.join(args.out, ""))
    first = ranks.first
    result = {
        "rank": rank, "world_size": world, "saved": str(path),
        "gathered_ranks": sorted(int(r) for r in everyone["rank"].unique()),
        "gathered_rows": len(everyone), "own_rows": len(insp.frame()),
        "differing_ranks": ranks.ranks,
        "first": None if first is None else {
            k: getattr(first, k) for k in ("step", "module", "io", "index", "stat", "rank")},
        "notes": ranks.notes,
    }
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    destroy_process_group()
    return result


if __name__ == "__main__":
    result = main()
