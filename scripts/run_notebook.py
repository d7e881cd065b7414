#!/usr/bin/env python
"""Execute a notebook headless with a real kernel and print a short report.

    python scripts/run_notebook.py                      # notebooks/quickstart.ipynb
    python scripts/run_notebook.py NOTEBOOK --machine tests/machines/four_gpus.json --save out.ipynb

The kernel is this interpreter (whatever `python3` kernelspec the user has elsewhere), with this
checkout first on PYTHONPATH. `--machine` describes the GPUs to the kernel
(SINGLECARD_NB_MACHINE), which is how the notebook shows a 4-GPU box on a machine without one.
Exit status 1 when any cell raised, except cells tagged `raises-exception` (as Jupyter and
nbclient read that tag: the error is the point of the cell); such a cell that raises nothing is
an error too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


@dataclass
class Report:
    notebook: str
    cells_run: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # "cell N: Name: message"
    expected_errors: list[str] = field(default_factory=list)  # same, from raises-exception cells
    output_kinds: Counter = field(default_factory=Counter)  # mime type / stream name -> count
    nb: Any = None  # the executed notebook (nbformat node)

    def __str__(self) -> str:
        kinds = ", ".join(f"{kind} ×{n}" for kind, n in sorted(self.output_kinds.items()))
        expected = f" (+{len(self.expected_errors)} expected)" if self.expected_errors else ""
        lines = [f"{self.notebook}: {self.cells_run} code cells run in {self.seconds:.1f} s, "
                 f"{len(self.errors)} error(s){expected}", f"outputs: {kinds or 'none'}"]
        lines += [f"ERROR {e}" for e in self.errors]
        lines += [f"expected error {e}" for e in self.expected_errors]
        return "\n".join(lines)


def kernel_environment(spec_dir: str, machine: str | None = None,
                       base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a kernel (or a Jupyter server) that runs this checkout with this Python.

    machine: path to a described-machine JSON for SINGLECARD_NB_MACHINE (None: leave as is).
    spec_dir: where to write a `python3` kernelspec pointing at this interpreter; it goes first
    on JUPYTER_PATH so a user-level `python3` spec cannot pick another Python.
    """
    env = dict(os.environ if base is None else base)
    kernel = Path(spec_dir) / "kernels" / "python3"
    kernel.mkdir(parents=True, exist_ok=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python",
    }))
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (spec_dir, env.get("JUPYTER_PATH")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if machine is not None:
        env["SINGLECARD_NB_MACHINE"] = str(Path(machine).resolve())
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return env


def _summarise(nb: Any, report: Report) -> None:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.get("execution_count") is None:
            continue
        report.cells_run += 1
        expects_error = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        raised = False
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                report.output_kinds[f"stream:{output.get('name')}"] += 1
            elif kind == "error":
                raised = True
                report.output_kinds["error"] += 1
                error = f"cell {index}: {output.get('ename')}: {output.get('evalue')}"
                (report.expected_errors if expects_error else report.errors).append(error)
            else:
                for mime in output.get("data", {}):
                    report.output_kinds[mime] += 1
        if expects_error and not raised:
            report.errors.append(f"cell {index}: tagged raises-exception but raised nothing")


def execute(path: str | Path, machine: str | None = None, timeout: int = 120,
            save: str | Path | None = None) -> Report:
    """Run every cell of `path` (continuing after errors) in a fresh kernel; return the report."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    report = Report(notebook=path.name, nb=nb)
    saved = dict(os.environ)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="singlecard-kernelspec-") as spec_dir:
        # The kernel inherits this process's environment: set it only while the notebook runs.
        os.environ.clear()
        os.environ.update(kernel_environment(spec_dir, machine, base=saved))
        try:
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                    allow_errors=True,
                                    resources={"metadata": {"path": str(path.parent)}})
            client.execute()
        finally:
            report.seconds = time.perf_counter() - started
            os.environ.clear()
            os.environ.update(saved)
    _summarise(nb, report)
    if save is not None:
        nbformat.write(nb, str(save))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", default=str(DEFAULT_NOTEBOOK))
    parser.add_argument("--machine", help="described-machine JSON given to the kernel "
                                          "(SINGLECARD_NB_MACHINE)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args(argv)
    report = execute(args.notebook, args.machine, args.timeout, args.save)
    print(report)
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
