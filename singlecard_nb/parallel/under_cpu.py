"""Is single-card mode pinned to the CPU (`%singlecard cpu`)? The wing's one answer.

Under the CPU, CUDA calls are answered by the CPU (cuda_on_cpu.py), DDP and DataParallel get no
device ids, process groups use gloo, `.cuda()` means "the device". Every module of the wing asks
here rather than reading the device's type itself, so they cannot disagree on which case it is.
"""

from __future__ import annotations

import torch


def under_cpu(device: torch.device) -> bool:
    """Whether `device`, the device single-card mode follows, is the CPU rather than a card."""
    return device.type != "cuda"
