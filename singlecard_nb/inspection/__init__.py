"""The inspection wing: `engine` (the Inspector, the facade) with its `options`, `targets` and
`diagnostics`, over rooms of its own: `recording/`, `kernel/`, `memory/`, `views/`, `runs/`, and
`finding/` (inspect_all) above the engine. Imports nothing from the other wings."""
