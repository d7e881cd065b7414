"""Statistics: the reductions a step's tensors get (`stats`), the one-read C kernel (`native`, from
`onepass.c`) and its compilation and cache (`build`). Imports nothing else of inspection."""
