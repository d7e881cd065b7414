"""What the single-card tests share: every object single-card mode replaces, clean state, sockets."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel as DDP

from singlecard_nb.parallel import cpu_memory, remap, sockets
from singlecard_nb.parallel import single_card as parallel

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")
_ABSENT = "<absent>"


def _own(cls: type, name: str) -> object:
    # The class's own slot: a patch of an inherited method must be deleted again, not copied.
    return cls.__dict__.get(name, _ABSENT)


def patched_objects(cpu: bool = True) -> dict[str, object]:
    """Every torch object single-card mode replaces, read fresh (cpu: also the CPU answers)."""
    functional = sys.modules["torch.nn.parallel.data_parallel"]
    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    objects: dict[str, object] = {
        "DataParallel.__init__": _own(nn.DataParallel, "__init__"),
        "DataParallel.forward": _own(nn.DataParallel, "forward"),
        "data_parallel (module)": functional.data_parallel,
        "nn.parallel.data_parallel": nn.parallel.data_parallel,
        "DDP.__init__": _own(DDP, "__init__"),
        "DDP.__setstate__": _own(DDP, "__setstate__"),
        "dist.init_process_group": dist.init_process_group,
        "c10d.init_process_group": distributed_c10d.init_process_group,
        "dist.destroy_process_group": dist.destroy_process_group,
        "c10d.destroy_process_group": distributed_c10d.destroy_process_group,
        "Tensor.to": _own(torch.Tensor, "to"),
        "Tensor.cuda": _own(torch.Tensor, "cuda"),
        "Module.to": _own(nn.Module, "to"),
        "UntypedStorage.cuda": _own(torch.storage._StorageBase, "cuda"),
        "TypedStorage.cuda": _own(torch.TypedStorage, "cuda"),
        "torch.load": torch.load,
        "serialization.load": torch.serialization.load,
        "torch.cuda.set_device": torch.cuda.set_device,
        "torch.cuda.device.__init__": _own(torch.cuda.device, "__init__"),
        "torch.set_default_device": torch.set_default_device,
        "mp.spawn": mp.spawn,
        "mp.start_processes": mp.start_processes,
        "spawn.spawn": spawn_module.spawn,
        "spawn.start_processes": spawn_module.start_processes,
    }
    from torch.distributed import device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    objects.update({
        "FSDP.__init__": _own(FSDP, "__init__"),
        "init_device_mesh": device_mesh.init_device_mesh,
        "sys.exit": sys.exit,
    })
    if hasattr(torch.accelerator, "device_index"):  # torch 2.8+
        objects["torch.accelerator.device_index.__init__"] = _own(torch.accelerator.device_index,
                                                                  "__init__")
    objects.update({f"torch.accelerator.{n}": getattr(torch.accelerator, n) for n in (
        "set_device_index", "set_device_idx", "is_available", "device_count")})
    objects.update({f"torch.cuda.{n}": getattr(torch.cuda, n) for n in ("is_available",
                                                                       "device_count")})
    objects.update({f"torch.{n}": getattr(torch, n) for n in remap.FACTORIES if hasattr(torch, n)})
    objects.update({f"Tensor.{n}": _own(torch.Tensor, n) for n in remap.TENSOR_FACTORIES})
    if cpu:
        names = ("synchronize", "manual_seed", "manual_seed_all", "memory_stats",
                 "memory_summary", "mem_get_info", *cpu_memory.ZERO_COUNTERS,
                 *cpu_memory.RESETS, "Event", "Stream", "current_stream", "default_stream",
                 "stream", "set_stream", "get_rng_state", "set_rng_state", "get_rng_state_all",
                 "set_rng_state_all", "seed", "seed_all", "initial_seed", "current_device",
                 "get_device_name", "_lazy_init")
        objects.update({f"torch.cuda.{n}": getattr(torch.cuda, n) for n in names})
        objects["autocast.__init__"] = _own(torch.amp.autocast_mode.autocast, "__init__")
        objects["GradScaler.__init__"] = _own(torch.amp.GradScaler, "__init__")
        objects.update({f"Tensor.{n}": _own(torch.Tensor, n) for n in ("pin_memory", "is_pinned",
                                                                     "record_stream")})
        objects["DataLoader.__init__"] = _own(torch.utils.data.DataLoader, "__init__")
        objects.update({f"torch.accelerator.{n}": getattr(torch.accelerator, n) for n in (
            "current_accelerator", "current_device_index", "current_stream", "synchronize",
            "memory_allocated") if hasattr(torch.accelerator, n)})  # memory_*: torch 2.8+
    return objects


def builtin_table_size() -> int:
    """Entries in TorchScript's table of torch functions (single-card mode adds its wrappers)."""
    from torch.jit import _builtins

    return len(_builtins._get_builtin_table())


@pytest.fixture
def clean_state(monkeypatch):
    """No torchrun variables from the outside; single-card mode and process groups end after."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    parallel.disable()
    if dist.is_initialized():
        dist.destroy_process_group()


def listening(address: str) -> bool:
    """Whether this process still listens on "host:port" (from /proc, as status reads it)."""
    return address in sockets.listening_sockets().values()


def refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return False
    except OSError:
        return True


def on_linux() -> bool:
    return os.path.isdir("/proc/self/fd")
