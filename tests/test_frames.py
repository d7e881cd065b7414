"""One rule for "is this frame the user's code" (frames.py), used by every notice and traceback
that points at the user's line."""

from __future__ import annotations

import os

import torch

from singlecard_nb import frames, job
from singlecard_nb.inspection.diagnostics import user_stacklevel

_SITE = os.path.dirname(os.path.dirname(torch.__file__))


def test_a_package_named_like_torch_is_not_torchs():
    # torchvision lies beside torch: a prefix match without the separator took it for torch's
    assert frames.is_user_file(os.path.join(_SITE, "torchvision", "ops", "boxes.py"))
    assert not frames.is_user_file(os.path.join(_SITE, "torch", "nn", "modules", "module.py"))
    assert not frames.is_user_file(frames.__file__)


def test_a_notice_from_torchvisions_frame_points_at_that_frame():
    namespace = {"__name__": "torchvision.fake"}
    exec(compile("def call(f):\n    return f()\n",
                 os.path.join(_SITE, "torchvision", "fake.py"), "exec"), namespace)
    assert namespace["call"](user_stacklevel) == 1  # torchvision's own line, not its caller's


def test_installed_packages_and_frozen_modules_are_not_a_ranks_own_script():
    assert frames.is_user_file("/tmp/train.py", installed=True)
    assert not frames.is_user_file("<frozen runpy>", installed=True)
    assert not frames.is_user_file(os.__file__, installed=True)  # the standard library


def test_trimmed_starts_at_the_first_kept_entry():
    def inner():
        raise ValueError("x")

    try:
        inner()
    except ValueError as error:
        tb = error.__traceback__
    kept = frames.trimmed(tb, keep=lambda name: False)
    assert kept is None
    assert frames.trimmed(tb, keep=lambda name: True) is tb


def test_torchrun_environ_is_what_torchrun_sets():
    environ = job.torchrun_environ(1, 3, 29500)
    assert environ["RANK"] == environ["LOCAL_RANK"] == environ["ROLE_RANK"] == "1"
    assert environ["WORLD_SIZE"] == environ["LOCAL_WORLD_SIZE"] == "3"
    assert environ["MASTER_PORT"] == "29500" and environ["MASTER_ADDR"] == "127.0.0.1"
    assert set(environ) <= set(job.TORCHRUN_VARIABLES)
