"""The notebook layer: the IPython extension, magics, device picker and memory watch. Only
parses, calls `session` and the wings, and renders; nothing below imports it."""
