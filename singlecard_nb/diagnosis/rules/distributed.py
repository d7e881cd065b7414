"""Rules on the errors of torch's distributed training: DistributedDataParallel's reducer's
parameter indices said as the parameters' names and the modules that hold them; DTensor's
missing sharding strategy for an operation's CPU kernel (tensor parallelism under `--device
cpu`).

Each rule reads a `Failure` and returns one sentence or None; `hints.RULES` orders them.
"""

from __future__ import annotations

import re
import sys

import torch

from ..failure import Failure

_UNUSED = re.compile(r"did not receive grad for rank (\d+):\s*([\d ,]+)")


def unused_parameters(f: Failure) -> str | None:
    """DDP's "Parameter indices which did not receive grad for rank 0: 0 1 2": the indices
    count the wrapped module's parameters that require grad, in named_modules() order, each
    once, less `parameters_to_ignore` (as DDP builds its reducer's list)."""
    found = _UNUSED.search(f.message)
    if not found:
        return None
    ddp = next((m for m in (f.wrapper, f.module, f.root, *(c[1] for c in f.callers))
                if type(m).__name__ == "DistributedDataParallel"), None)
    if ddp is None:
        return None
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    names, seen = [], set()
    for module_name, module in ddp.module.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if param.requires_grad and full not in ignored and id(param) not in seen:
                seen.add(id(param))
                names.append(full)
    indices = [int(i) for i in re.findall(r"\d+", found.group(2))]
    if not indices or max(indices) >= len(names):
        return None  # not the list we can rebuild: say nothing rather than a wrong name
    unused = [names[i] for i in indices]
    holders = sorted({n.rpartition(".")[0] or "(the model itself)" for n in unused})
    return (f"DistributedDataParallel got no gradient for {len(unused)} parameters in the last "
            f"backward on rank {found.group(1)}: {', '.join(unused)} (held by "
            f"{', '.join(holders)}): forward never used them in what the loss depends on; use "
            "them, remove them, or pass find_unused_parameters=True to DistributedDataParallel")


_NO_STRATEGY = re.compile(
    r"Operator aten\.(\w+)_for_cpu\.(\w+) does not have a sharding strategy registered")


def cpu_kernel_not_sharded(f: Failure) -> str | None:
    """DTensor's "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not
    have a sharding strategy registered": a tensor-parallel model (pytorch/examples'
    tensor_parallelism/fsdp_tp_example.py) run on CPU ranks, where torch picks a CPU kernel
    DTensor cannot shard. Said only when DTensor has a strategy for the GPU's kernel of it."""
    found = _NO_STRATEGY.search(f.message)
    dtensor = sys.modules.get("torch.distributed.tensor")
    if not found or dtensor is None:
        return None
    name, overload = found.groups()
    gpu_kernel = getattr(getattr(torch.ops.aten, name, None), overload, None)
    try:
        propagator = dtensor.DTensor._op_dispatcher.sharding_propagator
    except AttributeError:  # another torch's layout: say nothing rather than guess
        return None
    # its tables of strategies: op_strategy_funcs, and from torch 2.15 most operations in
    # op_single_dim_strategy_funcs
    tables = [getattr(propagator, table, {}) for table in ("op_strategy_funcs",
                                                            "op_single_dim_strategy_funcs")]
    if gpu_kernel is None or not any(gpu_kernel in table for table in tables):
        return None
    return (f"DTensor (tensor parallelism) has no sharding strategy for aten.{name}_for_cpu, "
            f"the CPU's kernel of this operation, and one for aten.{name}, the GPU's: this "
            "tensor-parallel model runs on GPUs, not on CPU ranks (`--device cpu`, "
            "`%singlecard cpu`). Run it on GPUs, or on the CPU without its parallelize_module "
            "plan")
