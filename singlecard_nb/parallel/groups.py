"""World-of-one process groups, and the gloo listener each one opens.

In single-card mode `torch.distributed.init_process_group` forms a world of one (rank 0) on a
fresh `HashStore` (no TCP store), destroying a previous default group first, so re-running a
cell neither fails nor hangs. gloo still opens one listening TCP socket per group (its transport
device); it closes when the last reference to the group goes. So that `destroy_process_group`,
`%singlecard off` and `%unload_ext` really close it:
- torch modules that capture `group.WORLD` as a default argument when first imported
  (`torch.distributed.nn.functional`, which DDP imports, and two others) are imported before
  our group exists, so they capture None instead of keeping our group alive for ever;
- single-card mode keeps only a weak reference to the group;
- `DistributedDataParallel` wrappers built in single-card mode hold their group (and their
  reducer holds it again): when that group is destroyed they are *released* (their autograd
  hooks removed, reducer and group dropped). A released wrapper keeps `.module` and its
  `state_dict()`; calling it says to rebuild it, as a real DDP over a destroyed group fails.
The sockets a group opened are found in /proc (Linux) by comparing before and after, so status
can say which are still open.

In a rank of `%singlecard cpu --ranks N` (world=N) the group is the real world of N the launcher
set up (its RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): only the backend (gloo where nccl was
asked for: NCCL refuses two ranks on one GPU) and `device_id` (the shared card) change.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..borrow import Borrowed, wrap_like
from ..notices import Notices
from . import world_size as world_size_notice
from .cuda_on_cpu import under_cpu
from .released import is_live_group, release_wrapper
from .sockets import listening_sockets

# Modules whose functions take `group=dist.group.WORLD` as a default, evaluated at import.
_CAPTURE_WORLD_AT_IMPORT = (
    "torch.distributed.nn.functional",
    "torch.distributed.optim.zero_redundancy_optimizer",
    "torch.distributed.fsdp.sharded_grad_scaler",
)


class Groups:
    """The process groups of one single-card session on `device`."""

    def __init__(self, device: torch.device, notices: Notices, world: int = 1):
        self.device = device
        self.notices = notices
        self.world = world  # 1: worlds of one; N: this process is a rank of a real world of N
        self.formed = 0  # default groups formed
        self._group: weakref.ref | None = None  # the default group we formed last
        self._listeners: dict[str, str] = {}  # socket inode -> "host:port", opened by our groups
        self._wrappers: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # DDPs built while on
        self.provided_env: frozenset[str] = frozenset()  # torchrun's variables we set

    # --- patches ------------------------------------------------------------------------------
    def install(self, owner: Borrowed) -> None:
        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d

        init = wrap_like(distributed_c10d.init_process_group, self._init_patch(
            distributed_c10d.init_process_group))
        destroy = wrap_like(distributed_c10d.destroy_process_group, self._destroy_patch(
            distributed_c10d.destroy_process_group))
        for module in (distributed_c10d, dist):
            owner.set_attr(module, "init_process_group", init)
            owner.set_attr(module, "destroy_process_group", destroy)

    def _init_patch(self, original: Callable) -> Callable:
        signature = inspect.signature(original)

        def init_process_group(*args, **kwargs):
            requested = signature.bind(*args, **kwargs).arguments
            if self.world > 1:
                return self._form_real_world(original, requested)
            self._say_if_world_ignored(requested.get("world_size", -1))
            self._say_if_our_rank_chose_the_branch()
            if dist.is_initialized():  # re-running the cell: torch would refuse a second one
                dist.destroy_process_group()
            backend = self._choose_backend(requested.get("backend"))
            # A fresh store every time: re-using one after destroy_process_group() can hang.
            options: dict[str, Any] = {"backend": backend, "store": dist.HashStore(), "rank": 0,
                                       "world_size": 1}
            if requested.get("timeout") is not None:
                options["timeout"] = requested["timeout"]
            if requested.get("pg_options") is not None and backend == requested.get("backend"):
                options["pg_options"] = requested["pg_options"]
            if requested.get("device_id") is not None:
                if not under_cpu(self.device):
                    options["device_id"] = self.device  # any rank's card is the pinned card
                else:
                    self.notices.say("device_id", lambda: (
                        f"singlecard_nb: init_process_group(device_id={requested['device_id']!r}) "
                        "under `%singlecard cpu`: the group is bound to no device."))
            self.form(original, options)

        return init_process_group

    def _form_real_world(self, original: Callable, requested: dict[str, Any]) -> None:
        """A rank of N ranks on one device: torch's own group, gloo for nccl, the shared card."""
        options = dict(requested)
        backend = requested.get("backend")
        # gloo also when nothing was asked for: torch would pick nccl for a card, and fail
        options["backend"] = "gloo"
        if backend is not None and "nccl" in str(backend).lower() \
                and os.environ.get("RANK", "0") == "0":  # the N ranks say it once, not N times
            where = ("the cpu" if self.device.type != "cuda"
                     else "one GPU (NCCL refuses two ranks on one card)")
            self.notices.say("gloo", f"singlecard_nb: init_process_group uses gloo instead of "
                                     f"nccl: the {self.world} ranks share {where}.",
                             stacklevel=3)
        if backend is not None and str(backend).lower() != "gloo":
            options.pop("pg_options", None)  # the options of the backend asked for
        options.pop("device_id", None)  # binds an nccl communicator to a card; gloo has none
        return original(**options)

    def _destroy_patch(self, original: Callable) -> Callable:
        def destroy_process_group(group=None):
            target = dist.group.WORLD if group is None else group
            if target is not None:
                self._release_wrappers_of(target)
            let_finished_works_go()
            try:
                return original(group)
            finally:
                _forget_dtensor_meshes()

        return destroy_process_group

    # --- forming and giving back --------------------------------------------------------------
    def form(self, init: Callable | None = None, options: dict[str, Any] | None = None) -> None:
        """Form the default world of one with `init(**options)` (default: gloo/nccl on device)."""
        from torch.distributed import distributed_c10d

        if init is None:  # a DDP built with no group: what init_process_group() would do
            init = _unpatched(distributed_c10d.init_process_group)
            options = {"backend": self._choose_backend(None), "store": dist.HashStore(),
                       "rank": 0, "world_size": 1}
        _import_modules_that_capture_the_world()
        before = listening_sockets()
        init(**options)
        self._listeners.update((inode, address) for inode, address in listening_sockets().items()
                               if inode not in before)
        self.formed += 1
        self._group = weakref.ref(dist.group.WORLD)

    def release(self, wrapper: nn.Module) -> None:
        """Let `wrapper` (a DDP) go of its group: when the group is destroyed, or at once when
        the wrapper's construction failed."""
        release_wrapper(wrapper)
        self._wrappers.discard(wrapper)

    def track(self, wrapper: nn.Module) -> None:
        """A DDP built in single-card mode: released when its group is destroyed."""
        self._wrappers.add(wrapper)

    def close(self) -> None:
        """Single-card mode ends: release our wrappers and destroy our group if it is current."""
        ref, self._group = self._group, None
        group = ref() if ref is not None else None
        if group is not None and dist.is_available() and dist.is_initialized() \
                and dist.group.WORLD is group:
            self._release_wrappers_of(group)
            # A group on our private store would break the user's next real init_process_group.
            let_finished_works_go()
            _unpatched(dist.destroy_process_group)()
            _forget_dtensor_meshes()
        for wrapper in list(self._wrappers):
            if not is_live_group(getattr(wrapper, "process_group", None)):
                release_wrapper(wrapper)
        del group
        cleared = _clear_finished_frames_holding(ref) if ref is not None else 0
        if cleared:
            self.notices.say("traceback-frames", (
                f"singlecard_nb: a kept traceback (an interrupted DDP construction, IPython's "
                f"last error) held the destroyed process group in {cleared} finished "
                f"frame{'s' if cleared > 1 else ''}; their local variables were "
                "cleared so that its gloo listener closes."))

    def _release_wrappers_of(self, group: Any) -> None:
        for wrapper in list(self._wrappers):
            if getattr(wrapper, "process_group", None) is group:
                self.release(wrapper)

    # --- for status ---------------------------------------------------------------------------
    def open_listeners(self) -> list[str]:
        """"host:port" of the sockets our groups opened that are still listening."""
        if not self._listeners:
            return []
        now = listening_sockets()
        for inode in [inode for inode in self._listeners if inode not in now]:
            del self._listeners[inode]  # closed for good: inodes are not reused while we look
        return sorted(self._listeners.values())

    # --- helpers ------------------------------------------------------------------------------
    def _choose_backend(self, requested: Any) -> Any:
        """gloo on the cpu or where nccl is missing; otherwise what was asked (torch's default
        when nothing was)."""
        on_gpu = not under_cpu(self.device)
        if requested is None:
            return None if on_gpu else "gloo"
        requested = str(requested).lower()
        if "nccl" in requested and not (on_gpu and dist.is_nccl_available()):
            why = ("single-card mode is pinned to the cpu" if not on_gpu
                   else "this torch build has no nccl")
            self.notices.say("gloo", f"singlecard_nb: init_process_group uses gloo instead of "
                                     f"nccl: {why}.", stacklevel=3)
            return "gloo"
        return requested

    def _say_if_our_rank_chose_the_branch(self) -> None:
        # nanoGPT: `ddp = int(os.environ.get('RANK', -1)) != -1`, then its own DDP choices
        # (cuda:LOCAL_RANK, float16 where no bf16) over its --device and --dtype
        if "RANK" in self.provided_env:
            self.notices.say("rank_env", "singlecard_nb: init_process_group forms a world of one: "
                             "RANK=0 and WORLD_SIZE=1 were set by single-card mode, as torchrun "
                             "sets them, so a script that checks RANK runs its distributed "
                             "branch, with that branch's device and dtype choices.",
                             stacklevel=4)

    def _say_if_world_ignored(self, world_size: Any) -> None:
        if world_size not in (-1, 1, None):
            world_size_notice.say(self.notices, world_size,
                                  f"init_process_group(world_size={world_size})", stacklevel=4)
        elif (size := world_size_notice.from_environ(os.environ)) is not None:
            world_size_notice.say(self.notices, size, f"WORLD_SIZE={size} (the environment)",
                                  stacklevel=4)


