"""The sizing wing: `scn.fit()`, one training step planned without real memory (ledger: the fake
step and its storages; fit: the inputs, the runs at scaled batch sizes; plan: the Plan shown).
Imports nothing from the other wings: the card's free memory is handed in by `session`."""
