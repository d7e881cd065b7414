"""What an inspector borrows is given back at stop(), not only at %unload_ext."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim import optimizer as optim_globals

import singlecard_nb as scn
from singlecard_nb import borrow
from singlecard_nb.inspection.recording import attach


def ours_in_the_optimizer_table() -> int:
    def owner_of(hook):
        hook = getattr(hook, "__wrapped__", hook)  # torch.compiler.disable's wrapper
        return getattr(hook, "__self__", None)

    return sum(owner_of(h) is attach._optimizer_listeners
               for h in optim_globals._global_optimizer_post_hooks.values())


def train(model: nn.Module, **options) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with scn.inspect(model, **options):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    optimizer.step()  # after stop(): nothing of ours runs


def test_the_global_optimizer_step_hook_leaves_torchs_table_at_stop():
    for options in ({"params": True}, {"memory": True}, {"params": True, "memory": True}):
        train(nn.Sequential(nn.Linear(4, 3)), **options)
        assert ours_in_the_optimizer_table() == 0, options
        assert "inspect: optimizer step hook" not in [o.name for o in borrow.active_owners()]


def test_two_inspectors_share_the_hook_until_the_last_stops():
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    first = scn.inspect(a, params=True)
    second = scn.inspect(b, params=True)
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    (a(torch.ones(1, 4)).sum() + b(torch.ones(1, 4)).sum()).backward()
    opt.step()
    first.stop()
    assert ours_in_the_optimizer_table() == 1  # the second still listens
    (a(torch.ones(1, 4)).sum() + b(torch.ones(1, 4)).sum()).backward()
    opt.step()
    second.stop()
    assert ours_in_the_optimizer_table() == 0
    params = second.frame().query("io == 'param'")
    assert sorted(set(params.step)) == [0, 1]
