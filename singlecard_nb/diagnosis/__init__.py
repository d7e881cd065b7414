"""The diagnosis wing: why a forward failed, read from the exception's traceback after the fact.

`explain` finds the failing module call and describes it; `hints` runs the rules in `rules/`
(in the order of `hints.RULES`) for one plain sentence. No hooks, nothing recorded while the
model runs. Imports nothing from the other wings: `NonFiniteError`, which the inspection wing's
trap raises, comes from the ground floor (`singlecard_nb.errors`).
"""
