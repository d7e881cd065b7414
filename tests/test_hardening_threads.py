"""Threads each training their own inspected model: every optimiser step of a thread reaches
its own inspector, whole, while other threads step theirs (one process-wide hook hears every
optimiser, so another model's step cleared this one's copies for |Δw| and its rows were lost)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import singlecard_nb as scn

PER_STEP = 12  # 2 Linears × (weight, bias) × ("param", "step_grad", "update")
PARAM_IO = ["param", "step_grad", "update"]


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def param_rows(insp) -> dict[int, int]:
    frame = insp.frame()
    return frame[frame.io.isin(PARAM_IO)].groupby("step").size().to_dict()


def test_another_models_step_inside_this_ones_keeps_its_rows():
    """Thread b steps its optimiser while thread a's step is between its hooks."""
    models = {"a": net(0), "b": net(1)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    go, done = threading.Event(), threading.Event()

    def step(name):
        loss = models[name](torch.randn(4, 8)).square().mean()
        opts[name].zero_grad()
        loss.backward()
        opts[name].step()

    def b_steps_now(optimizer, args, kwargs):  # a's own pre-hook: after ours took its copies
        go.set()
        assert done.wait(10)

    def thread_b():
        assert go.wait(10)
        step("b")
        done.set()

    insp = {k: scn.inspect(m, params=True) for k, m in models.items()}
    handle = opts["a"].register_step_pre_hook(b_steps_now)
    try:
        other = threading.Thread(target=thread_b)
        other.start()
        step("a")
        other.join()
    finally:
        handle.remove()
        for i in insp.values():
            i.stop()
    assert param_rows(insp["a"]) == {0: PER_STEP}  # was 8: its "update" rows lost
    assert param_rows(insp["b"]) == {0: PER_STEP}
    frame = insp["a"].frame()
    update = frame[(frame.io == "update") & (frame.module == "0") & (frame["index"] == "weight")]
    assert update["absmax"].iloc[0] > 0


@pytest.mark.parametrize("round_", range(6))
def test_eight_threads_training_their_own_models_each_get_every_row(round_):
    steps, results, errors = 10, {}, []
    barrier = threading.Barrier(8)

    def train(i: int) -> None:
        try:
            model = net(i + 8 * round_)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            barrier.wait(10)
            with scn.inspect(model, params=i % 2 == 0) as insp:
                for _ in range(steps):
                    loss = model(torch.randn(16, 8)).square().mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            results[i] = insp
        except Exception as e:  # noqa: BLE001 - said by the assert below
            errors.append(repr(e))

    threads = [threading.Thread(target=train, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i, insp in results.items():
        assert insp.errors == []
        expected = {s: PER_STEP for s in range(steps)} if i % 2 == 0 else {}
        assert param_rows(insp) == expected, f"thread {i}"
