"""Selecting modules as people type it, and counting steps as people read it."""

from __future__ import annotations

import warnings

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import singlecard_nb as scn


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize("include", ['"Linear"', "'Linear'", "Linear", ['"0"', "'2'"]])
def test_quoted_and_unquoted_globs_select_the_same_modules(include):
    model = _model()
    with scn.inspect(model, include=include) as insp:
        model(torch.ones(1, 4))
    assert set(insp.frame().query("io == 'output'")["module"]) == {"0", "2"}


def test_a_quoted_glob_typed_in_the_magic_records_its_modules():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "singlecard_nb")
    try:
        shell.user_ns.update(model=(model := _model()), torch=torch)
        result = shell.run_cell('%inspect model --include "Linear"\nmodel(torch.ones(1, 4))',
                                silent=True)
        assert result.error_in_exec is None
        insp = scn.inspector(model)
        shell.run_cell("%inspect off", silent=True)
        assert set(insp.frame().query("io == 'output'")["module"]) == {"0", "2"}
    finally:
        shell.run_line_magic("unload_ext", "singlecard_nb")


def test_a_glob_that_matches_nothing_is_said_once_with_what_it_could_match():
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with scn.inspect(model, include="nomatch*") as insp:
            model(torch.ones(1, 4))
            model(torch.ones(1, 4))
    said = [str(w.message) for w in caught if "matches no module" in str(w.message)]
    assert len(said) == 1
    assert "'nomatch*'" in said[0] and "nothing is recorded" in said[0]
    assert "'0'" in said[0] and "Linear" in said[0]  # what the user could have typed
    assert insp.frame().empty and any("matches no module" in n for n in insp.notes)


def test_an_exclude_that_matches_nothing_is_said_too():
    model = _model()
    with pytest.warns(UserWarning, match="exclude 'Conv2d' matches no module.*leaves out nothing"):
        insp = scn.inspect(model, exclude="Conv2d")
    insp.stop()


def test_steps_recorded_counts_a_finished_step_at_once():
    model = _model()
    with scn.inspect(model) as insp:
        model(torch.ones(1, 4))
        assert insp.steps_recorded == 1  # before anything moved its rows to the host
        assert len(insp.frame()) and insp.steps_recorded == 1
        model(torch.ones(1, 4))
        assert insp.steps_recorded == 2
    assert insp.steps_recorded == 2
