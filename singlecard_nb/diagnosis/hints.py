"""One plain sentence on why a module's forward failed, from the error, the module and its inputs.

Each rule reads a `Failure` (the exception, the module, the arguments it was called with, the
failing line of code) and returns a sentence or None. `RULES` runs them in order and the first
sentence wins. Rules read torch's own messages and check them against the facts (shapes, dtypes,
devices, the module's settings), so a hint says what was expected, what came instead, and what to
do. A rule that breaks is warned about once and skipped: a hint is never worth hiding the
explanation. The rules live in `rules/`, one module per kind of mistake.
"""

from __future__ import annotations

from ..notices import Notices
from .failure import Failure, Rule
from .rules import code, distributed, layers, loss_inputs, memory, sequences, tensors

# The order is the priority: where two rules recognise one failure, the earlier one speaks.
# - The trap's NaN/Inf first: a NonFiniteError is about values, whatever else the message says.
# - Then what makes every later reading wrong: a device-side assert (the CUDA context is gone),
#   tensors on different devices, a value that is not a tensor at all.
# - Then the layer, the loss and the sequence module that raised, each checked against its own
#   settings (in_features, in_channels, batch_first, ...): the most specific sentences.
# - Then the code of a custom forward (view, reshape, broadcasting), whose messages any module
#   can raise, and a dtype mismatch, whose words ("dtype", "type (") appear in many messages.
# - Last, what nothing above explained under torch.compile's tracing.
RULES: tuple[Rule, ...] = (
    tensors.non_finite,
    tensors.device_side_assert,
    distributed.unused_parameters,  # DDP's own error, whatever module it surfaces in
    distributed.cpu_kernel_not_sharded,  # DTensor's, likewise
    memory.out_of_memory,  # torch.OutOfMemoryError / the CPU's "can't allocate memory"
    tensors.device_mismatch,
    tensors.not_a_tensor,
    layers.linear_features,
    layers.conv_channels,
    layers.conv_dimensions,
    layers.input_too_small,
    layers.batch_norm_channels,
    layers.norm_dimensions,
    layers.batch_of_one,
    layers.group_norm,
    layers.layer_norm,
    layers.embedding_dtype,
    layers.embedding_range,
    loss_inputs.class_target_dtype,
    loss_inputs.class_target_shape,
    loss_inputs.class_target_out_of_bounds,
    loss_inputs.binary_target,
    sequences.rnn_input,
    sequences.attention_inputs,
    sequences.attention_mask_length,
    code.view_non_contiguous,
    code.view_invalid_shape,
    code.cat_sizes,
    code.broadcast_sizes,
    sequences.longer_than_positions,  # after broadcast_sizes, which quotes the user's own line
    tensors.dtype_mismatch,
    code.traced_by_compile,
)
RULE_MODULES = (tensors, layers, loss_inputs, sequences, code, memory, distributed)  # every public function is a rule

_broken_rules = Notices()


def diagnose(failure: Failure) -> str | None:
    """The sentence of the first rule in `RULES` that recognises `failure`, or None."""
    for rule in RULES:
        try:
            text = rule(failure)
        except Exception as e:  # a broken rule costs its hint, never the explanation
            _broken_rules.say(rule.__name__, f"singlecard_nb.explain: the hint rule "
                              f"{rule.__name__} failed ({type(e).__name__}: {e}); explanations "
                              "are shown without it.")
            continue
        if text:
            return text
    return None
