"""scn.fit: the peak of a training step, planned on fake tensors, against a real step's peak;
nothing of the real model changes; a described card's free memory is what it fits into."""

from __future__ import annotations

import copy
import weakref

import pytest
import torch
from test_memory import Attention, _cnn
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import singlecard_nb as scn
from singlecard_nb.pinning import devices
from singlecard_nb.pinning.devices import Machine


class RealPeak(TorchDispatchMode):
    """The CPU peak of a real step: live tensor storages (counted from the operation that made
    them until their storage's weakref finalizer runs), plus those alive when it starts. RSS
    would be too noisy (the allocator keeps freed pages) for a 10% comparison."""

    def __init__(self, tensors):
        super().__init__()
        self.now = self.peak = 0
        self.seen: set[int] = set()
        for t in tensors:
            self._track(t)
        self.peak = self.now

    def _track(self, t):
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.seen or not storage.data_ptr():
            return
        self.seen.add(key)
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key, storage.nbytes())

    def _free(self, key, nbytes):
        self.seen.discard(key)
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._track(t)
        return out


def real_peak(model, opt, x):
    resident = [*model.parameters(), *model.buffers(), x]
    resident += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    with RealPeak(resident) as ledger:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return ledger.peak


@pytest.mark.parametrize("make,shape", [
    (_cnn, (16, 3, 24, 24)),
    (lambda: nn.Sequential(Attention(64), Attention(64), nn.Linear(64, 8)), (8, 64, 64)),
])
def test_peak_within_10_percent_of_a_real_step(make, shape):
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(shape)
    plan = scn.fit(model, x, optimizer=opt)  # a fresh optimizer: its first step runs unmeasured
    model(x).sum().backward()  # the real one: first step (makes the state), then measured
    opt.step()
    opt.zero_grad(set_to_none=True)
    real = real_peak(model, opt, x)
    assert abs(plan.peak - real) <= 0.1 * real, (plan.peak, real)
    assert set(plan.by_kind) == {"parameters", "gradients", "optimizer", "activations", "other"}
    assert sum(plan.by_kind.values()) == plan.peak
    params = sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    assert plan.by_kind["parameters"] == params
    assert plan.by_kind["activations"] > 0
    frame = plan.frame()
    assert frame["total"].sum() == plan.peak and frame["total"].is_monotonic_decreasing


def test_nothing_of_the_real_model_or_optimizer_changes():
    torch.manual_seed(0)
    model = _cnn()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    opt.step()  # real state and gradients exist
    before = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    versions = [p._version for p in model.parameters()]
    state = copy.deepcopy(opt.state_dict())
    scn.fit(model, torch.randn(4, 3, 16, 16), optimizer=opt)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert [p._version for p in model.parameters()] == versions
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    after = opt.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for key, values in state["state"].items():
        for name, value in values.items():
            assert torch.equal(after["state"][key][name], value), (key, name)
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_missing_input_is_named():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, mask):
            return self.fc(x) * mask

    with pytest.raises(TypeError, match=r"needs 'mask', which the batch does not give"):
        scn.fit(Masked(), torch.randn(2, 4))
    plan = scn.fit(Masked(), {"x": torch.randn(2, 4), "mask": torch.ones(2, 4)})
    assert plan.batch == 2


def test_described_card_too_small_says_what_to_change(monkeypatch):
    tiny = {"gpus": [{"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                      "name": "Tiny", "pci_bus_id": "00000000:01:00.0",
                      "memory_total": 64 * 2 ** 20, "memory_used": 4 * 2 ** 20, "utilization": 0,
                      "processes": [], "mig": []}]}
    devices.use_machine(Machine.from_dict(tiny))
    environ: dict[str, str] = {}
    try:
        scn.pin(0, environ=environ, single_card=False)
        torch.manual_seed(0)
        model = nn.DataParallel(nn.Sequential(*(nn.Sequential(nn.Linear(128, 512), nn.GELU(),
                                                              nn.Linear(512, 128))
                                                for _ in range(4))))
        opt = torch.optim.Adam(model.parameters())
        plan = scn.fit(model, torch.randn(4096, 128), optimizer=opt)
    finally:
        scn.release()
        devices.use_machine(None)
    assert plan.card.free == 60 * 2 ** 20 and plan.card.label.startswith("GPU 0")
    assert not plan.fits and plan.peak > plan.card.free
    assert 1 <= plan.max_batch < 4096
    assert plan.predict(plan.max_batch) <= plan.card.free < plan.predict(plan.max_batch + 1)
    text = repr(plan)
    micro, steps = plan.micro_batch()
    assert micro * steps == 4096 and micro <= plan.max_batch
    assert f"micro-batch {micro} with {steps} gradient-accumulation steps" in text
    assert "bf16 autocast" in text and "does NOT fit" in text
    assert "<table" in plan._repr_html_()
