"""Out of memory explained: the module, what it tried to allocate, what was resident, and the
micro-batch and accumulation steps that keep the global batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import singlecard_nb as scn

GiB = 2 ** 30


class Limited(nn.Module):
    """A block that raises CUDA's own OutOfMemoryError (its message shape) above a batch size,
    as a 16 GiB card would: deterministic on a CPU runner."""

    def __init__(self, limit: int):
        super().__init__()
        self.fc, self.limit = nn.Linear(32, 32), limit

    def forward(self, x):
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "15.77 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process "
                "has 14.00 GiB memory in use. Of the allocated memory 13.50 GiB is allocated by "
                "PyTorch, and 200.00 MiB is reserved by PyTorch but unallocated.")
        return torch.relu(self.fc(x))


def _model(limit: int = 16):
    return nn.Sequential(nn.Linear(32, 32), nn.ModuleList([Limited(limit)])[0], nn.Linear(32, 4))


def test_cuda_oom_names_module_allocation_and_micro_batch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # a DDP script: 4 ranks × 64 per rank
    model = _model()
    with pytest.raises(torch.OutOfMemoryError) as info:
        model(torch.randn(64, 32))
    text = repr(scn.explain(info.value))
    assert "Limited '1'" in text and "trying to allocate 2.0 GiB" in text
    assert "parameters" in text and "activations not known" in text
    # 14 GiB in use + 1 GiB free = 15 GiB usable; the batch is sized down, global batch kept
    assert "gradient-accumulation steps keeps the global batch of 256 (4 ranks × 64 per rank)" in text
    micro = int(text.split("micro-batch of at most ")[1].split()[0])
    assert 1 <= micro < 64 and 256 % micro == 0


def test_the_hint_survives_a_dead_weak_proxy_in_the_heap(monkeypatch):
    # Left by other code in a long kernel; asking its class raises ReferenceError
    import weakref

    class Gone:
        pass

    dead = weakref.proxy(Gone())
    holder = [dead]  # the proxy stays on the heap the rule walks for optimizers
    model = _model()
    with pytest.raises(torch.OutOfMemoryError) as info:
        model(torch.randn(64, 32))
    assert "trying to allocate 2.0 GiB" in repr(scn.explain(info.value)) and holder


def test_cpu_allocator_failure_is_explained_with_the_inspectors_table():
    class Huge(nn.Module):
        def forward(self, x):
            return x * torch.empty(1 << 50, dtype=torch.uint8)[:1].float()  # 1 PiB: refused

    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), Huge())
    with scn.inspect(model, memory=True):
        with pytest.raises(RuntimeError, match="allocate") as info:
            model(torch.randn(32, 8))
        explanation = scn.explain(info.value)
    assert explanation.module == "2"
    text = repr(explanation)
    assert "ran out of host memory trying to allocate 1024.0 TiB" in text
    assert "activations" in text and "biggest: " in text  # by module, from memory=True
    assert "micro-batch of at most" in text
    from singlecard_nb.capacity import MEMORY_TABLES

    assert MEMORY_TABLES.of(model) is None  # a stopped inspector's table is withdrawn


def test_other_errors_get_no_memory_hint():
    model = nn.Linear(3, 2)
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(2, 5))
    assert "memory" not in (scn.explain(info.value).hint or "")
