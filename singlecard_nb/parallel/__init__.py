"""The parallel wing: single-card mode, where DataParallel, DDP and process groups run on the
one device it is told. Imports nothing from the other wings."""
