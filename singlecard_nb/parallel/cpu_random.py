"""`%singlecard cpu`: torch.cuda's seeds and random state where the GPU is the CPU (cuda_on_cpu.py):
the CPU generator's, which draws the numbers for the tensors the script meant for the GPU."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..borrow import Borrowed
from ..notices import Notices
from .cuda_patch import patch_cuda


def patch_seeds(owner: Borrowed, notices: Notices) -> None:
    """`manual_seed` / `manual_seed_all` seed the CPU generator (torch's own calls of them are
    left as they are: torch seeds the CPU itself)."""
    for name in ("manual_seed", "manual_seed_all"):
        patch_cuda(owner, name, lambda original, name=name: _seed(original, name, notices))


def _seed(original: Callable, name: str, notices: Notices) -> Callable:
    def seed(seed: int) -> None:
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
            return original(seed)  # torch.manual_seed seeds the CPU generator itself
        notices.say("manual_seed", lambda: (
            f"singlecard_nb: torch.cuda.{name}({seed!r}) under `%singlecard cpu` seeds the CPU "
            "generator, which draws the numbers for the tensors meant for the GPU."))
        torch.default_generator.manual_seed(int(seed))

    return seed


def patch_rng_state(owner: Borrowed, notices: Notices) -> None:
    def say(stacklevel: int = 3) -> None:  # 3: the user's line calling the function below
        notices.say("rng_state", "singlecard_nb: torch.cuda's random state under `%singlecard "
                    "cpu` is the CPU generator's, which draws the numbers for the tensors meant "
                    "for the GPU (saving and restoring it round-trips).", stacklevel=stacklevel)

    def restore(state: torch.Tensor) -> None:
        if state.numel() != torch.get_rng_state().numel():
            notices.say("rng_state_gpu", "singlecard_nb: torch.cuda.set_rng_state() under "
                        "`%singlecard cpu` got a GPU generator's state (a checkpoint saved on a "
                        "GPU), which cannot seed the CPU generator: the CPU generator is left "
                        "as it was.", stacklevel=4)
            return
        torch.set_rng_state(state)

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        say()
        return torch.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        say()
        restore(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        say()
        return [torch.get_rng_state()]  # one device

    def set_rng_state_all(new_states: Sequence[torch.Tensor]) -> None:
        say()
        if len(new_states):  # saved on several GPUs: the first is this machine's one device
            restore(new_states[0])

    def seed() -> None:
        say()
        torch.default_generator.seed()

    def initial_seed() -> int:
        say()
        return torch.initial_seed()

    for name, fn in (
            ("get_rng_state", get_rng_state), ("set_rng_state", set_rng_state),
            ("get_rng_state_all", get_rng_state_all), ("set_rng_state_all", set_rng_state_all),
            ("seed", seed), ("seed_all", seed), ("initial_seed", initial_seed)):
        patch_cuda(owner, name, lambda original, fn=fn: fn)
