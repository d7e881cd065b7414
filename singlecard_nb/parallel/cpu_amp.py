"""`%singlecard cpu`: `torch.autocast("cuda")` and `GradScaler("cuda")` where the GPU is the CPU
(cuda_on_cpu.py): autocast on the CPU with the same dtype (float16 when none is given, as on a
GPU), and a CPU GradScaler that really scales; torch's own warnings shown at the user's line.
float16 on the CPU (autocast, `model.half()`, `model.to(torch.float16)`) is said once to be slow,
with what to pass instead: code written for a GPU picks it (nanoGPT's train.py does)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any

import torch
from torch import nn

from ..borrow import Borrowed, wrap_like
from ..frames import user_frame
from ..notices import Notices

# A training step in float16 against float32 on the CPU (benchmarks/cpu_float16.py: a 4-layer
# 256-wide MLP under autocast, one thread, torch 2.13, 2-core Xeon): 11.8x; bfloat16 0.7x.
FLOAT16_SLOWDOWN = 12


def install(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    """autocast("cuda") and GradScaler("cuda") on `device` (the CPU), owned by `owner`."""
    _patch_autocast(owner, device, notices)
    _patch_grad_scaler(owner, device, notices)
    _patch_module_float16(owner, notices)


def say_float16(notices: Notices, what: str, stacklevel: int) -> None:
    """Once: float16 on the CPU is slow, and what to pass instead."""
    notices.say("float16", lambda: (
        f"singlecard_nb: {what} computes in float16 on the CPU under `%singlecard cpu`, "
        f"which is slow there: a training step measured ~{FLOAT16_SLOWDOWN}x slower than in "
        "float32. Pass float32 or bfloat16 instead (nanoGPT's train.py: --dtype=float32, or "
        "--dtype=bfloat16)."), stacklevel=stacklevel + 1)


def _patch_module_float16(owner: Borrowed, notices: Notices) -> None:
    """`model.half()` and `model.to(torch.float16)`: said (float16), then torch's own."""
    half, to = nn.Module.half, nn.Module.to

    def module_half(self):
        say_float16(notices, f"{type(self).__name__}.half()", _users_frame(sys._getframe())[1])
        return half(self)

    def module_to(self, *args, **kwargs):
        if kwargs.get("dtype") is torch.float16 or any(a is torch.float16 for a in args):
            say_float16(notices, f"{type(self).__name__}.to(torch.float16)",
                        _users_frame(sys._getframe())[1])
        return to(self, *args, **kwargs)

    owner.set_attr(nn.Module, "half", wrap_like(half, module_half), "Module.half (float16)")
    owner.set_attr(nn.Module, "to", wrap_like(to, module_to), "Module.to (float16)")


def _patch_autocast(owner: Borrowed, device: torch.device, notices: Notices) -> None:
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if enabled and device_type in ("cuda", device.type) and (
                dtype is torch.float16 or (dtype is None and device_type == "cuda")):
            say_float16(notices, f"torch.autocast('{device_type}', torch.float16)",
                        _users_frame(sys._getframe())[1])
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
