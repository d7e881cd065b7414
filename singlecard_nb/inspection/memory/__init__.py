"""memory=True: saved-for-backward and output bytes per module call (`ledger`), and the
per-module table `insp.memory()` shows (`table`).

The room's face: other rooms and wings import these names from here, never its files.
"""

from .ledger import MemoryLedger, peak_bytes
from .table import MemoryWatch

__all__ = ["MemoryLedger", "MemoryWatch", "peak_bytes"]
