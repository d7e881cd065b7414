"""FSDP1 in the shape of torch's FSDP tutorial (a test script; argv: device_id form, checkpoint).

torchrun's variables, `set_device(rank)`, `FSDP(model, auto_wrap_policy=..., device_id=...)`, a
few steps with `clip_grad_norm_` and `no_sync`, a FULL_STATE_DICT checkpoint saved on rank 0 and
loaded back into a fresh FSDP model.
"""

import functools
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

form, path = sys.argv[1], sys.argv[2]
rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
torch.cuda.set_device(rank)
device_id = {"local_rank": rank, "current_device": torch.cuda.current_device(),
             "device": torch.device("cuda", rank), "none": None}[form]


def build() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 2))
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    return FSDP(model.to(rank), auto_wrap_policy=policy, device_id=device_id)


model = build()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1)
x, y = torch.randn(32, 8).to(rank), torch.randint(0, 2, (32,)).to(rank)
losses = []
for step in range(4):
    with model.no_sync() if step % 2 == 0 else torch.enable_grad():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    model.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())

full = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, full):
    state = model.state_dict()
if dist.get_rank() == 0:
    torch.save(state, path)
dist.barrier()

reloaded = build()
with FSDP.state_dict_type(reloaded, StateDictType.FULL_STATE_DICT):
    reloaded.load_state_dict(torch.load(path))
with FSDP.summon_full_params(reloaded):
    first_weight = reloaded.module[0].weight.detach().clone()
same = torch.equal(model(x), reloaded(x))
print(f"fsdp1 {form}: losses {[round(v, 4) for v in losses]} keys {sorted(state)} "
      f"reloaded equal {same} weight {tuple(first_weight.shape)}")
dist.destroy_process_group()