def let_finished_works_go() -> None:
    """Let the GIL go for 5 ms before a process group is destroyed, so that the backend's
    threads can free the collectives they finished.

    A backend thread frees a collective's work once it completes, and that can take the GIL: a
    tensor Python made keeps its Python object (and torch 2.13's backward leaves a copy of the
    contextvars in each work's thread-local state). The group's destructor joins those threads,
    with the GIL held, wherever its last reference goes: a DDP or FSDP model freed, a script's
    frame cleared just after `destroy_process_group()`. A thread still waiting then for the
    GIL to free a finished work never ends, and the kernel hangs. Seen in this suite: an FSDP1
    script ending with destroy_process_group() under single-card mode, torch 2.6 (gdb:
    ~ProcessGroupGloo joining, a gloo thread in ~AsyncAllgatherWork taking the GIL to free a
    tensor); DDP jobs on torch 2.13 (2 of 3 runs of 200 jobs hung, none with this pause). 5 ms
    is the interpreter's own switch interval: a thread waiting for the GIL takes it at once."""
    time.sleep(0.005)  # without the GIL


def _forget_dtensor_meshes() -> None:
    """A group was destroyed: DTensor's sharding caches let go of its meshes. They keep the
    first mesh they saw for good (a later equal mesh hits the cache), and a mesh holds its
    groups: the first FSDP2 (`fully_shard`) run's gloo listener stayed open to the end."""
    debug = sys.modules.get("torch.distributed.tensor.debug")
    if debug is None and "torch.distributed.tensor" not in sys.modules:
        return  # no DTensor ever made: nothing cached
    if debug is None:
        debug = importlib.import_module("torch.distributed.tensor.debug")
    clear = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear is not None:  # a torch without it (older): nothing to do
        clear()


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _clear_finished_frames_holding(ref: weakref.ref) -> int:
    """Clear the finished frames whose locals still hold the destroyed group `ref` names (or
    hold it in a tuple, list or dict: `*args`, a debugger's `f_locals`); how many were cleared.

    A Ctrl-C inside DDP's construction (`_verify_param_shape_across_processes`,
    `_sync_module_states`) leaves torch's frames in the traceback IPython keeps, each holding
    the group as an argument, and gloo's listener open while they live. Frames still running
    (and suspended generators) are left alone: they let go when they return."""
    import gc
    import types

    group = ref()
    if group is None:
        return 0
    here = sys._getframe()
    frames: dict[int, types.FrameType] = {}
    holders = gc.get_referrers(group)
    for holder in holders + [outer for h in holders if isinstance(h, (tuple, list, dict))
                             for outer in gc.get_referrers(h)]:
        if isinstance(holder, types.FrameType) and holder is not here:
            frames[id(holder)] = holder
    del group, holders
    cleared = 0
    for frame in frames.values():
        if frame.f_code.co_flags & _SUSPENDABLE:
            continue
        try:
            frame.clear()
        except RuntimeError:  # still executing
            continue
        cleared += 1
    return cleared


def _unpatched(function: Callable) -> Callable:
    return getattr(function, "__wrapped__", function)


def _import_modules_that_capture_the_world() -> None:
    for name in _CAPTURE_WORLD_AT_IMPORT:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:  # a torch without it: it cannot capture anything either
                pass


