"""Code written for GPUs under `%singlecard cpu`, at the edges users meet: every form of a
request gets the same answer, and a notice points at the user's own line."""

from __future__ import annotations

import warnings

import pytest
import torch
from parallel_support import clean_state  # noqa: F401 - used by every test (pytestmark)

from singlecard_nb.parallel import single_card as parallel

CPU = torch.device("cpu")

pytestmark = [pytest.mark.usefixtures("clean_state")]


def test_factory_functions_asked_for_pinned_memory_answer_as_pin_memory_does():
    parallel.enable(CPU)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        made = [torch.zeros(2, pin_memory=True), torch.empty(3, 2, pin_memory=True),
                torch.ones(2, pin_memory=True), torch.full((2,), 1.0, pin_memory=True),
                torch.randn(2, pin_memory=True), torch.tensor([1.0], pin_memory=True),
                torch.empty(2, device="cuda", pin_memory=True)]
        made.append(made[0].new_empty(2, pin_memory=True))
        made.append(made[0].pin_memory())
    assert all(t.device == CPU and t.is_pinned() for t in made)
    pinned = [w for w in said if "pin_memory" in str(w.message)]
    assert len(pinned) == 1 and "torch.zeros(..., pin_memory=True)" in str(pinned[0].message)
    assert pinned[0].filename == __file__  # the user's line, not ours
    assert any("pin_memory" in n and "(×9)" in n for n in parallel.report()["notices"])
