"""The inspection wing: hooks that record shapes and statistics per module (`engine`), the
on-device reductions (`stats`), and views of what was recorded (`plots`, `live`). Imports
nothing from the other wings."""
