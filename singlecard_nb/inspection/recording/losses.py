"""Every `loss.backward()` of the process, heard by the inspectors whose model ran the step:
the loss itself, which no module outputs (a criterion called in the loop, `-(y * p.log())`).

One shared patch of `torch.Tensor.backward` (what `loss.backward()`, Lightning, accelerate and
HF Trainer call) comes with the first listener and goes with the last. A backward on a scalar
is offered to each listener; those whose model ran a forward of its current step in this
thread take it, each told how many took it (a GAN's generator loss reaches both models: a loss
two models share says nothing of either alone). What is taken stays on the device (a detached
0-d tensor) and crosses with the step's other extras; the names of its last autograd operations
are read from `grad_fn` (host objects, no device read) on every 16th step, and on every step
with the trap, whose words name them (recorder.DESCRIBED_EVERY).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...borrow import Borrowed, Listeners, wrap_like
from ...errors import TRAP_FRAME, NonFiniteError, without_our_frames
from .eagerly import eager

OPS = 12  # autograd operations named from the loss back: `neg ← sum ← mul ← log`


def last_operations(loss: torch.Tensor, most: int = OPS) -> list[str]:
    """The names of the loss's last autograd operations, nearest first, breadth-first over
    each node's inputs ("NllLoss", "LogSoftmax", "Softmax", "Addmm", ...; a `where` keeps both
    branches; "NllLoss(sum)" for cross_entropy(reduction="sum")), leaves left out: what the
    words about the loss may name."""
    names, queue, seen, held = [], [loss.grad_fn], set(), []
    position = 0
    while position < len(queue) and len(names) < most:
        node = queue[position]
        position += 1
        if node is None or id(node) in seen:
            continue
        held.append(node)  # older torch makes a new wrapper per access: ids must not recur
        seen.add(id(node))
        kind = type(node)
        name = _NAMES.get(kind)
        if name is None:
            name = _NAMES[kind] = kind.__name__.removesuffix("Backward0").removesuffix(
                "Backward1")
        if name == "NllLoss" and getattr(node, "_saved_reduction", 1) == _SUM:
            name = "NllLoss(sum)"  # reduction="sum": the loss of each prediction, added up
        if name != "AccumulateGrad":
            names.append(name)
        for next_node, _ in node.next_functions:
            queue.append(next_node)
    return names


_SUM = 2  # torch's Reduction::Sum, an NllLoss node's _saved_reduction
_NAMES: dict[type, str] = {}  # an autograd node's type -> its name in last_operations (once per type)


class _Backwards(Listeners):
    """Listeners are `(claims, take)`: `claims()` says whether this inspector's model ran the
    current step in this thread; `take(loss, sharers)` records it."""

    name = "inspect: loss.backward()"

    def install(self, owner: Borrowed) -> None:
        original = torch.Tensor.backward

        def backward(self_, *args, **kwargs):
            __tracebackhide__ = TRAP_FRAME  # the trap of a non-finite loss passes through
            try:
                if self.listeners and self_.numel() == 1 and self_.requires_grad:
                    offer(self_)
                return original(self_, *args, **kwargs)
            except NonFiniteError as trapped:  # ours, or a gradient's trap: raised as torch's
                without_our_frames(trapped)
                raise

        def offer(loss: torch.Tensor) -> None:
            __tracebackhide__ = TRAP_FRAME
            listeners = self.listeners  # a tuple: replaced, never changed, while we loop
            takers = [take for claims, take in listeners if claims()]
            for take in takers:
                take(loss, len(takers))

        owner.set_attr(torch.Tensor, "backward", eager(wrap_like(original, backward)),
                       "torch.Tensor.backward (the loss of each step)")


backwards = _Backwards()  # the process's one


def listen(owner: Borrowed, claims: Callable[[], bool],
           take: Callable[[torch.Tensor, int], None]) -> None:
    """`take(loss, sharers)` for each backward of a scalar while `owner` holds its changes."""
    listener = (claims, take)
    backwards.add(listener)
    owner.on_restore(lambda: backwards.discard(listener), "loss.backward() listener")
