"""Recording: the hooks and patches on a model (`attach`, with `global_hook`, `optimizer_steps`
and `eagerly`), the open call and step (`calls`), each call's tensors to rows (`recorder`,
`structures`), the steps kept (`store`), and torch.compile of an inspected model
(`compile_watch`)."""
