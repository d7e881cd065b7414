"""GPU-count guards: a script that checks for N devices before training, then exits.

pytorch/examples' FSDP2, tensor-parallel and minGPT scripts start with
`if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2): sys.exit()`.
Single-card mode answers such questions truthfully (the one pinned card; under `cpu`, as
`torch.cuda` does: False / 0), because a count that lied would send every loop over devices
and every world size taken from it to cards that do not exist. So a guard asking for more
stops the script: the script's own choice. In a rank of a job of N ranks on the one device
(`%singlecard cpu --ranks N`, torchrun under single-card mode), the script's own questions are
answered as N devices would answer them (`device_count()` N, `is_available()` True: each rank
has its device, all of them the pinned one), said once by rank 0, so a guard that asks for up
to N passes; torch and the libraries (Lightning, Hugging Face) still get torch's answers, and
take their own paths. What single-card mode adds to a guard that still fails is the reason: when
user code calls `sys.exit()` after it asked how many devices there are (and heard fewer than
two), inside an `if` that reads the answer (the asking function's name, or a device word), a
notice names the line that asked, the guard's line, the exit's, and what to change. Any other
exit is left alone.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..borrow import Borrowed, wrap_like
from ..notices import Notices

# torch.cuda's questions about one device, by its index
_ABOUT_A_DEVICE = ("get_device_name", "get_device_properties", "get_device_capability")
# (module, function) pairs whose answers a guard reads.
_QUESTIONS = (("cuda", "device_count"), ("cuda", "is_available"),
              ("accelerator", "device_count"), ("accelerator", "is_available"))


@dataclass
class _Asked:
    call: str
    answer: Any
    filename: str
    lineno: int
    function: str  # the function that asked (a guard calls it: `if not verify_min_gpu_count():`)

    @property
    def where(self) -> str:  # read only for the notice: asking stays cheap
        return f"{self.filename.rsplit('/', 1)[-1]}:{self.lineno}"

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()


class Guards:
    """Remembers the last device question user code asked; explains an exit that follows."""

    def __init__(self, device: torch.device, notices: Notices, world: int = 1) -> None:
        self.device = device
        self.notices = notices
        self.world = world  # N in a rank of N ranks on this one device
        self.asked: _Asked | None = None

    def install(self, owner: Borrowed) -> None:
        for module_name, name in _QUESTIONS:
            module = getattr(torch, module_name, None)
            original = getattr(module, name, None) if module is not None else None
            if original is not None:
                owner.set_attr(module, name, self._asking(original, f"torch.{module_name}.{name}"),
                               "GPU-count guards")
        owner.set_attr(sys, "exit", self._exit(sys.exit), "sys.exit (GPU-count guards)")
        if self.world > 1 and self.device.type == "cuda":
            for name in _ABOUT_A_DEVICE:  # device k of the N a rank sees is the pinned card
                original = getattr(torch.cuda, name, None)
                if original is not None:
                    owner.set_attr(torch.cuda, name, self._about_the_card(original),
                                   "device questions of N ranks on one card")

    def _about_the_card(self, original: Any) -> Any:
        """`get_device_name(rank)` and the like: device k < N is the pinned card (a loop over
        the N devices `device_count()` answered reads the one card N times)."""
        def about(device: Any = None, *args: Any, **kwargs: Any) -> Any:
            index = getattr(device, "index", device)
            if isinstance(device, str) and device.startswith("cuda:"):
                index = int(device[5:]) if device[5:].isdigit() else None
            if isinstance(index, int) and 0 <= index < self.world:
                device = self.device
            return original(device, *args, **kwargs)

        return wrap_like(original, about)

    def _asking(self, original: Any, call: str) -> Any:
        def question(*args: Any, **kwargs: Any) -> Any:
            answer = original(*args, **kwargs)
            if self.world > 1 and _fewer_than(answer, self.world) \
                    and not _from_torch(frame := sys._getframe(1)):
                said = self._as_the_ranks_devices(call, answer)
                code = frame.f_code  # read should the script still exit: it asked for more
                self.asked = _Asked(call, said, code.co_filename, frame.f_lineno, code.co_name)
                return said
            if _too_few(answer):
                frame = sys._getframe(1)
                if not _from_torch(frame):
                    code = frame.f_code
                    self.asked = _Asked(call, answer, code.co_filename, frame.f_lineno,
                                        code.co_name)
                    if not self.notices.said("gpu-assert"):
                        self._if_asserted(self.asked)
                elif not self.notices.said("gpu-accelerator"):
                    self._if_trainer_asks_for_a_gpu(frame, call, answer)
            return answer

        return wrap_like(original, question)

    def _as_the_ranks_devices(self, call: str, answer: Any) -> Any:
        """What N devices answer (one per rank, all of them the pinned one), said once."""
        said = self.world if type(answer) is int else True
        if os.environ.get("RANK", "0") == "0":  # the N ranks say it once, not N times
            self.notices.say("ranks-devices", lambda: (
                f"singlecard_nb: {call}() answers {said!r} to the script in each of the "
                f"{self.world} ranks (one device per rank, all of them {self.device}), so a "
                f"GPU-count guard asking for up to {self.world} devices passes; torch and the "
                "libraries still get torch's answers. More: docs/ranks.md."), stacklevel=3)
        return said

    def _exit(self, original: Any) -> Any:
        def exit(status: Any = None) -> None:
            frame = sys._getframe(1)
            asked = self.asked
            guard = None
            if asked is not None and not _from_torch(frame):
                self.asked = None
                guard = _guard(frame, asked)
            if asked is not None and guard is not None:
                self.notices.say("guard", lambda: (
                    f"singlecard_nb: sys.exit() at {_where(frame)} after {asked.call}() "
                    f"answered {asked.answer!r} at {asked.where} (`{asked.line}`): the check at "
                    f"{guard[0]} (`{guard[1]}`) asks for more devices than {self._counted()}; "
                    f"{self._what_to_do()}. More: docs/single-card.md, \"GPU-count guards\"."))
            original(status)

        return wrap_like(original, exit)


    def _counted(self) -> str:
        if self.world > 1:
            return f"the {self.world} of this job (one per rank, all of them {self.device})"
        return f"{self.device}, the one counted here"

    def _what_to_do(self) -> str:
        if self.world > 1:  # the ranks ran already: this many were too few
            return "give `--ranks` the number of devices the script needs"
        return ("skip that check to run as a world of one, or run the ranks a script needs "
                "with `%singlecard cpu --ranks N`")

    def _if_asserted(self, asked: _Asked) -> None:
        """`assert torch.cuda.is_available()` (timm's `--device cuda`): said before it fails."""
        line = asked.line
        if line.startswith("assert "):
            self.notices.say("gpu-assert", lambda: (
                f"singlecard_nb: `{line}` at {asked.where} fails: {asked.call}() is "
                f"{asked.answer!r} on {self.device}, this session's device; give the script the "
                "CPU as its device (timm: `--device cpu`). More: docs/single-card.md, "
                "\"GPU-count guards\"."), stacklevel=3)

    def _if_trainer_asks_for_a_gpu(self, frame: Any, call: str, answer: Any) -> None:
        """Lightning's `Trainer(accelerator="gpu")`: said before Lightning refuses it, at the
        user's line that made the Trainer."""
        accelerator, users = _trainer_accelerator(frame)
        if not (isinstance(accelerator, str) and accelerator.lower() in ("gpu", "cuda")):
            return
        self.notices.say("gpu-accelerator", lambda: (
            f"singlecard_nb: Trainer(accelerator={accelerator!r}) at {_where(users)} asks for a "
            f"GPU, and {call}() is {answer!r} on {self.device}, this session's device: pass "
            "accelerator=\"cpu\" (or \"auto\"). More: docs/single-card.md, \"GPU-count "
            "guards\"."), stacklevel=_level(frame, users))


def _trainer_accelerator(frame: Any) -> tuple[Any, Any]:
    """(the `accelerator` a Lightning Trainer being made was given, the first frame outside the
    libraries above it), or (None, None) when no Trainer is being made."""
    accelerator = None
    while frame is not None and _from_torch(frame):
        here = frame.f_locals if frame.f_code.co_name == "__init__" else {}
        if type(here.get("self")).__name__ == "Trainer" and "accelerator" in here:
            accelerator = here["accelerator"]
        frame = frame.f_back
    return (accelerator, frame) if frame is not None else (None, None)


def _level(asking: Any, users: Any) -> int:
    """The stacklevel of `users` for a notice said two calls below `asking`'s call."""
    level, frame = 3, asking
    while frame is not None and frame is not users:
        frame, level = frame.f_back, level + 1
    return level


def _guard(frame: Any, asked: _Asked) -> tuple[str, str] | None:
    """("file:line", source) of the `if` around the exit when it reads the device question (by
    the asking function's name, or a device call of its own); None when there is none."""
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    exit_line = linecache.getline(filename, lineno)
    indent = len(exit_line) - len(exit_line.lstrip())
    for number in range(lineno - 1, max(lineno - 20, 0), -1):
        text = linecache.getline(filename, number)
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(text) - len(text.lstrip()) < indent:
            if stripped.startswith(("if ", "elif ")) and (
                    asked.function in stripped or any(w in stripped for w in _DEVICE_WORDS)):
                return f"{filename.rsplit('/', 1)[-1]}:{number}", stripped
            return None
    return None


_DEVICE_WORDS = ("device_count", "is_available", "gpu", "GPU")


def _fewer_than(answer: Any, world: int) -> bool:
    return answer is False or (type(answer) is int and answer < world)


def _too_few(answer: Any) -> bool:
    return answer is False or (type(answer) is int and answer < 2)


def _from_torch(frame: Any) -> bool:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name.startswith(("torch.", "lightning", "pytorch_lightning", "transformers",
                            "accelerate", "singlecard_nb"))


def _where(frame: Any) -> str:
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
