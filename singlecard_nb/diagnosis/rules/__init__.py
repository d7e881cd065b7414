"""The diagnosis rules, one module per kind of mistake; `hints.RULES` is the order they run in."""
