"""The sizing wing: `scn.fit()`, one training step planned without real memory (fakes: the model
and optimizer copied as fake tensors; ledger: the storages a step holds; step: the fake step
measured; fit: the inputs, the runs at scaled batch sizes; plan: the Plan shown).
Imports nothing from the other wings: the card's free memory is handed in by `session`."""
