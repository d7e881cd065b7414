"""The job's world size: one process runs what was written for N, with 1/N of the job's batch.

A script divides its global batch by the world size (nanoGPT's `gradient_accumulation_steps
//= ddp_world_size`, per-rank batch sizes, learning-rate scaling). Run as a world of one, each
step does 1/N of the job's work: the numbers a user compares with the real job's (loss per step,
"tokens per iteration") are not the job's. Said once, with the numbers, wherever single-card
mode sees the N: `WORLD_SIZE` in the environment, `init_process_group(world_size=N)`,
`mp.spawn(nprocs=N)`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from ..job import launched_world_size
from ..notices import Notices


def from_environ(environ: Mapping[str, str]) -> int | None:
    """The WORLD_SIZE a user (or a copied launch command) set, when it is a number above 1."""
    size = launched_world_size(environ)
    return size if size > 1 else None


def say(notices: Notices, size: int, source: str, stacklevel: int = 3) -> None:
    """Say once that `source` (e.g. "WORLD_SIZE=8") asks for `size` ranks, and what that does."""
    if isinstance(size, int) and size < 1:  # no job to be 1/size of: a count of no GPUs
        notices.say("world", lambda: (
            f"singlecard_nb: {source} asks for {size} ranks (torch.cuda.device_count() is 0 "
            "where no GPU is visible, as under `%singlecard cpu`), run here as a world of one: "
            "size the job from dist.get_world_size() or WORLD_SIZE (1 here). More: "
            "docs/single-card.md, \"The job's world size\"."), stacklevel=stacklevel)
        return
    notices.say("world", lambda: (
        f"singlecard_nb: {source} is a job of {size} ranks, run here as a world of one: a script "
        f"that splits its global batch by the world size does 1/{size} of the job's work per "
        f"step (multiply its per-rank batch or accumulation by {size} for the job's). More: "
        "docs/single-card.md, \"The job's world size\"."), stacklevel=stacklevel)


def outside_this_package() -> int:
    """The stacklevel, for `say` called by the caller of this, of the first frame outside
    singlecard_nb (the user's line, or the shell's when a magic turned single-card mode on)."""
    frame, level = sys._getframe(1), 2  # level 2 of `say`: the function that called this
    ours = __package__.split(".")[0]
    while frame is not None and frame.f_globals.get("__name__", "").startswith(ours):
        frame, level = frame.f_back, level + 1
    return level
