"""memory=True: saved-for-backward and output bytes per module call (`ledger`), and the per-module
table `insp.memory()` shows (`table`)."""
