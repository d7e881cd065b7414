"""FSDP1 in the shape of torch's FSDP tutorial (a test script).

argv: the device_id form, the checkpoint path, and optionally FSDP options joined by commas
(mixed, offload, sync, orig: mixed precision, CPU offload, sync_module_states,
use_orig_params). torchrun's variables, `set_device(rank)`, `FSDP(model, auto_wrap_policy=...,
device_id=...)`, a few steps with `clip_grad_norm_` and `no_sync`, a FULL_STATE_DICT checkpoint
saved on rank 0 and loaded back into a fresh FSDP model, a SHARDED_STATE_DICT and the optimizer
state read back.
"""

import functools
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffload, FullStateDictConfig, MixedPrecision, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

form, path = sys.argv[1], sys.argv[2]
options = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set()
extra = {"mixed_precision": MixedPrecision(param_dtype=torch.bfloat16)} if "mixed" in options else {}
extra.update(cpu_offload=CPUOffload(offload_params=True)) if "offload" in options else None
extra.update(sync_module_states=True) if "sync" in options else None
extra.update(use_orig_params=True) if "orig" in options else None
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
    model = model if "offload" in options else model.to(rank)
    return FSDP(model, auto_wrap_policy=policy, device_id=device_id, **extra)


model = build()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1)
x, y = torch.randn(32, 8).to(rank), torch.randint(0, 2, (32,)).to(rank)
losses = []
for _ in range(4):
    with model.no_sync():  # gradient accumulation: the first half without communication
        nn.functional.cross_entropy(model(x[:16]), y[:16]).backward()
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
with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
    sharded = model.state_dict()
    optimizer_state = FSDP.optim_state_dict(model, optimizer)
assert sorted(sharded) == sorted(state) and len(optimizer_state["state"]) == len(state)
print(f"fsdp1 {form}: losses {[round(v, 4) for v in losses]} keys {sorted(state)} "
      f"reloaded equal {same} weight {tuple(first_weight.shape)}")
dist.destroy_process_group()
