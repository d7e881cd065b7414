"""N ranks of a torch.distributed job on one device, started from the notebook.

`%singlecard cpu --ranks N` makes the next `%run script.py` a job of N processes (`launch`:
torchrun's variables, a free port, each child a `python -m singlecard_nb` rank), whose output
comes back prefixed `[rank k]` (`run`), each rank telling where it stands (`agent`, in the
child), started and stopped by torch elastic's engine (`run`: `start_processes`, what
torchrun runs), and the hang doctor reading that when no rank moves (`doctor`). Plain Python: no
IPython; the notebook layer (notebook/ranks_run.py) only parses and renders.
"""
