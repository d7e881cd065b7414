"""Statistics: the reductions a step's tensors get (`stats`; what can be read, `readable`; RAW
rows to VALUES, `values`), the one-read C kernel (`native`, from `onepass.c`) and its
compilation and cache (`build`). Imports nothing else of inspection."""
