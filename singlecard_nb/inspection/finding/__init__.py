"""inspect_all(): models found as they are called (`discovery`, its one hook `finder_hook`,
what it found `found`, its marks and checkpoints), and what a model is (`model_rules`).

The room's face: other rooms and wings import these names from here, never its files.
"""

from .discovery import Discovery, current, inspect_all, inspectors

__all__ = ["Discovery", "current", "inspect_all", "inspectors"]
