"""Where a rank stands: the user's own innermost file:line (not torch's, not ours, not the
standard library's or an installed package's) and the torch.distributed call made from it, read
from a stack (sampled, raised, or faulthandler's dump). Standard library only, but for torch's
location."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .. import frames

Frame = tuple[str, int, str]  # (file name, line, function), innermost first


def is_user_file(filename: str) -> bool:
    """Not torch's, not ours, not the standard library's, an installed package's or a frozen
    module's: the user's own script (frames.py's rule, with `installed`)."""
    return frames.is_user_file(filename, installed=True)


def _collective(frame: Frame) -> str | None:
    """The torch.distributed entry a frame is in, named as the user called it."""
    filename, _, function = frame
    path = filename.replace(os.sep, "/")
    if "/torch/distributed/" in path and function not in ("wrapper", "<module>"):
        return function
    if path.endswith("/torch/nn/parallel/distributed.py"):
        return f"DistributedDataParallel.{function}"
    if "/torch/autograd/" in path and function == "backward":
        return "backward (DDP's gradient all_reduce)"
    return None


def locate(stack: Sequence[Frame]) -> dict[str, Any]:
    """{"where": "file:line" of the innermost user frame, "collective": the torch.distributed
    call made from it (None: not in one)}; frames innermost first."""
    for index, frame in enumerate(stack):
        if is_user_file(frame[0]):
            collective = None
            for callee in reversed(stack[:index]):  # from the user's call inwards
                collective = _collective(callee)
                if collective is not None:
                    break
            return {"where": f"{frame[0]}:{frame[1]}", "function": frame[2],
                    "collective": collective}
    return {"where": None, "function": None, "collective": None}


def frames_of(frame: Any) -> list[Frame]:
    found = []
    while frame is not None:
        found.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return found


def raised_frames(error: BaseException) -> list[Frame]:
    """Each frame of an exception's traceback at the line it raised from, innermost first."""
    tb, inner = error.__traceback__, []
    while tb is not None:
        inner.insert(0, (tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return inner
