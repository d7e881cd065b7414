"""`%singlecard cpu`: `torch.autocast("cuda")` and `GradScaler("cuda")` where the GPU is the CPU
(cuda_on_cpu.py): autocast on the CPU with the same dtype (float16 when none is given, as on a
GPU), and a CPU GradScaler that really scales; torch's own warnings shown at the user's line."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..frames import user_frame
from ..notices import Notices


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """autocast("cuda") and GradScaler("cuda") on `device` (the CPU), owned by `owner`."""
    _patch_autocast(owner, device, notices)
    _patch_grad_scaler(owner, device, notices)


def _patch_autocast(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            users, level = _users_frame(sys._getframe())
            dtype = torch.float16 if dtype is None else dtype  # CUDA's default autocast dtype
            notices.say("autocast", lambda: (
                f"singlecard_nb: torch.autocast('cuda', {dtype}) under `%singlecard cpu` runs "
                f"as torch.autocast('{device.type}', {dtype})."), stacklevel=level)
            with _warnings_at(users):  # torch's "not supported" is about the user's line
                original(self, device.type, dtype=dtype, enabled=enabled,
                         cache_enabled=cache_enabled)
            return
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__),
                   "torch.autocast")


def _patch_grad_scaler(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.GradScaler
    original = cls.__init__

    pinned = device

    def __init__(self, device: str = "cuda", *args, **kwargs):
        if device == "cuda":
            users, level = _users_frame(sys._getframe())
            notices.say("GradScaler", lambda: (
                "singlecard_nb: torch.amp.GradScaler('cuda') under `%singlecard cpu` scales on "
                f"the {pinned.type} (GradScaler('{pinned.type}'))."), stacklevel=level)
            with _warnings_at(users):
                original(self, pinned.type, *args, **kwargs)
            return
        original(self, device, *args, **kwargs)

    owner.set_attr(cls, "__init__", wrap_like(original, __init__),
                   "torch.amp.GradScaler")


def _users_frame(ours: Any) -> tuple[Any, int]:
    """The first frame outside torch and this package above `ours` (the frame of a patched
    function: torch.cuda.amp's classes call it through super()), and the stacklevel of that
    frame for a notice said in `ours`."""
    users, steps = user_frame(ours, also=("typing_extensions",))  # its @deprecated wraps amp's
    return (users, 1 + steps) if users is not None else (ours, 1)


@contextlib.contextmanager
def _warnings_at(frame: Any) -> Any:
    """torch's own warnings from the call inside shown at the user's `frame`, not at ours."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        warnings.warn_explicit(w.message, w.category, frame.f_code.co_filename, frame.f_lineno,
                               module=frame.f_globals.get("__name__"),
                               registry=frame.f_globals.setdefault("__warningregistry__", {}))
