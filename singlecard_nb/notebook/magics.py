"""`%singlecard`: pin the kernel to one GPU, show status, list GPUs, and switch the helpers.

Only parses, calls the core (`session`, `devices`) or the notebook views and renders.
Core errors (`ValueError`, e.g. `pinning.TargetError`) become `UsageError`: a red one-line
message naming the bad value and what is accepted, no traceback, nothing changed.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from .. import session
from ..pinning import devices, pinning
from ..pinning import driver as driver_probe
from . import ranks_run
from .magic_lines import parse_line

_SUBCOMMANDS = ("off", "status", "list", "picker", "watch", "single-card", "explain")
_ACCEPTED = ("a TARGET (a GPU index as nvidia-smi numbers them, a GPU or MIG UUID or unique "
             "prefix, 'auto' or 'cpu') or one of: " + ", ".join(_SUBCOMMANDS))


def _on_off(word: str | None, what: str, default: bool | None = None) -> bool:
    if word is None and default is not None:
        return default
    if word is not None and word.lower() in ("on", "off"):
        return word.lower() == "on"
    raise UsageError(f"%singlecard {what}: expected 'on' or 'off', got {word!r}")


@magics_class
class SingleCardMagics(Magics):
    """The `%singlecard` line magic (registered by `%load_ext singlecard_nb`)."""

    # nvidia-smi index -> UUID as the last `%singlecard list` showed them (replaced, never mutated)
    _listed: dict[int, str] = {}

    @magic_arguments()
    @argument(
        "words", nargs="*", metavar="TARGET",
        help="GPU index (nvidia-smi numbering), GPU or MIG UUID or unique prefix, 'auto' (idle "
             "GPU with the most free memory) or 'cpu' (hide all GPUs); or a command: 'off' "
             "(unpin), 'status', 'list' (GPU table), 'picker' (device picker), 'watch [on|off]' "
             "(per-cell memory), 'single-card on|off' (DataParallel/DDP run on the pinned "
             "device), 'explain [on|off]' (explain the last error, or switch the explanation "
             "shown after a cell that fails inside a module). No argument: status.",
    )
    @argument("--default-device", action="store_true",
              help="also make the pinned device torch's default device (restored by 'off')")
    @argument("--no-single-card", action="store_true",
              help="pin without single-card mode (DataParallel/DDP keep their own behaviour)")
    @argument("--force", action="store_true",
              help="pin a GPU outside this kernel's allocation (the CUDA_VISIBLE_DEVICES it "
                   "started with, e.g. set by Slurm), which is otherwise refused")
    @argument("--ranks", type=int, default=None, metavar="N",
              help="the next %%run starts the script as N processes (ranks of a gloo world) on "
                   "the pinned device, with torchrun's variables; 1: a world of one again "
                   "(docs/ranks.md)")
    @argument("--hang-after", type=float, default=None, metavar="SECONDS",
              help="with --ranks N: stop every rank when none made progress for this long and "
                   "say where each one waits (default 60)")
    @line_magic
    def singlecard(self, line: str = "") -> None:
        """Pin this kernel to one GPU (or the CPU) and show what singlecard_nb is doing.

        Pin before any CUDA code runs: then CUDA_VISIBLE_DEVICES hides every other GPU and the
        chosen one is cuda:0 (a hard pin). Once CUDA has started it is too late for that, and
        the pin is soft: the device becomes torch's current device, the others stay visible.

        Examples: %singlecard 1 | %singlecard GPU-2f6d | %singlecard auto --default-device |
        %singlecard cpu --ranks 4 --hang-after 30 | %singlecard status | %singlecard off
        """
        args = parse_line(self.singlecard, "%singlecard", line)
        words = list(args.words)
        options = (args.default_device or args.no_single_card or args.force
                   or args.ranks is not None or args.hang_after is not None)
        _check_ranks(args)
        if not words:
            words = ["status"]
        command = words[0].lower()
        if command in _SUBCOMMANDS and options:
            raise UsageError(f"%singlecard {command}: --default-device, --no-single-card, "
                             "--force, --ranks and --hang-after go with a TARGET only")
        if command in ("off", "status", "list", "picker") and len(words) > 1:
            raise UsageError(f"%singlecard {command} takes no argument, got {' '.join(words[1:])!r}")
        if command == "off":
            self._off()
        elif command == "status":
            display(session.status())
            print(ranks_run.describe(self.shell))
        elif command == "list":
            self._list()
        elif command == "picker":
            from .picker import picker

            try:
                panel = picker()
            except ValueError as e:  # a broken SINGLECARD_NB_MACHINE file
                raise UsageError(f"%singlecard picker: {e}") from None
            display(panel)
        elif command == "watch":
            self._watch(words[1:])
        elif command == "single-card":
            self._single_card(words[1:])
        elif command == "explain":
            self._explain(words[1:])
        else:
            self._pin(words, default_device=args.default_device,
                      single_card=not args.no_single_card, force=args.force)
            said = ranks_run.configure(self.shell, args.ranks or 1, args.hang_after)
            if said:
                print(said)

    # --- commands ---------------------------------------------------------------------------
    def _pin(self, words: list[str], *, default_device: bool, single_card: bool,
             force: bool) -> None:
        if len(words) > 1:
            raise UsageError(f"%singlecard: {' '.join(words)!r} names more than one device; "
                             f"give one TARGET. Accepted: {_ACCEPTED}")
        target = words[0]
        try:
            machine = self._unchanged_since_listing(target)
            state = session.pin(target, set_default=default_device, single_card=single_card,
                                force=force, machine=machine)
        except ValueError as e:
            raise UsageError(f"%singlecard {target}: {e}") from None
        print(state.summary())

    def _list(self) -> None:
        try:
            machine = pinning.machine_view()
        except ValueError as e:  # a broken SINGLECARD_NB_MACHINE file
            raise UsageError(f"%singlecard list: {e}") from None
        # Indices are what people type next; remember which card each one named.
        self._listed = {g.index: g.uuid for g in machine.gpus}
        display(machine)

    def _unchanged_since_listing(self, target: str) -> devices.Machine | None:
        """The machine now, when `target` is an index the last `%singlecard list` showed.

        A GPU can fall off the bus or be reset between the listing and the pin, and the
        nvidia-smi indices shift: `%singlecard 2` must then not pin whatever card is GPU 2 now.
        Raises ValueError when the index names another card than the listing showed.
        """
        if not target.isdigit() or int(target) not in self._listed:
            return None
        index, uuid = int(target), self._listed[int(target)]
        machine = pinning.machine_view()
        now = machine.by_index(index)
        if now is not None and now.uuid == uuid:
            return machine
        moved = next((g for g in machine.gpus if uuid and g.uuid == uuid), None)
        where = (f"that card is now GPU {moved.index}" if moved is not None
                 else "that card is no longer on this machine")
        what = f"there is no GPU {index}" if now is None else f"GPU {index} is now {now.label()}"
        shown = uuid or "a GPU with an unreadable UUID"
        raise ValueError(
            f"the GPUs changed since `%singlecard list` showed GPU {index} as {shown}: {what}, "
            f"and {where} (a GPU fell off the bus, was reset "
            "or the driver renumbered them). Nothing was changed. Run `%singlecard list` again "
            "and pin by UUID, which never moves.")

    def _off(self) -> None:
        ranks_run.forget(self.shell)
        state = session.current()
        session.release()
        if state is None:
            print("Nothing was pinned.")
            return
        message = "Unpinned: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are as they were before."
        if state.mode == "hard" and driver_probe.driver_state().started:
            message += (" CUDA started while pinned, so this process keeps seeing only "
                        f"{state.describe_device()} until the kernel restarts.")
        print(message)

    def _watch(self, rest: list[str]) -> None:
        if len(rest) > 1:
            raise UsageError(f"%singlecard watch: expected 'on' or 'off', got {' '.join(rest)!r}")
        on = _on_off(rest[0] if rest else None, "watch", default=True)
        from . import watch

        if on:
            watch.start(self.shell)
        else:
            watch.stop(self.shell)

    def _single_card(self, rest: list[str]) -> None:
        if len(rest) != 1:
            raise UsageError(f"%singlecard single-card: expected 'on' or 'off', got {' '.join(rest)!r}")
        on = _on_off(rest[0], "single-card")
        try:
            enabled = session.single_card(on)
        except ValueError as e:
            raise UsageError(f"%singlecard single-card {rest[0]}: {e}") from None
        print(f"Single-card mode is {'on' if enabled else 'off'}.")

    def _explain(self, rest: list[str]) -> None:
        from ..diagnosis.explain import explain
        from . import explain_cells

        if not rest:  # like %tb: the last error, explained
            explanation = explain()
            if explanation is not None:
                display(explanation)
            return
        if len(rest) > 1:
            raise UsageError(f"%singlecard explain: expected 'on' or 'off', got {' '.join(rest)!r}")
        if _on_off(rest[0], "explain"):
            explain_cells.start(self.shell)
        else:
            explain_cells.stop(self.shell)
        state = "on" if explain_cells.is_on(self.shell) else "off"
        print(f"Explanations after cells that fail inside a module are {state}.")


def _check_ranks(args: Any) -> None:
    """--ranks and --hang-after, checked before anything changes."""
    if args.ranks is not None and not 1 <= args.ranks <= ranks_run.MAX_RANKS:
        raise UsageError(f"%singlecard --ranks: expected a number of processes from 1 (a world "
                         f"of one) to {ranks_run.MAX_RANKS}, got {args.ranks}")
    if args.hang_after is not None:
        if not args.hang_after > 0:
            raise UsageError(f"%singlecard --hang-after: expected seconds above 0, got "
                             f"{args.hang_after:g}")
        if args.hang_after < ranks_run.MIN_HANG_AFTER:
            raise UsageError(f"%singlecard --hang-after: expected at least "
                             f"{ranks_run.MIN_HANG_AFTER:g} s (each rank says it moved every "
                             f"{ranks_run.MIN_HANG_AFTER / 2:g} s, so a shorter wait stops "
                             f"healthy jobs as hung), got {args.hang_after:g}")
        if args.ranks is None or args.ranks < 2:
            raise UsageError("%singlecard --hang-after goes with --ranks N (N ≥ 2), e.g. "
                             "`%singlecard cpu --ranks 2 --hang-after 30`")


def pin_at_load(shell: Any, target: str) -> None:
    """Pin to SINGLECARD_NB_DEVICE while the extension loads; a bad value is reported, not raised.

    `%load_ext` runs in kernel start-up (profiles, kernel.json), where an exception would leave
    the extension half-loaded and hide the message, so errors are printed and loading goes on.
    """
    try:
        device, options = _env_target(target)
        state = session.pin(device, **options)
    except ValueError as e:  # a bad target, outside the allocation, a broken machine file
        print(f"singlecard_nb: SINGLECARD_NB_DEVICE={target!r} was NOT pinned: {e}. The "
              "extension is loaded; pin with `%singlecard TARGET`.", file=sys.stderr)
        return
    except Exception as e:  # anything else is our bug: show it, but let the kernel start
        print(f"singlecard_nb: SINGLECARD_NB_DEVICE={target!r} was NOT pinned because of an "
              f"internal error ({type(e).__name__}: {e}; traceback below, please report it). "
              "The extension is loaded; pin with `%singlecard TARGET`.", file=sys.stderr)
        traceback.print_exc()
        return
    print(f"singlecard_nb (SINGLECARD_NB_DEVICE={target}): {state.summary()}")


_ENV_OPTIONS = {"--force": "force", "--default-device": "set_default",
                "--no-single-card": "single_card"}


def _env_target(value: str) -> tuple[str, dict[str, bool]]:
    """SINGLECARD_NB_DEVICE as `%singlecard` takes it: one TARGET and its options, e.g.
    '1 --force' for a GPU outside the allocation, 'auto --default-device'."""
    words = value.split()
    flags = [w for w in words if w.startswith("--")]
    targets = [w for w in words if not w.startswith("--")]
    unknown = [f for f in flags if f not in _ENV_OPTIONS]
    if unknown or len(targets) != 1:
        problem = (f"unknown option {unknown[0]!r}" if unknown
                   else "no TARGET" if not targets else f"{len(targets)} targets")
        raise ValueError(f"{problem}; it takes one TARGET (a GPU index as nvidia-smi numbers "
                         "them, a GPU or MIG UUID or unique prefix, 'auto' or 'cpu') and any of "
                         f"the options {', '.join(_ENV_OPTIONS)}, as `%singlecard` does")
    options = {_ENV_OPTIONS[f]: f != "--no-single-card" for f in flags}
    return targets[0], options
